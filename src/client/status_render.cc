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

namespace {

std::string Age(int64_t ms) {
  if (ms < 0) ms = 0;  // the master's clock a little ahead of ours
  int64_t seconds = ms / 1000;
  if (seconds < 120) return absl::StrCat(seconds, "s ago");
  if (seconds < 2 * 3600) return absl::StrCat(seconds / 60, "m ago");
  if (seconds < 2 * 86400) return absl::StrCat(seconds / 3600, "h ago");
  return absl::StrCat(seconds / 86400, "d ago");
}

}  // namespace

std::string PublicationLine(const nlohmann::json& publication, int64_t now_unix_ms) {
  std::string line = absl::StrCat(publication.value("model", ""), " version ",
                                  publication.value("version", uint64_t{0}));
  if (publication.contains("step") && publication["step"].is_number_integer()) {
    absl::StrAppend(&line, " at step ", publication["step"].get<int64_t>());
  }
  const auto& metrics = publication.value("metrics", nlohmann::json::object());
  if (metrics.is_object() && !metrics.empty()) {
    std::string shown;
    for (auto it = metrics.begin(); it != metrics.end(); ++it) {
      if (!it.value().is_number()) continue;
      absl::StrAppend(&shown, shown.empty() ? "" : ", ", it.key(), " ",
                      absl::StrFormat("%g", it.value().get<double>()));
    }
    if (!shown.empty()) absl::StrAppend(&line, " (", shown, ")");
  }
  absl::StrAppend(&line, ", published by ", publication.value("task", ""), " ",
                  Age(now_unix_ms - publication.value("unix_ms", int64_t{0})));
  return line;
}

std::string StatusTable(const nlohmann::json& status, int64_t now_unix_ms) {
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
  if (const auto& p = status.value("last_publication", nlohmann::json()); p.is_object()) {
    absl::StrAppend(&out, "model   ", PublicationLine(p, now_unix_ms), "\n");
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
