#include "ui/journal_timeline.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "ui/json_fields.h"

namespace shoal::ui {
namespace {

using nlohmann::json;

bool IsTaskEnd(const std::string& state) {
  return state == "succeeded" || state == "failed" || state == "killed" || state == "lost";
}

struct Generation {
  uint32_t attempt = 0;
  int64_t from_ms = 0;
  int64_t to_ms = 0;
  std::string state;
  int exit_code = 0;
  int signal = 0;
  std::string reason;
  std::string node;
};

}  // namespace

json TimelineFromJournal(std::string_view journal, int64_t now_unix_ms) {
  json events = json::array();
  json world = json::array();
  json phases = json::array();
  std::map<std::string, std::vector<Generation>> tasks;  // by "role:index"
  std::vector<std::string> task_order;
  std::map<std::string, std::string> node_of_task;  // from the last rendezvous
  int64_t start_ms = 0, end_ms = 0;
  std::string phase;
  int64_t phase_from = 0;
  bool truncated = false;

  auto enter_phase = [&](const std::string& name, int64_t ts) {
    if (name == phase) return;
    if (!phase.empty()) phases.push_back({{"name", phase}, {"from_ms", phase_from}, {"to_ms", ts}});
    phase = name;
    phase_from = ts;
  };
  auto event = [&](int64_t ts, const std::string& kind, const std::string& task,
                   const std::string& text) {
    json e = {{"ts_ms", ts}, {"kind", kind}, {"text", text}};
    if (!task.empty()) e["task"] = task;
    events.push_back(std::move(e));
  };

  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(journal.data(), journal.size()), '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    if (line.empty()) continue;
    json r = json::parse(line.begin(), line.end(), nullptr, false);
    if (!r.is_object()) {
      // Only the last line can be partly written (appends); anything else is damage, and the
      // rest is still worth showing.
      truncated = true;
      continue;
    }
    const std::string type = StrField(r, "type");
    const int64_t ts = IntField(r, "ts");
    if (start_ms == 0) start_ms = ts;
    if (type == "job_submitted") {
      start_ms = ts;
      enter_phase("submitted", ts);
    } else if (type == "queued") {
      enter_phase("queued", ts);
    } else if (type == "admitted") {
      enter_phase("admission", ts);
    } else if (type == "job_state") {
      std::string to = StrField(r, "to");
      if (to == "queued" || to == "starting" || to == "running" || to == "stopping") {
        enter_phase(to, ts);
      } else if (IsTaskEnd(to)) {
        end_ms = ts;
      }
    } else if (type == "job_finished") {
      end_ms = ts;
    } else if (type == "kill_requested") {
      event(ts, "kill", "", absl::StrCat("kill requested: ", StrField(r, "reason")));
    } else if (type == "master_recovered") {
      event(ts, "master_recovered", "", "a new master took the job over");
    } else if (type == "rendezvous") {
      uint64_t size = IntField(r, "world_size");
      world.push_back({ts, size});
      if (auto ranks = r.find("ranks"); ranks != r.end() && ranks->is_array()) {
        for (const auto& rank : *ranks) {
          node_of_task[StrField(rank, "task")] = StrField(rank, "node");
        }
      }
      event(ts, "world", "", absl::StrCat("world of ", size, " formed (generation ",
                                          IntField(r, "generation"), ")"));
    } else if (type == "group_restarted") {
      world.push_back({ts, IntField(r, "world_size")});
    } else if (type == "task_state") {
      std::string task = StrField(r, "task");
      std::string to = StrField(r, "to");
      if (!tasks.count(task)) task_order.push_back(task);
      auto& gens = tasks[task];
      uint32_t attempt = IntField(r, "attempt");
      if (to == "starting" || to == "running") {
        if (gens.empty() || gens.back().attempt != attempt || !gens.back().state.empty() &&
                                                                  IsTaskEnd(gens.back().state)) {
          Generation g;
          g.attempt = attempt;
          g.from_ms = ts;
          g.state = to;
          g.node = node_of_task.count(task) ? node_of_task[task] : "";
          gens.push_back(g);
        } else {
          gens.back().state = to;
        }
      } else if (IsTaskEnd(to) && !gens.empty() && gens.back().to_ms == 0 &&
                 gens.back().attempt == attempt) {
        Generation& g = gens.back();
        g.to_ms = ts;
        g.state = to;
        g.exit_code = IntField(r, "exit_code");
        g.signal = IntField(r, "signal");
        g.reason = StrField(r, "reason");
      }
    } else if (type == "failure_handled") {
      std::string cause = StrField(r, "cause");
      std::string action = StrField(r, "action");
      event(ts, "failure", StrField(r, "task"),
            absl::StrCat(StrField(r, "task"), " ", cause, " -> ", action));
      if (action == "restart-task" || action == "restart-group" || action == "shrink-group") {
        event(ts, "restart", StrField(r, "task"),
              absl::StrCat(action, " (restart ", IntField(r, "restart"), ", after ",
                           IntField(r, "delay_ms"), " ms)"));
      }
    } else if (type == "group_restart_begun") {
      event(ts, "restart", "",
            absl::StrCat("group restart to generation ", IntField(r, "generation"), ": ",
                         StrField(r, "reason")));
    } else if (type == "task_hung") {
      event(ts, "hung", StrField(r, "task"),
            absl::StrCat(StrField(r, "task"), " made no progress for ",
                         IntField(r, "silent_ms") / 1000.0, " s after step ",
                         IntField(r, "last_step")));
    } else if (type == "checkpoint") {
      event(ts, "checkpoint_saved", StrField(r, "task"),
            absl::StrCat("checkpoint at step ", IntField(r, "step")));
    } else if (type == "model_published") {
      std::string text = absl::StrCat(StrField(r, "model"), " version ", IntField(r, "version"),
                                      " published");
      if (auto step = r.find("step"); step != r.end() && step->is_number_integer()) {
        absl::StrAppend(&text, " at step ", step->get<int64_t>());
      }
      if (auto metrics = r.find("metrics"); metrics != r.end() && metrics->is_object()) {
        std::string shown;
        for (auto it = metrics->begin(); it != metrics->end(); ++it) {
          if (!it.value().is_number()) continue;
          absl::StrAppend(&shown, shown.empty() ? "" : ", ", it.key(), " ",
                          absl::StrFormat("%g", it.value().get<double>()));
        }
        if (!shown.empty()) absl::StrAppend(&text, " (", shown, ")");
      }
      event(ts, "model_published", StrField(r, "task"), text);
    } else if (type == "resumed") {
      event(ts, "checkpoint_resumed", StrField(r, "task"),
            absl::StrCat(StrField(r, "task"), " resumed at step ", IntField(r, "step")));
    } else if (type == "place_lost" || type == "agent_disconnected" || type == "agent_silent") {
      event(ts, "agent_lost", "",
            absl::StrCat(type == "place_lost" ? "place lost: " : "agent lost: ",
                         StrField(r, "node"), " ", StrField(r, "reason")));
    } else if (type == "slot_left") {
      event(ts, "world", StrField(r, "task"), absl::StrCat(StrField(r, "task"), " left the world"));
    } else if (type == "slot_rejoined") {
      event(ts, "world", StrField(r, "task"),
            absl::StrCat(StrField(r, "task"), " is back for the world"));
    }
  }
  if (!phase.empty()) {
    phases.push_back({{"name", phase}, {"from_ms", phase_from}, {"to_ms", end_ms}});
  }
  json task_rows = json::array();
  for (const auto& name : task_order) {
    json gens = json::array();
    for (const auto& g : tasks[name]) {
      gens.push_back({{"attempt", g.attempt}, {"from_ms", g.from_ms}, {"to_ms", g.to_ms},
                      {"state", g.state}, {"exit_code", g.exit_code}, {"signal", g.signal},
                      {"reason", g.reason}, {"node", g.node}});
    }
    task_rows.push_back({{"task", name}, {"generations", std::move(gens)}});
  }
  return {{"start_unix_ms", start_ms}, {"end_unix_ms", end_ms}, {"now_unix_ms", now_unix_ms},
          {"truncated", truncated}, {"phases", std::move(phases)},
          {"tasks", std::move(task_rows)}, {"events", std::move(events)},
          {"world_size", std::move(world)}};
}

absl::StatusOr<json> JobTimeline(const std::string& job_dir, int64_t now_unix_ms) {
  auto text = ReadFile(job_dir + "/events.jsonl");
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("the job has no journal (", job_dir,
                                            "/events.jsonl): ", text.status().message()));
  }
  return TimelineFromJournal(*text, now_unix_ms);
}

}  // namespace shoal::ui
