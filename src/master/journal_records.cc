#include "master/journal_records.h"

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "master/shard_table.h"

namespace shoal::backends {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(NodeGrant, name, address, cpus, memory_bytes,
                                                cores, gpus, for_task, gpus_from_agent, gpu_count)

}  // namespace shoal::backends

namespace shoal::master {

// Lenient on read: a missing field keeps the default of the struct (journal_records.h).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(JobSubmitted, job_id, name, tasks, master)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(JobStateChanged, to, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OutcomeDecided, outcome, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(JobFinished, outcome, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(KillRequested, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(MasterRecovered, master, pid, generation, phase)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DatasetListed, location, files)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SidecarStarted, name, url)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SidecarFailed, name, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Queued, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AdmissionRefused, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Admitted, backend, nodes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Allocated, backend, deferred)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CancelledOutside, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentRegistered, node, hostname, address, gpus,
                                                ports)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentRefused, node, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentReattached, node, running)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ReattachFailed, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentLeaving, node, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentDisconnected, node)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentSilent, node, seconds)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentNotice, node, message)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PlaceLost, node, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PlaceReplacing, node, ok, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankAssignment, task, rank, node, address, port)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Rendezvous, generation, world_size, ranks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TaskHung, task, attempt, last_step, silent_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FailureHandled, task, attempt, action, cause,
                                                restart, delay_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SlotLeft, task)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SlotRejoined, task)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SlotDeferred, task, node)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GroupRestartBegun, generation, reason, restarts,
                                                delay_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GroupRestarted, generation, world_size)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CheckpointReported, task, step)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ResumedReported, task, attempt, step)

// task_state's fields are present or absent by the kind of move, so they are written by hand.
void to_json(nlohmann::json& j, const TaskStateChanged& r) {
  j = nlohmann::json::object();
  j["task"] = r.task;
  if (r.from) j["from"] = *r.from;
  j["to"] = r.to;
  if (r.reason) j["reason"] = *r.reason;
  if (r.attempt) j["attempt"] = *r.attempt;
  if (r.pid) j["pid"] = *r.pid;
  if (r.exit_code) j["exit_code"] = *r.exit_code;
  if (r.signal) j["signal"] = *r.signal;
  if (r.rank) j["rank"] = *r.rank;
}

void from_json(const nlohmann::json& j, TaskStateChanged& r) {
  auto optional = [&](const char* key, auto& field) {
    if (j.contains(key)) field = j.at(key).get<typename std::decay_t<decltype(field)>::value_type>();
  };
  r.task = j.value("task", "");
  r.to = j.value("to", "");
  optional("from", r.from);
  optional("reason", r.reason);
  optional("attempt", r.attempt);
  optional("pid", r.pid);
  optional("exit_code", r.exit_code);
  optional("signal", r.signal);
  optional("rank", r.rank);
}

// step is absent when the task gave none.
void to_json(nlohmann::json& j, const ModelPublished& r) {
  j = {{"task", r.task}, {"model", r.model}, {"version", r.version},
       {"repository", r.repository}, {"metrics", r.metrics}};
  if (r.step) j["step"] = *r.step;
}

void from_json(const nlohmann::json& j, ModelPublished& r) {
  r.task = j.value("task", "");
  r.model = j.value("model", "");
  r.version = j.value("version", uint64_t{0});
  r.repository = j.value("repository", "");
  if (j.contains("step") && !j["step"].is_null()) r.step = j["step"].get<int64_t>();
  if (j.contains("metrics")) r.metrics = j["metrics"].get<std::map<std::string, double>>();
}

namespace {

template <typename T>
constexpr bool kHasType = requires { T::kType; };

// Parses `line` as the alternative of JournalRecord whose kType is `type`, trying the
// alternatives from index I on.
template <size_t I = 0>
bool ParseKnown(const std::string& type, const nlohmann::json& line, JournalRecord* out) {
  if constexpr (I == std::variant_size_v<JournalRecord>) {
    return false;
  } else {
    using T = std::variant_alternative_t<I, JournalRecord>;
    if constexpr (kHasType<T>) {
      if (type == T::kType) {
        *out = line.get<T>();
        return true;
      }
    }
    return ParseKnown<I + 1>(type, line, out);
  }
}

}  // namespace

std::string TypeOf(const JournalRecord& record) {
  return std::visit(
      [](const auto& r) -> std::string {
        using T = std::decay_t<decltype(r)>;
        if constexpr (kHasType<T>) {
          return T::kType;
        } else {
          return r.body.value("type", "");
        }
      },
      record);
}

nlohmann::json ToJson(const JournalRecord& record) {
  return std::visit(
      [](const auto& r) -> nlohmann::json {
        using T = std::decay_t<decltype(r)>;
        if constexpr (kHasType<T>) {
          nlohmann::json j = r;
          j["type"] = T::kType;
          return j;
        } else {
          return r.body;
        }
      },
      record);
}

nlohmann::json ToJson(const JournalEntry& entry) {
  nlohmann::json j = ToJson(entry.record);
  j["ts"] = entry.unix_ms();
  j["ts_us"] = entry.ts_us;
  return j;
}

absl::StatusOr<JournalEntry> FromJson(const nlohmann::json& line) {
  if (!line.is_object()) {
    return absl::DataLossError(absl::StrCat("events.jsonl: a record is not an object: ",
                                            line.dump()));
  }
  JournalEntry entry;
  if (!line.contains("type") || !line["type"].is_string()) {
    entry.record = OtherRecord{line};
    return entry;
  }
  try {
    if (line.contains("ts_us")) {
      entry.ts_us = line["ts_us"].get<int64_t>();
    } else if (line.contains("ts")) {
      entry.ts_us = line["ts"].get<int64_t>() * 1000;
    }
    const std::string type = line["type"].get<std::string>();
    if (ShardTable::IsShardRecord(line)) {
      nlohmann::json body = line;
      body.erase("ts");
      body.erase("ts_us");
      entry.record = ShardRecord{std::move(body)};
    } else if (!ParseKnown(type, line, &entry.record)) {
      entry.record = OtherRecord{line};
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("events.jsonl: a field has the wrong type (", e.what(), ") in ", line.dump()));
  }
  return entry;
}

}  // namespace shoal::master
