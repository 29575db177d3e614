#include "master/sdk_relay.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/model_publication.h"
#include "shoal/v1/shoal.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

void SdkRelay::JournalShardRecords(std::vector<nlohmann::json>& records) {
  for (auto& r : records) host_->Record(ShardRecord{std::move(r)});
  records.clear();
}

void SdkRelay::OnRequest(uint64_t session, const v1::AgentMessage& message) {
  const auto& m = message.sdk();
  auto reply = [&](const nlohmann::json& answer) { host_->Reply(session, m.request_id(), answer); };
  auto fail = [&](const std::string& why) { reply({{"ok", false}, {"error", why}}); };
  TaskRecord* rec = job_->tasks.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt() || IsTerminal(rec->state)) {
    return fail(absl::StrCat("task ", m.task().role(), ":", m.task().index(), " attempt ",
                             m.task().attempt(), " is not current"));
  }
  nlohmann::json req = nlohmann::json::parse(m.json(), nullptr, false);
  if (!req.is_object()) return fail("the request is not a JSON object");
  std::string op = req.value("op", "");
  auto now = clock_->Now();
  std::vector<nlohmann::json> records;
  auto step_of = [&](const char* key) -> std::optional<int64_t> {
    if (!req.contains(key) || !req[key].is_number_integer()) return std::nullopt;
    return req[key].get<int64_t>();
  };
  ShardTable* shards = job_->shards.get();
  // Reports want no reply, but one with a request id is acknowledged: until then its agent
  // keeps it, to send again to the master that replaces this one should it die first.
  if (op == "checkpointed") {
    host_->Record(CheckpointReported{rec->Key(), step_of("step").value_or(0)});
    host_->Checkpointed();
    return reply({{"ok", true}});
  }
  if (op == "published") {
    // Checked again here: the master trusts no agent's JSON (an agent of another version, or
    // a fuzzer, relays what it likes). No task reads the reply, so a refusal is the master's
    // log; the reply only acknowledges the report.
    auto publication = ParseModelPublication(req);
    if (!publication.ok()) {
      spdlog::warn("task {} attempt {}: refused a 'published' report: {}", rec->Key(),
                   rec->attempt, std::string(publication.status().message()));
      return fail(std::string(publication.status().message()));
    }
    host_->Record(ModelPublished{rec->Key(), publication->model, publication->version,
                                 publication->repository, publication->step,
                                 std::move(publication->metrics)});
    return reply({{"ok", true}});
  }
  if (op == "resumed") {
    int64_t step = step_of("step").value_or(0);
    host_->Record(ResumedReported{rec->Key(), rec->attempt, step});
    if (shards && shards->frozen()) {
      auto reopened = shards->Resumed(step, &records);
      JournalShardRecords(records);
      if (!reopened.ok()) return fail(std::string(reopened.status().message()));
    }
    return reply({{"ok", true}});
  }
  if (!shards) return fail("the job file has no dataset section, so there are no shards to lease");
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
    // The request id makes the call asked again (to a master that replaced a dead one) get the
    // shard its first asking may have leased.
    auto result = shards->Lease(rec->Key(), rec->attempt, req["epoch"].get<uint32_t>(), wait,
                                now, &records, m.request_id());
    JournalShardRecords(records);
    if (!result.ok()) return fail(std::string(result.status().message()));
    reply(result->ToReply());
    ArmLeaseTimer();
    return;
  }
  if (op == "done") {
    auto step = step_of("step");
    if (!req.contains("epoch") || !req["epoch"].is_number_unsigned() || !req.contains("shard") ||
        !req["shard"].is_number_unsigned() || !step) {
      return fail("done needs epoch, shard and step (integers >= 0)");
    }
    auto st = shards->Done(rec->Key(), rec->attempt, req["epoch"].get<uint32_t>(),
                           req["shard"].get<uint64_t>(), *step, now, &records);
    JournalShardRecords(records);
    if (!st.ok()) return fail(std::string(st.message()));
    return reply({{"ok", true}});
  }
  fail(absl::StrCat("unknown op '", op, "'"));
}

void SdkRelay::ArmLeaseTimer() {
  if (!job_->shards || lease_timer_armed_) return;
  auto next = job_->shards->NextDeadline();
  if (!next) return;
  lease_timer_armed_ = true;
  auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(*next - clock_->Now());
  host_->PostAfter(std::max(delay, std::chrono::milliseconds(0)) + std::chrono::milliseconds(1),
                   [this] {
                     lease_timer_armed_ = false;
                     std::vector<nlohmann::json> records;
                     job_->shards->ExpireLeases(clock_->Now(), &records);
                     JournalShardRecords(records);
                     ArmLeaseTimer();
                   });
}

}  // namespace shoal::master
