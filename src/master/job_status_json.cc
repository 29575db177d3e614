#include "master/job_status_json.h"

#include <map>

#include "absl/strings/ascii.h"
#include "shoal/v1/shoal.pb.h"

namespace shoal::master {
namespace {

std::string EnumSuffix(const std::string& full, const std::string& prefix) {
  return absl::AsciiStrToLower(full.substr(prefix.size()));
}

}  // namespace

nlohmann::json JobStatusToJson(const v1::JobStatus& status) {
  nlohmann::json tasks = nlohmann::json::array();
  for (const auto& t : status.tasks()) {
    tasks.push_back({
        {"task", t.task().role() + ":" + std::to_string(t.task().index())},
        {"role", t.task().role()},
        {"index", t.task().index()},
        {"rank", t.global_rank()},
        {"state", EnumSuffix(v1::TaskState_Name(t.state()), "TASK_STATE_")},
        {"node", t.node()},
        {"pid", t.pid()},
        {"exit_code", t.exit_code()},
        {"signal", t.signal()},
        {"reason", t.reason()},
        {"restarts", t.attempt()},
        {"in_world", t.in_world()},
        {"step", t.step()},
    });
  }
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : status.failures()) {
    failures.push_back({{"task", f.task().role() + ":" + std::to_string(f.task().index())},
                        {"attempt", f.task().attempt()},
                        {"cause", f.cause()},
                        {"action", f.action()},
                        {"restart", f.restart()},
                        {"unix_ms", f.unix_ms()}});
  }
  nlohmann::json shards = nullptr;
  if (!status.shards_json().empty()) {
    shards = nlohmann::json::parse(status.shards_json(), nullptr, false);
  }
  nlohmann::json last_publication = nullptr;
  if (status.has_last_publication()) {
    const v1::Publication& p = status.last_publication();
    // Sorted by name, so the file and `shoal status --json` list them the same way every time.
    std::map<std::string, double> metrics(p.metrics().begin(), p.metrics().end());
    last_publication = {{"task", p.task()},
                        {"model", p.model()},
                        {"version", p.version()},
                        {"repository", p.repository()},
                        {"step", p.has_step() ? nlohmann::json(p.step()) : nlohmann::json()},
                        {"metrics", metrics},
                        {"unix_ms", p.unix_ms()}};
  }
  return {
      {"job_id", status.job_id()},
      {"name", status.name()},
      {"state", EnumSuffix(v1::JobState_Name(status.state()), "JOB_STATE_")},
      {"reason", status.reason()},
      {"created_unix_ms", status.created_unix_ms()},
      {"finished_unix_ms", status.finished_unix_ms()},
      {"generation", status.generation()},
      {"group_restarts", status.group_restarts()},
      {"world_size", status.world_size()},
      {"shards", shards},
      {"failures", failures},
      {"failures_total", status.failures_total()},
      {"tasks", tasks},
      {"last_publication", last_publication},
  };
}

}  // namespace shoal::master
