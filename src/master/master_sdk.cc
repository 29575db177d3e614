// The master's side of the training SDK: requests relayed by agents (checkpoint reports,
// resumption, data-shard leases) and the shard lease timer. Part of class Master (master.h);
// apart from master.cc only to keep each file about one thing. docs/sdk-protocol.md.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "master/master.h"
#include "master/shard_table.h"
#include "shoal/v1/shoal.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

void Master::OnSdkRequest(AgentSession& session, const v1::AgentMessage& message) {
  const auto& m = message.sdk();
  auto fail = [&](const std::string& why) {
    ReplySdk(session, m.request_id(), {{"ok", false}, {"error", why}});
  };
  TaskRecord* rec = state_.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt() || IsTerminal(rec->state)) {
    return fail(absl::StrCat("task ", m.task().role(), ":", m.task().index(), " attempt ",
                             m.task().attempt(), " is not current"));
  }
  nlohmann::json req = nlohmann::json::parse(m.json(), nullptr, false);
  if (!req.is_object()) return fail("the request is not a JSON object");
  std::string op = req.value("op", "");
  auto now = options_.clock->Now();
  std::vector<nlohmann::json> records;
  auto journal_records = [&] {
    for (auto& r : records) Journal(std::move(r));
    records.clear();
  };
  auto step_of = [&](const char* key) -> std::optional<int64_t> {
    if (!req.contains(key) || !req[key].is_number_integer()) return std::nullopt;
    return req[key].get<int64_t>();
  };
  if (op == "checkpointed") {
    Journal({{"type", "checkpoint"}, {"task", rec->Key()}, {"step", step_of("step").value_or(0)}});
    if (grow_pending_) BeginGrowth();
    return;
  }
  if (op == "resumed") {
    int64_t step = step_of("step").value_or(0);
    Journal({{"type", "resumed"}, {"task", rec->Key()}, {"attempt", rec->attempt}, {"step", step}});
    if (shards_ && shards_->frozen()) {
      auto reopened = shards_->Resumed(step, &records);
      journal_records();
      if (!reopened.ok()) return fail(std::string(reopened.status().message()));
    }
    return ReplySdk(session, m.request_id(), {{"ok", true}});
  }
  if (!shards_) return fail("the job file has no dataset section, so there are no shards to lease");
  if (op == "lease") {
    if (!req.contains("epoch") || !req["epoch"].is_number_unsigned()) {
      return fail("lease needs an epoch (an integer >= 0)");
    }
    // Checked before value(), which throws on a mistyped "wait": the exception would end the
    // master (the agent relays any JSON object; found writing fuzz/fuzz_sdk_protocol).
    if (req.contains("wait") && !req["wait"].is_boolean()) {
      return fail(absl::StrCat("lease's wait must be true or false, got ", req["wait"].dump()));
    }
    bool wait = req.value("wait", true);
    auto result = shards_->Lease(rec->Key(), rec->attempt, req["epoch"].get<uint32_t>(), wait,
                                 now, &records);
    journal_records();
    if (!result.ok()) return fail(std::string(result.status().message()));
    ReplySdk(session, m.request_id(), result->ToReply());
    ArmLeaseTimer();
    return;
  }
  if (op == "done") {
    auto step = step_of("step");
    if (!req.contains("epoch") || !req["epoch"].is_number_unsigned() || !req.contains("shard") ||
        !req["shard"].is_number_unsigned() || !step) {
      return fail("done needs epoch, shard and step (integers >= 0)");
    }
    auto st = shards_->Done(rec->Key(), rec->attempt, req["epoch"].get<uint32_t>(),
                            req["shard"].get<uint64_t>(), *step, now, &records);
    journal_records();
    if (!st.ok()) return fail(std::string(st.message()));
    return ReplySdk(session, m.request_id(), {{"ok", true}});
  }
  fail(absl::StrCat("unknown op '", op, "'"));
}

void Master::ArmLeaseTimer() {
  if (!shards_ || lease_timer_armed_) return;
  auto next = shards_->NextDeadline();
  if (!next) return;
  lease_timer_armed_ = true;
  auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(*next - options_.clock->Now());
  loop_.PostAfter(std::max(delay, std::chrono::milliseconds(0)) + std::chrono::milliseconds(1),
                  [this] {
                    lease_timer_armed_ = false;
                    std::vector<nlohmann::json> records;
                    shards_->ExpireLeases(options_.clock->Now(), &records);
                    for (auto& r : records) Journal(std::move(r));
                    ArmLeaseTimer();
                  });
}

void Master::ReleaseShards(const TaskRecord& task, const std::string& why) {
  if (!shards_) return;
  std::vector<nlohmann::json> records;
  shards_->ReleaseTask(task.Key(), why, &records);
  for (auto& r : records) Journal(std::move(r));
}

void Master::ReplySdk(AgentSession& session, uint64_t request_id, const nlohmann::json& reply) {
  if (request_id == 0) return;
  v1::MasterMessage msg;
  msg.mutable_sdk_reply()->set_request_id(request_id);
  msg.mutable_sdk_reply()->set_json(reply.dump());
  SendToAgent(session, msg);
}

}  // namespace shoal::master
