#include "ui/job_metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/job_directory.h"
#include "common/files.h"
#include "master/journal_records.h"
#include "nlohmann/json.hpp"

namespace shoal::ui {
namespace {

namespace fs = std::filesystem;
using master::JournalEntry;

constexpr std::array<const char*, 9> kJobStates = {"queued",   "starting",  "running",
                                                   "stopping", "succeeded", "failed",
                                                   "killed",   "lost",      "unknown"};
constexpr std::array<const char*, 6> kTaskStates = {"pending",   "starting", "running",
                                                    "succeeded", "failed",   "killed"};
constexpr std::array<const char*, 7> kCauseClasses = {"exit_code", "signal",      "oom",  "hung",
                                                      "lost",      "start_error", "other"};
// Seconds. Detection runs from milliseconds (an exit report) to minutes (a progress timeout,
// an agent silent for its heartbeat misses); recovery adds backoff and a new place's start.
constexpr std::array<double, 13> kLatencyBuckets = {0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                                    10,   20,  30,   60,  120, 300};

bool IsLiveJobState(const std::string& state) { return !IsFinishedJobState(state); }

std::pair<std::string, std::string> SplitTask(const std::string& task) {
  size_t colon = task.rfind(':');
  if (colon == std::string::npos) return {task, ""};
  return {task.substr(0, colon), task.substr(colon + 1)};
}

struct FileStat {
  bool exists = false;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
};

FileStat Stat(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, st.st_ino};
}

bool DirectoryExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// What happened when, while walking the journal in order, to time each failure.
class JournalWalker {
 public:
  explicit JournalWalker(JobMetricFacts* facts) : facts_(facts) {}

  void Apply(const JournalEntry& e) {
    now_us_ = e.ts_us;
    std::visit([this](const auto& r) { On(r); }, e.record);
  }

  const std::vector<std::string>& task_order() const { return task_order_; }
  const std::map<std::string, std::string>& task_states() const { return task_state_; }
  std::string job_state() const { return job_state_; }
  int64_t finished_unix_ms() const { return finished_us_ / 1000; }

 private:
  // A failure whose task (or group) has not run again yet.
  struct OpenRecovery {
    int64_t onset_us = 0;
    bool group = false;
    // A group recovery learns its tasks from their `-> pending` moves until group_restarted.
    bool collecting = false;
    std::map<std::string, uint32_t> waiting;  // task -> the attempt that must run (at least)
  };

