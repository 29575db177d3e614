#include "client/status_render.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::client {

std::string StatusLine(const nlohmann::json& status, double elapsed_seconds) {
  std::map<std::string, int> counts;
  int total = 0;
  for (const auto& t : status.value("tasks", nlohmann::json::array())) {
    counts[t.value("state", "")]++;
    ++total;
  }
  std::string state = status.value("state", "");
  std::string line = absl::StrFormat("%s %s · %d/%d running", status.value("job_id", ""), state,
                                     counts["running"], total);
  for (const char* s : {"succeeded", "failed", "killed"}) {
    if (counts[s] > 0) absl::StrAppend(&line, absl::StrFormat(", %d %s", counts[s], s));
  }
  absl::StrAppend(&line, absl::StrFormat(" · %.0fs", elapsed_seconds));
  std::string reason = status.value("reason", "");
  if (!reason.empty() && (state == "queued" || state == "stopping")) {
    absl::StrAppend(&line, " · ", reason);
  }
  return line;
}

std::string OutcomeLine(const nlohmann::json& status, double elapsed_seconds) {
  std::string state = status.value("state", "");
  std::string id = status.value("job_id", "");
  if (state == "succeeded") return absl::StrFormat("job %s succeeded in %.1fs", id, elapsed_seconds);
  return absl::StrFormat("job %s %s: %s", id, state, status.value("reason", ""));
}

std::string StatusTable(const nlohmann::json& status) {
  std::string out = absl::StrFormat("job     %s\nname    %s\nstate   %s\n", status.value("job_id", ""),
                                    status.value("name", ""), status.value("state", ""));
  std::string reason = status.value("reason", "");
  if (!reason.empty()) absl::StrAppend(&out, "reason  ", reason, "\n");
  int generation = status.value("generation", 0);
  int group_restarts = status.value("group_restarts", 0);
  if (generation > 0 || group_restarts > 0) {
    absl::StrAppend(&out, absl::StrFormat("world   %d tasks, generation %d, %d group restarts\n",
                                          status.value("world_size", 0), generation,
                                          group_restarts));
  }
  absl::StrAppend(&out, absl::StrFormat("\n%-16s %-10s %-5s %-8s %-8s %-6s %-8s %s\n", "TASK",
                                        "STATE", "RANK", "NODE", "PID", "EXIT", "RESTARTS",
                                        "REASON"));
  for (const auto& t : status.value("tasks", nlohmann::json::array())) {
    std::string exit;
    std::string st = t.value("state", "");
    if (st == "succeeded" || st == "failed" || st == "killed") {
      int sig = t.value("signal", 0);
      exit = sig ? absl::StrCat("sig", sig) : absl::StrCat(t.value("exit_code", 0));
    }
    int pid = t.value("pid", 0);
    std::string rank = t.value("in_world", true) ? std::to_string(t.value("rank", 0)) : "-";
    absl::StrAppend(&out, absl::StrFormat("%-16s %-10s %-5s %-8s %-8s %-6s %-8d %s\n",
                                          t.value("task", ""), st, rank, t.value("node", ""),
                                          pid ? std::to_string(pid) : "", exit,
                                          t.value("restarts", 0), t.value("reason", "")));
  }
  const auto& failures = status.value("failures", nlohmann::json::array());
  if (!failures.empty()) {
    int total = status.value("failures_total", static_cast<int>(failures.size()));
    absl::StrAppend(&out, "\nfailures (", total, total > static_cast<int>(failures.size())
                                                     ? absl::StrCat(", the last ", failures.size(), " shown")
                                                     : "",
                    "):\n");
    for (const auto& f : failures) {
      absl::StrAppend(&out, absl::StrFormat("  %-16s attempt %-3d %-20s %s\n", f.value("task", ""),
                                            f.value("attempt", 0), f.value("action", ""),
                                            f.value("cause", "")));
    }
  }
  return out;
}

}  // namespace shoal::client
