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
  absl::StrAppend(&out, absl::StrFormat("\n%-16s %-10s %-5s %-8s %-8s %-6s %s\n", "TASK", "STATE",
                                        "RANK", "NODE", "PID", "EXIT", "REASON"));
  for (const auto& t : status.value("tasks", nlohmann::json::array())) {
    std::string exit;
    std::string st = t.value("state", "");
    if (st == "succeeded" || st == "failed" || st == "killed") {
      int sig = t.value("signal", 0);
      exit = sig ? absl::StrCat("sig", sig) : absl::StrCat(t.value("exit_code", 0));
    }
    int pid = t.value("pid", 0);
    absl::StrAppend(&out, absl::StrFormat("%-16s %-10s %-5d %-8s %-8s %-6s %s\n", t.value("task", ""),
                                          st, t.value("rank", 0), t.value("node", ""),
                                          pid ? std::to_string(pid) : "", exit,
                                          t.value("reason", "")));
  }
  return out;
}

}  // namespace shoal::client