  void On(const master::JobSubmitted& r) {
    facts_->job_id = r.job_id;
    facts_->name = r.name;
  }
  void On(const master::JobStateChanged& r) {
    job_state_ = r.to;
    if (r.to == "queued") {
      if (facts_->queued_since_unix_ms == 0) facts_->queued_since_unix_ms = now_us_ / 1000;
    } else if (facts_->queued_since_unix_ms != 0) {
      facts_->queued_closed_ms += now_us_ / 1000 - facts_->queued_since_unix_ms;
      facts_->queued_since_unix_ms = 0;
    }
  }
  void On(const master::JobFinished&) { finished_us_ = now_us_; }
  void On(const master::Rendezvous& r) {
    for (const auto& rank : r.ranks) task_node_[rank.task] = rank.node;
  }
  // An agent's trouble is the onset of the failures of its tasks the master declares later.
  void On(const master::AgentSilent& r) {
    NodeTrouble(r.node, now_us_ - static_cast<int64_t>(r.seconds * 1e6));
  }
  void On(const master::AgentDisconnected& r) { NodeTrouble(r.node, now_us_); }
  void On(const master::AgentLeaving& r) { NodeTrouble(r.node, now_us_); }
  void On(const master::PlaceLost& r) { NodeTrouble(r.node, now_us_); }
  void On(const master::AgentRegistered& r) { node_trouble_us_.erase(r.node); }
  void On(const master::AgentReattached& r) { node_trouble_us_.erase(r.node); }
  void On(const master::TaskHung& r) {
    hung_[r.task] = {r.attempt, now_us_ - static_cast<int64_t>(r.silent_ms) * 1000};
  }
  void On(const master::SlotDeferred& r) { deferred_.insert(r.task); }
  void On(const master::CheckpointReported&) {
    facts_->newest_checkpoint_unix_ms = std::max(facts_->newest_checkpoint_unix_ms, now_us_ / 1000);
  }
  void On(const master::TaskStateChanged& r) {
    if (!task_state_.count(r.task)) task_order_.push_back(r.task);
    task_state_[r.task] = r.to;
    uint32_t attempt = r.attempt.value_or(0);
    if (r.to == "pending" && attempt >= 1) {
      if (deferred_.erase(r.task) == 0) ++facts_->restarts_by_role[SplitTask(r.task).first];
      for (auto& open : open_) {
        if (open.group && open.collecting) open.waiting[r.task] = attempt;
      }
    }
    if (r.to == "running") TaskRunning(r.task, attempt);
  }
  void On(const master::FailureHandled& r) {
    if (r.cause == master::FailureHandled::kCleanExitCause) return;  // not a failure
    ++facts_->failures_by_cause[FailureCauseClass(r.cause)];
    int64_t onset = now_us_;  // an exit: the report is the journal's first word of it
    if (auto h = hung_.find(r.task); h != hung_.end() && h->second.first == r.attempt) {
      onset = h->second.second;
    } else if (absl::StartsWith(r.cause, "lost:")) {
      if (auto n = task_node_.find(r.task); n != task_node_.end()) {
        if (auto t = node_trouble_us_.find(n->second); t != node_trouble_us_.end()) {
          onset = std::min(onset, t->second);
        }
      }
    }
    hung_.erase(r.task);
    facts_->detection_seconds.push_back(static_cast<double>(now_us_ - onset) / 1e6);
    if (r.action == "restart-task") {
      open_.push_back({onset, false, false, {{r.task, r.attempt + 1}}});
    } else if (r.action == "restart-group" || r.action == "shrink-group") {
      open_.push_back({onset, true, true, {}});
    }
    // join-group-restart: recovered with the group restart under way; fail/none: never.
  }
  void On(const master::GroupRestarted&) {
    for (auto& open : open_) open.collecting = false;
    CloseRecovered();
  }
  template <typename Other>
  void On(const Other&) {}

  void NodeTrouble(const std::string& node, int64_t onset_us) {
    auto [it, inserted] = node_trouble_us_.emplace(node, onset_us);
    if (!inserted) it->second = std::min(it->second, onset_us);
  }

  void TaskRunning(const std::string& task, uint32_t attempt) {
    for (auto& open : open_) {
      auto w = open.waiting.find(task);
      if (w != open.waiting.end() && attempt >= w->second) open.waiting.erase(w);
    }
    CloseRecovered();
  }

  void CloseRecovered() {
    std::erase_if(open_, [this](const OpenRecovery& open) {
      if (open.collecting || !open.waiting.empty()) return false;
      facts_->recovery_seconds.push_back(static_cast<double>(now_us_ - open.onset_us) / 1e6);
      return true;
    });
  }

  JobMetricFacts* facts_;
  int64_t now_us_ = 0;
  int64_t finished_us_ = 0;
  std::string job_state_;
  std::vector<std::string> task_order_;
  std::map<std::string, std::string> task_state_;
  std::map<std::string, std::string> task_node_;
  std::map<std::string, int64_t> node_trouble_us_;
  std::map<std::string, std::pair<uint32_t, int64_t>> hung_;  // task -> (attempt, onset)
  std::set<std::string> deferred_;
  std::vector<OpenRecovery> open_;
};

// The facts events.jsonl holds. NotFound when it does not exist.
absl::StatusOr<JobMetricFacts> ReadJournalFacts(const std::string& job_dir) {
  auto text = ReadFile(job_dir + "/events.jsonl");
  if (!text.ok()) return text.status();
  JobMetricFacts facts;
  JournalWalker walker(&facts);
  int64_t last_us = 0;
  absl::string_view rest = *text;
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    if (end == absl::string_view::npos) {
      facts.journal_truncated = true;  // the writer is mid-line, or died there
      break;
    }
    absl::string_view line = rest.substr(0, end);
    rest.remove_prefix(end + 1);
    if (line.empty()) continue;
    auto json =
        nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) continue;
    auto entry = master::FromJson(json);
    if (!entry.ok()) continue;  // a record of a bad shape changes nothing here
    walker.Apply(*entry);
    last_us = std::max(last_us, entry->ts_us);
  }
  facts.job_dir = job_dir;
  facts.state = walker.job_state();
  facts.ended_unix_ms = walker.finished_unix_ms();
  facts.last_record_unix_ms = last_us / 1000;
  for (const auto& task : walker.task_order()) {
    facts.tasks.push_back({task, SplitTask(task).first, walker.task_states().at(task)});
  }
  return facts;
}

std::optional<double> StepsPerSecond(const std::string& samples_path) {
  int fd = ::open(samples_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string tail;
  if (::fstat(fd, &st) == 0) {
    // The last two samples; one with many GPUs is a few hundred bytes.
    off_t from = std::max<off_t>(0, st.st_size - 16384);
    tail.resize(st.st_size - from);
    ssize_t n = ::pread(fd, tail.data(), tail.size(), from);
    tail.resize(n > 0 ? n : 0);
  }
  ::close(fd);
  std::vector<nlohmann::json> last;
  std::vector<absl::string_view> lines = absl::StrSplit(tail, '\n');
  // The piece after the last newline is a sample still being written (or empty).
  for (size_t i = lines.size() - 1; i-- > 0 && last.size() < 2;) {
    auto j = nlohmann::json::parse(lines[i].begin(), lines[i].end(), nullptr,
                                   /*allow_exceptions=*/false);
    if (j.is_object()) last.push_back(std::move(j));
  }
  if (last.size() < 2) return std::nullopt;
  const nlohmann::json& newer = last[0];
  const nlohmann::json& older = last[1];
  auto num = [](const nlohmann::json& j, const char* key) -> std::optional<double> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  auto t1 = num(older, "ts_ms"), t2 = num(newer, "ts_ms");
  auto s1 = num(older, "step"), s2 = num(newer, "step");
  if (!t1 || !t2 || !s1 || !s2 || *t2 <= *t1 || *s2 < *s1) return std::nullopt;
  if (num(older, "attempt").value_or(0) != num(newer, "attempt").value_or(0)) return std::nullopt;
  return (*s2 - *s1) * 1000.0 / (*t2 - *t1);
}

int64_t NewestCheckpointFile(const std::string& job_dir) {
  int64_t newest_ms = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(job_dir + "/checkpoints", ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // the SDK's temporary files
    FileStat st = Stat(e.path().string());
    if (st.exists) newest_ms = std::max(newest_ms, st.mtime_ns / 1000000);
  }
  return newest_ms;
}

// Adds what the directory says beside the journal: status.json (the state as `shoal status`
// says it, the tasks), whether the master died, the checkpoints and the resource samples.
void CompleteFromDirectory(JobMetricFacts& facts, const std::string& job_dir, int64_t now_unix_ms) {
  facts.job_dir = job_dir;
  if (facts.job_id.empty()) facts.job_id = fs::path(job_dir).filename().string();
  if (auto status = client::ReadStatusFile(job_dir); status && status->is_object()) {
    facts.job_id = status->value("job_id", facts.job_id);
    facts.name = status->value("name", facts.name);
    facts.state = status->value("state", facts.state);
    if (int64_t finished = status->value("finished_unix_ms", int64_t{0}); finished > 0) {
      facts.ended_unix_ms = finished;
    }
    auto tasks = status->find("tasks");
    if (tasks != status->end() && tasks->is_array() && !tasks->empty()) {
      std::vector<TaskMetricFacts> from_status;
      for (const auto& t : *tasks) {
        if (!t.is_object()) continue;
        std::string key = t.value("task", "");
        if (key.empty()) continue;
        from_status.push_back({key, t.value("role", SplitTask(key).first), t.value("state", "")});
      }
      facts.tasks = std::move(from_status);
    }
  }
  if (facts.state.empty()) facts.state = "unknown";
  if (IsLiveJobState(facts.state) && facts.state != "unknown") {
    auto master = client::ReadMasterInfo(job_dir);
    if (!(master && master->alive)) {
      facts.state = "lost";
      facts.queued_since_unix_ms = 0;  // nobody is waiting any more
    }
  }
  // A lost job (or one whose end has no time of its own) ended when its journal stopped.
  if (IsFinishedJobState(facts.state) && facts.ended_unix_ms == 0) {
    facts.ended_unix_ms = facts.last_record_unix_ms;
  }
  if (!IsFinishedJobState(facts.state)) facts.ended_unix_ms = 0;
  facts.queue_wait_ms = facts.queued_closed_ms;
  if (facts.queued_since_unix_ms != 0) {
    facts.queue_wait_ms += std::max<int64_t>(0, now_unix_ms - facts.queued_since_unix_ms);
  }
  facts.newest_checkpoint_unix_ms =
      std::max(facts.newest_checkpoint_unix_ms, NewestCheckpointFile(job_dir));
  for (auto& task : facts.tasks) {
    if (task.state != "running") continue;
    auto [role, index] = SplitTask(task.task);
    if (auto sps = StepsPerSecond(
            absl::StrCat(job_dir, "/tasks/", role, "-", index, "/resources.jsonl"))) {
      task.has_steps_per_second = true;
      task.steps_per_second = *sps;
    }
  }
}

absl::StatusOr<JobMetricFacts> ReadJournalPart(const std::string& job_dir) {
  auto facts = ReadJournalFacts(job_dir);
  if (facts.ok()) return facts;
  if (!absl::IsNotFound(facts.status())) return facts.status();
  // No journal: the job is being submitted, or the directory is gone.
  if (!DirectoryExists(job_dir)) {
    return absl::NotFoundError(absl::StrCat("job directory ", job_dir, " does not exist"));
  }
  return JobMetricFacts{};
}

absl::StatusOr<JobMetricFacts> Finish(JobMetricFacts facts, const std::string& job_dir,
                                      int64_t now_unix_ms) {
  CompleteFromDirectory(facts, job_dir, now_unix_ms);
  // Deleted while it was read: what was read may be half of it.
  if (!DirectoryExists(job_dir)) {
    return absl::NotFoundError(absl::StrCat("job directory ", job_dir, " was deleted"));
  }
  return facts;
}

// ---- the text format

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    return absl::StrFormat("%d", static_cast<int64_t>(v));
  return absl::StrFormat("%.9g", v);
}

class TextWriter {
 public:
  void Family(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Sample(absl::string_view name,
              std::initializer_list<std::pair<absl::string_view, absl::string_view>> labels,
              double value) {
    out_.append(name.data(), name.size());
    if (labels.size() > 0) {
      out_ += '{';
      bool first = true;
      for (const auto& [k, v] : labels) {
        absl::StrAppend(&out_, first ? "" : ",", k, "=\"", EscapeLabelValue(v), "\"");
        first = false;
      }
      out_ += '}';
    }
    absl::StrAppend(&out_, " ", FormatValue(value), "\n");
  }
  void Histogram(absl::string_view name, const std::vector<double>& observations) {
    std::array<uint64_t, kLatencyBuckets.size()> counts{};
    double sum = 0;
    for (double v : observations) {
      sum += v;
      for (size_t i = 0; i < kLatencyBuckets.size(); ++i) counts[i] += v <= kLatencyBuckets[i];
    }
    std::string bucket = absl::StrCat(name, "_bucket");
    for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      Sample(bucket, {{"le", FormatValue(kLatencyBuckets[i])}}, counts[i]);
    }
    Sample(bucket, {{"le", "+Inf"}}, observations.size());
    Sample(absl::StrCat(name, "_sum"), {}, sum);
    Sample(absl::StrCat(name, "_count"), {}, observations.size());
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

bool IsFinishedJobState(const std::string& state) {
  return state == "succeeded" || state == "failed" || state == "killed" || state == "lost";
}

std::string FailureCauseClass(const std::string& cause) {
  if (absl::StrContains(cause, "for exceeding its memory limit")) return "oom";
  if (absl::StartsWith(cause, "hung:")) return "hung";
  if (absl::StartsWith(cause, "lost:")) return "lost";
  if (absl::StartsWith(cause, "could not start:")) return "start_error";
  if (absl::StartsWith(cause, "was killed by signal")) return "signal";
  if (absl::StartsWith(cause, "exited with code")) return "exit_code";
  return "other";
}

absl::StatusOr<JobMetricFacts> ReadJobMetricFacts(const std::string& job_dir, int64_t now_unix_ms) {
  auto journal = ReadJournalPart(job_dir);
  if (!journal.ok()) return journal.status();
  return Finish(std::move(*journal), job_dir, now_unix_ms);
}

std::string RenderJobMetrics(const std::vector<JobMetricFacts>& jobs,
                             const MetricsRenderOptions& options) {
  std::vector<const JobMetricFacts*> shown;
  std::map<std::string, int64_t> by_state;
  for (const char* s : kJobStates) by_state[s] = 0;
  std::map<std::string, int64_t> failures_all;
  for (const char* c : kCauseClasses) failures_all[c] = 0;
  std::vector<double> detection, recovery;
  for (const auto& job : jobs) {
    ++by_state[job.state.empty() ? "unknown" : job.state];
    for (const auto& [cause, n] : job.failures_by_cause) failures_all[cause] += n;
    detection.insert(detection.end(), job.detection_seconds.begin(), job.detection_seconds.end());
    recovery.insert(recovery.end(), job.recovery_seconds.begin(), job.recovery_seconds.end());
    if (!IsFinishedJobState(job.state) || job.ended_unix_ms == 0 ||
        options.now_unix_ms - job.ended_unix_ms <= options.recent_ms) {
      shown.push_back(&job);
    }
  }
  TextWriter w;
  w.Family("shoal_jobs", "gauge", "Jobs in the jobs directory by state.");
  for (const auto& [state, n] : by_state) w.Sample("shoal_jobs", {{"state", state}}, n);
  w.Family("shoal_failures_total", "counter",
           "Task failures handled by the failure policy, over every job of the directory, by "
           "cause class.");
  for (const auto& [cause, n] : failures_all)
    w.Sample("shoal_failures_total", {{"cause", cause}}, n);
  w.Family("shoal_failure_detection_seconds", "histogram",
           "Time from a task failure (its exit, the start of a hang, its agent's silence or "
           "loss) to the master's decision on it, over every job of the directory.");
  w.Histogram("shoal_failure_detection_seconds", detection);
  w.Family("shoal_failure_recovery_seconds", "histogram",
           "Time from a task failure to the task, or every task of the re-formed group, "
           "running again, over every job of the directory.");
  w.Histogram("shoal_failure_recovery_seconds", recovery);

  w.Family("shoal_job_info", "gauge",
           "1 per job shown (live, or ended within the recent window), with its name and state.");
  for (const auto* j : shown) {
    w.Sample("shoal_job_info", {{"job_id", j->job_id}, {"name", j->name}, {"state", j->state}}, 1);
  }
  w.Family("shoal_job_tasks", "gauge", "Tasks of the job by state.");
  for (const auto* j : shown) {
    std::map<std::string, int64_t> tasks;
    for (const char* s : kTaskStates) tasks[s] = 0;
    for (const auto& t : j->tasks) ++tasks[t.state];
    for (const auto& [state, n] : tasks) {
      w.Sample("shoal_job_tasks", {{"job_id", j->job_id}, {"state", state}}, n);
    }
  }
  w.Family("shoal_job_restarts_total", "counter",
           "Times a task of the role was started again (restart-task, a group restart, "
           "restart: always).");
  for (const auto* j : shown) {
    std::map<std::string, int64_t> roles;
    for (const auto& t : j->tasks) roles[t.role] = 0;
    for (const auto& [role, n] : j->restarts_by_role) roles[role] = n;
    for (const auto& [role, n] : roles) {
      w.Sample("shoal_job_restarts_total", {{"job_id", j->job_id}, {"role", role}}, n);
    }
  }
  w.Family("shoal_job_failures_total", "counter",
           "Task failures of the job handled by the failure policy, by cause class.");
  for (const auto* j : shown) {
    for (const auto& [cause, n] : j->failures_by_cause) {
      w.Sample("shoal_job_failures_total", {{"job_id", j->job_id}, {"cause", cause}}, n);
    }
  }
  w.Family("shoal_job_queue_wait_seconds", "gauge",
           "Time the job spent queued for admission, up to now while it is queued.");
  for (const auto* j : shown) {
    w.Sample("shoal_job_queue_wait_seconds", {{"job_id", j->job_id}}, j->queue_wait_ms / 1000.0);
  }
  w.Family("shoal_job_checkpoint_age_seconds", "gauge",
           "Time since the job's newest checkpoint (reported by the SDK or written under the "
           "job directory); absent before the first one.");
  for (const auto* j : shown) {
    if (j->newest_checkpoint_unix_ms <= 0) continue;
    w.Sample("shoal_job_checkpoint_age_seconds", {{"job_id", j->job_id}},
             std::max<int64_t>(0, options.now_unix_ms - j->newest_checkpoint_unix_ms) / 1000.0);
  }
  w.Family("shoal_task_steps_per_second", "gauge",
           "Training steps per second of a running task, from its last two resource samples.");
  for (const auto* j : shown) {
    for (const auto& t : j->tasks) {
      if (!t.has_steps_per_second) continue;
      w.Sample("shoal_task_steps_per_second", {{"job_id", j->job_id}, {"task", t.task}},
               t.steps_per_second);
    }
  }
  return w.Take();
}

std::vector<JobMetricFacts> JobMetricsCache::Read(const std::vector<std::string>& job_dirs,
                                                  int64_t now_unix_ms) {
  std::vector<JobMetricFacts> out;
  out.reserve(job_dirs.size());
  absl::MutexLock lock(&mu_);
  std::map<std::string, Entry> kept;
  size_t parsed = 0;
  for (const auto& dir : job_dirs) {
    FileStat events = Stat(dir + "/events.jsonl");
    FileStat status = Stat(dir + "/status.json");
    FileKey key{events.exists ? events.size : -1, events.mtime_ns,
                status.exists ? status.mtime_ns : -1, status.inode};
    auto it = entries_.find(dir);
    if (it != entries_.end() && it->second.key == key &&
        IsFinishedJobState(it->second.facts.state)) {
      out.push_back(it->second.facts);
      kept.insert(entries_.extract(it));
      continue;
    }
    // The journal part (the expensive one) of a live job is kept as read; the rest is small.
    JobMetricFacts journal;
    if (it != entries_.end() && it->second.key.events_size == key.events_size &&
        it->second.key.events_mtime_ns == key.events_mtime_ns) {
      journal = it->second.journal;
    } else {
      auto read = ReadJournalPart(dir);
      if (!read.ok()) continue;  // gone, or unreadable: not a job to show
      ++parsed;
      journal = std::move(*read);
    }
    auto facts = Finish(journal, dir, now_unix_ms);
    if (!facts.ok()) continue;
    out.push_back(*facts);
    kept[dir] = Entry{key, std::move(journal), std::move(*facts)};
  }
  entries_ = std::move(kept);
  journals_read_last_ = parsed;
  return out;
}

size_t JobMetricsCache::journals_read_last() const {
  absl::MutexLock lock(&mu_);
  return journals_read_last_;
}

}  // namespace shoal::ui
