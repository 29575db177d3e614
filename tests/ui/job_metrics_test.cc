#include "ui/job_metrics.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace shoal::ui {
namespace {

namespace fs = std::filesystem;
using ::testing::DoubleNear;
using ::testing::ElementsAre;

constexpr int64_t kT0 = 1'800'000'000'000;  // ms; every journal here starts at this moment

// A journal line at `ms` after kT0.
nlohmann::json At(int64_t ms, nlohmann::json record) {
  record["ts"] = kT0 + ms;
  record["ts_us"] = (kT0 + ms) * 1000;
  return record;
}

nlohmann::json TaskState(int64_t ms, const std::string& task, const std::string& to,
                         std::optional<int> attempt = std::nullopt) {
  nlohmann::json r = {{"type", "task_state"}, {"task", task}, {"to", to}};
  if (attempt) r["attempt"] = *attempt;
  return At(ms, r);
}

nlohmann::json JobState(int64_t ms, const std::string& to) {
  return At(ms, {{"type", "job_state"}, {"to", to}, {"reason", ""}});
}

nlohmann::json Failure(int64_t ms, const std::string& task, int attempt, const std::string& action,
                       const std::string& cause) {
  return At(ms, {{"type", "failure_handled"},
                 {"task", task},
                 {"attempt", attempt},
                 {"action", action},
                 {"cause", cause},
                 {"restart", 1},
                 {"delay_ms", 200}});
}

// The records of a job that starts its tasks on node "local" and runs them from 100 ms.
std::vector<nlohmann::json> Started(const std::string& id, const std::vector<std::string>& tasks) {
  std::vector<nlohmann::json> j = {At(
      0, {{"type", "job_submitted"}, {"job_id", id}, {"name", "train"}, {"tasks", tasks.size()}})};
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& t : tasks) {
    j.push_back(TaskState(0, t, "pending"));
    ranks.push_back({{"task", t}, {"node", "node-" + t.substr(t.find(':') + 1)}});
  }
  j.push_back(At(10, {{"type", "rendezvous"}, {"generation", 0}, {"ranks", ranks}}));
  for (const auto& t : tasks) j.push_back(TaskState(100, t, "running", 0));
  j.push_back(JobState(100, "running"));
  return j;
}

class JobDirs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            absl::StrCat("shoal-ui-metrics-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    for (pid_t pid : masters_) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    fs::remove_all(root_);
  }

  std::string Job(const std::string& id) {
    std::string dir = (root_ / id).string();
    fs::create_directories(dir);
    std::ofstream(dir + "/spec.yaml") << "name: train\n";
    return dir;
  }
  static void WriteJournal(const std::string& dir, const std::vector<nlohmann::json>& lines,
                           const std::string& torn_tail = "") {
    std::ofstream out(dir + "/events.jsonl");
    for (const auto& l : lines) out << l.dump() << "\n";
    out << torn_tail;
  }
  static void Append(const std::string& dir, const nlohmann::json& line) {
    std::ofstream(dir + "/events.jsonl", std::ios::app) << line.dump() << "\n";
  }
  static void WriteStatus(const std::string& dir, const std::string& state,
                          int64_t finished_ms = 0) {
    nlohmann::json s = {
        {"job_id", fs::path(dir).filename().string()}, {"name", "train"}, {"state", state}};
    if (finished_ms) s["finished_unix_ms"] = kT0 + finished_ms;
    std::ofstream(dir + "/status.json") << s.dump();
  }
  // A real process standing in for the job's live master: `shoal status` believes a master
  // alive when master.json's pid runs with the job directory on its command line.
  void StartMaster(const std::string& dir) {
    std::string script = "sleep 60; :";
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), dir.c_str(), nullptr};
    pid_t pid = 0;
    // Its own process group, so that TearDown ends its sleep with it.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    int rc = posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char**>(argv), environ);
    posix_spawnattr_destroy(&attr);
    ASSERT_EQ(rc, 0);
    masters_.push_back(pid);
    // Until the child has exec'd, its command line is this test's.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
      std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (cmdline.find(dir) != std::string::npos) break;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "sh did not start";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ofstream(dir + "/master.json")
        << nlohmann::json{{"address", "127.0.0.1:1"}, {"pid", pid}}.dump();
  }
  JobMetricFacts Read(const std::string& dir, int64_t now_ms = 60'000) {
    auto facts = ReadJobMetricFacts(dir, kT0 + now_ms);
    EXPECT_TRUE(facts.ok()) << facts.status();
    return facts.ok() ? *facts : JobMetricFacts{};
  }

  fs::path root_;
  std::vector<pid_t> masters_;
};

TEST_F(JobDirs, TaskExitAndRestartTimedFromTheJournal) {
  std::string dir = Job("exit-1");
  auto j = Started("exit-1", {"worker:0", "worker:1"});
  j.push_back(Failure(10'000, "worker:1", 0, "restart-task", "exited with code 3"));
  j.push_back(TaskState(10'000, "worker:1", "failed", 0));
  j.push_back(TaskState(10'200, "worker:1", "pending", 1));
  j.push_back(TaskState(11'000, "worker:1", "starting", 1));
  j.push_back(TaskState(11'750, "worker:1", "running", 1));
  j.push_back(TaskState(20'000, "worker:0", "succeeded", 0));
  j.push_back(TaskState(20'000, "worker:1", "succeeded", 1));
  j.push_back(At(20'010, {{"type", "job_finished"}, {"outcome", "succeeded"}}));
  j.push_back(JobState(20'010, "succeeded"));
  WriteJournal(dir, j);
  WriteStatus(dir, "succeeded", 20'010);

  JobMetricFacts f = Read(dir);
  EXPECT_EQ(f.job_id, "exit-1");
  EXPECT_EQ(f.state, "succeeded");
  EXPECT_EQ(f.ended_unix_ms, kT0 + 20'010);
  EXPECT_EQ(f.restarts_by_role, (std::map<std::string, int64_t>{{"worker", 1}}));
  EXPECT_EQ(f.failures_by_cause, (std::map<std::string, int64_t>{{"exit_code", 1}}));
  // An exit: the report is the journal's first word of it, decided on at once.
  EXPECT_THAT(f.detection_seconds, ElementsAre(DoubleNear(0.0, 1e-9)));
  EXPECT_THAT(f.recovery_seconds, ElementsAre(DoubleNear(1.75, 1e-9)));
  EXPECT_FALSE(f.journal_truncated);
}

TEST_F(JobDirs, HangIsDetectedFromItsLastProgress) {
  std::string dir = Job("hang-1");
  auto j = Started("hang-1", {"worker:0"});
  j.push_back(At(30'000, {{"type", "task_hung"},
                          {"task", "worker:0"},
                          {"attempt", 0},
                          {"last_step", 7},
                          {"silent_ms", 5000}}));
  j.push_back(
      Failure(30'040, "worker:0", 0, "restart-task", "hung: no progress for 5.0s after step 7"));
  j.push_back(TaskState(30'040, "worker:0", "failed", 0));
  j.push_back(TaskState(30'240, "worker:0", "pending", 1));
  j.push_back(TaskState(31'000, "worker:0", "running", 1));
  WriteJournal(dir, j);
  WriteStatus(dir, "running");
  StartMaster(dir);

  JobMetricFacts f = Read(dir);
  EXPECT_EQ(f.state, "running");
  EXPECT_EQ(f.failures_by_cause, (std::map<std::string, int64_t>{{"hung", 1}}));
  EXPECT_THAT(f.detection_seconds, ElementsAre(DoubleNear(5.04, 1e-9)));  // 25.0 s -> 30.04 s
  EXPECT_THAT(f.recovery_seconds, ElementsAre(DoubleNear(6.0, 1e-9)));    // 25.0 s -> 31.0 s
}

TEST_F(JobDirs, GroupRecoversWhenEveryTaskRunsAgain) {
  std::string dir = Job("group-1");
  auto j = Started("group-1", {"worker:0", "worker:1"});
  // worker:1's agent went silent at 10 s; the master gives up on it 30 s later.
  j.push_back(At(40'000, {{"type", "agent_silent"}, {"node", "node-1"}, {"seconds", 30.0}}));
  j.push_back(Failure(40'002, "worker:1", 0, "restart-group",
                      "lost: the agent on node-1 was silent for 30.0s"));
  j.push_back(TaskState(40'002, "worker:1", "failed", 0));
  j.push_back(At(40'003, {{"type", "group_restart_begun"}, {"generation", 1}}));
  j.push_back(TaskState(40'500, "worker:0", "killed", 0));
  j.push_back(TaskState(41'000, "worker:0", "pending", 1));
  j.push_back(TaskState(41'000, "worker:1", "pending", 1));
  j.push_back(At(41'001, {{"type", "group_restarted"}, {"generation", 1}, {"world_size", 2}}));
  j.push_back(TaskState(42'000, "worker:0", "running", 1));
  j.push_back(TaskState(45'000, "worker:1", "running", 1));  // its new place took longer
  WriteJournal(dir, j);
  WriteStatus(dir, "running");
  StartMaster(dir);

  JobMetricFacts f = Read(dir);
  EXPECT_EQ(f.restarts_by_role, (std::map<std::string, int64_t>{{"worker", 2}}));
  EXPECT_EQ(f.failures_by_cause, (std::map<std::string, int64_t>{{"lost", 1}}));
  EXPECT_THAT(f.detection_seconds, ElementsAre(DoubleNear(30.002, 1e-9)));
  EXPECT_THAT(f.recovery_seconds, ElementsAre(DoubleNear(35.0, 1e-9)));  // 10 s -> 45 s
}

TEST_F(JobDirs, QueuedJobWaitsUntilNowAndAdmittedOneStopsCounting) {
  std::string queued = Job("queued-1");
  WriteJournal(queued, {At(0, {{"type", "job_submitted"}, {"job_id", "queued-1"}}),
                        JobState(1'000, "queued"), JobState(2'000, "queued")});
  WriteStatus(queued, "queued");
  StartMaster(queued);
  std::string admitted = Job("admitted-1");
  WriteJournal(admitted, {At(0, {{"type", "job_submitted"}, {"job_id", "admitted-1"}}),
                          JobState(1'000, "queued"), JobState(4'500, "starting"),
                          JobState(5'000, "running")});
  WriteStatus(admitted, "running");
  StartMaster(admitted);

  EXPECT_EQ(Read(queued, 61'000).queue_wait_ms, 60'000);
  EXPECT_EQ(Read(admitted, 61'000).queue_wait_ms, 3'500);
}

TEST_F(JobDirs, JobOfADeadMasterIsLost) {
  std::string dir = Job("lost-1");
  WriteJournal(dir, Started("lost-1", {"worker:0"}));
  WriteStatus(dir, "running");
  std::ofstream(dir + "/master.json") << R"({"address": "127.0.0.1:1", "pid": 999999999})";
  JobMetricFacts f = Read(dir);
  EXPECT_EQ(f.state, "lost");
  EXPECT_EQ(f.ended_unix_ms, kT0 + 100);  // its journal's last record
}

TEST_F(JobDirs, FinishedJobWithoutEndTimeEndsWithItsJournal) {
  std::string dir = Job("noend-1");
  auto j = Started("noend-1", {"worker:0"});
  j.push_back(JobState(7'000, "succeeded"));  // no job_finished, no status.json
  WriteJournal(dir, j);
  JobMetricFacts f = Read(dir);
  EXPECT_EQ(f.state, "succeeded");
  EXPECT_EQ(f.ended_unix_ms, kT0 + 7'000);
}

TEST_F(JobDirs, TruncatedLastLineIsSkipped) {
  std::string dir = Job("torn-1");
  auto j = Started("torn-1", {"worker:0"});
  j.push_back(Failure(5'000, "worker:0", 0, "restart-task", "was killed by signal 9 (SIGKILL)"));
  WriteJournal(dir, j, R"({"type":"task_state","task":"worker:0","to":"fai)");
  WriteStatus(dir, "running");
  StartMaster(dir);
  JobMetricFacts f = Read(dir);
  EXPECT_TRUE(f.journal_truncated);
  EXPECT_EQ(f.failures_by_cause, (std::map<std::string, int64_t>{{"signal", 1}}));
  EXPECT_TRUE(f.recovery_seconds.empty());  // not running again yet
}

TEST_F(JobDirs, DeletedDirectoryIsNotFound) {
  std::string dir = Job("gone-1");
  WriteJournal(dir, Started("gone-1", {"worker:0"}));
  fs::remove_all(dir);
  auto facts = ReadJobMetricFacts(dir, kT0);
  ASSERT_FALSE(facts.ok());
  EXPECT_TRUE(absl::IsNotFound(facts.status())) << facts.status();
  EXPECT_THAT(std::string(facts.status().message()), ::testing::HasSubstr(dir));
}

TEST_F(JobDirs, DirectoryWithoutJournalYetIsUnknown) {
  std::string dir = Job("new-1");
  JobMetricFacts f = Read(dir);
  EXPECT_EQ(f.job_id, "new-1");
  EXPECT_EQ(f.state, "unknown");
}

TEST_F(JobDirs, StepsPerSecondFromTheLastTwoSamplesOfARunningTask) {
  std::string dir = Job("steps-1");
  WriteJournal(dir, Started("steps-1", {"worker:0", "worker:1"}));
  WriteStatus(dir, "running");
  StartMaster(dir);
  fs::create_directories(dir + "/tasks/worker-0");
  std::ofstream(dir + "/tasks/worker-0/resources.jsonl")
      << R"({"ts_ms": 1000, "step": 0, "attempt": 0, "cpu_percent": 90, "gpus": []})"
         "\n"
      << R"({"ts_ms": 2000, "step": 10, "attempt": 0, "cpu_percent": 90, "gpus": []})"
         "\n"
      << R"({"ts_ms": 4000, "step": 30, "attempt": 0, "cpu_percent": 90, "gpus": []})"
         "\n"
      << R"({"ts_ms": 5000, "st)";
  JobMetricFacts f = Read(dir);
  ASSERT_EQ(f.tasks.size(), 2u);
  EXPECT_TRUE(f.tasks[0].has_steps_per_second);
  EXPECT_DOUBLE_EQ(f.tasks[0].steps_per_second, 10.0);
  EXPECT_FALSE(f.tasks[1].has_steps_per_second);  // no samples, no series
}

TEST_F(JobDirs, CheckpointAgeFromTheNewerOfReportAndFile) {
  std::string dir = Job("ckpt-1");
  auto j = Started("ckpt-1", {"worker:0"});
  j.push_back(At(8'000, {{"type", "checkpoint"}, {"task", "worker:0"}, {"step", 100}}));
  WriteJournal(dir, j);
  WriteStatus(dir, "running");
  StartMaster(dir);
  EXPECT_EQ(Read(dir).newest_checkpoint_unix_ms, kT0 + 8'000);

  fs::create_directories(dir + "/checkpoints");
  std::string file = dir + "/checkpoints/ckpt-000000000200.pt";
  std::ofstream(file) << "x";
  struct timespec times[2] = {{(kT0 + 9'000) / 1000, 0}, {(kT0 + 9'000) / 1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  EXPECT_EQ(Read(dir).newest_checkpoint_unix_ms, kT0 + 9'000);
}

TEST(FailureCauseClassTest, ClassesOfTheMastersCauses) {
  EXPECT_EQ(FailureCauseClass("exited with code 3"), "exit_code");
  EXPECT_EQ(FailureCauseClass("was killed by signal 9 (SIGKILL)"), "signal");
  EXPECT_EQ(FailureCauseClass("was killed by signal 9 (SIGKILL) for exceeding its memory limit "
                              "(memory: 256MiB)"),
            "oom");
  EXPECT_EQ(FailureCauseClass("hung: no progress for 5.0s after step 7"), "hung");
  EXPECT_EQ(FailureCauseClass("lost: the agent on n1 disconnected"), "lost");
  EXPECT_EQ(FailureCauseClass("could not start: no such file"), "start_error");
  EXPECT_EQ(FailureCauseClass("something new"), "other");
}

// ---- the text format, parsed back

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family -> type
  std::vector<Sample> samples;

  std::vector<Sample> Of(const std::string& name) const {
    std::vector<Sample> out;
    for (const auto& s : samples) {
      if (s.name == name) out.push_back(s);
    }
    return out;
  }
  std::optional<double> Value(const std::string& name,
                              const std::map<std::string, std::string>& labels) const {
    for (const auto& s : samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
    return std::nullopt;
  }
};

// Parses the text format strictly: every line is a HELP or TYPE comment, or
// `name{label="value",...} value` with the format's escapes; anything else fails the test.
Exposition Parse(const std::string& text) {
  Exposition e;
  EXPECT_TRUE(absl::EndsWith(text, "\n"));
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# HELP ")) continue;
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), ' ');
      EXPECT_EQ(parts.size(), 2u) << line;
      if (parts.size() == 2) {
        EXPECT_FALSE(e.types.count(parts[0])) << "family listed twice: " << line;
        e.types[parts[0]] = parts[1];
      }
      continue;
    }
    Sample s;
    size_t i = 0;
    while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) ||
                               line[i] == '_' || line[i] == ':')) {
      ++i;
    }
    s.name = std::string(line.substr(0, i));
    EXPECT_FALSE(s.name.empty()) << line;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find("=\"", i);
        if (eq == absl::string_view::npos) {
          ADD_FAILURE() << "bad labels: " << line;
          return e;
        }
        std::string key(line.substr(i, eq - i));
        std::string value;
        i = eq + 2;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            char c = line[++i];
            EXPECT_TRUE(c == '\\' || c == '"' || c == 'n') << "bad escape in " << line;
            value += c == 'n' ? '\n' : c;
          } else {
            value += line[i];
          }
          ++i;
        }
        ++i;  // the closing quote
        s.labels[key] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;  // '}'
    }
    EXPECT_TRUE(i < line.size() && line[i] == ' ') << line;
    absl::string_view value = line.substr(i + 1);
    if (value == "+Inf") {
      s.value = INFINITY;
    } else {
      EXPECT_TRUE(absl::SimpleAtod(value, &s.value)) << line;
    }
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (absl::EndsWith(s.name, suffix) && !e.types.count(s.name)) {
        family = s.name.substr(0, s.name.size() - std::string(suffix).size());
      }
    }
    EXPECT_TRUE(e.types.count(family)) << "no TYPE before " << line;
    e.samples.push_back(std::move(s));
  }
  return e;
}

void ExpectHistogramConsistent(const Exposition& e, const std::string& name, double count) {
  EXPECT_EQ(e.types.at(name), "histogram");
  auto buckets = e.Of(name + "_bucket");
  ASSERT_FALSE(buckets.empty());
  double previous = 0, previous_le = -1;
  for (const auto& b : buckets) {
    double le = b.labels.at("le") == "+Inf" ? INFINITY : std::stod(b.labels.at("le"));
    EXPECT_GT(le, previous_le) << name << " buckets out of order";
    EXPECT_GE(b.value, previous) << name << " buckets not cumulative";
    previous = b.value;
    previous_le = le;
  }
  EXPECT_EQ(buckets.back().labels.at("le"), "+Inf");
  EXPECT_EQ(buckets.back().value, e.Value(name + "_count", {}).value_or(-1));
  EXPECT_EQ(e.Value(name + "_count", {}).value_or(-1), count);
}

JobMetricFacts Finished(const std::string& id, const std::string& state, int64_t ended_ms) {
  JobMetricFacts f;
  f.job_id = id;
  f.name = "train";
  f.state = state;
  f.ended_unix_ms = kT0 + ended_ms;
  f.tasks = {{"worker:0", "worker", state == "succeeded" ? "succeeded" : "failed"}};
  return f;
}

TEST(RenderJobMetricsTest, ParsesBackWithConsistentHistogramsAndEscapedLabels) {
  JobMetricFacts live;
  live.job_id = "odd\"id\\with\nnewline";
  live.name = "train";
  live.state = "running";
  live.tasks = {{"worker:0", "worker", "running", true, 12.5}, {"worker:1", "worker", "pending"}};
  live.restarts_by_role = {{"worker", 2}};
  live.failures_by_cause = {{"exit_code", 1}, {"hung", 1}};
  live.detection_seconds = {0.0, 5.04};
  live.recovery_seconds = {1.75};
  live.queue_wait_ms = 3500;
  live.newest_checkpoint_unix_ms = kT0 + 50'000;
  JobMetricFacts done = Finished("done-1", "succeeded", 0);
  done.recovery_seconds = {400.0};  // beyond the last bound: only in +Inf
  done.failures_by_cause = {{"lost", 1}};
  done.detection_seconds = {30.0};

  std::string text =
      RenderJobMetrics({live, done}, {.now_unix_ms = kT0 + 60'000, .recent_ms = 600'000});
  Exposition e = Parse(text);

  EXPECT_EQ(e.types.at("shoal_jobs"), "gauge");
  EXPECT_EQ(e.Value("shoal_jobs", {{"state", "running"}}), 1);
  EXPECT_EQ(e.Value("shoal_jobs", {{"state", "succeeded"}}), 1);
  EXPECT_EQ(e.Value("shoal_jobs", {{"state", "queued"}}), 0);
  EXPECT_EQ(e.types.at("shoal_job_restarts_total"), "counter");
  EXPECT_EQ(e.Value("shoal_job_restarts_total", {{"job_id", live.job_id}, {"role", "worker"}}), 2);
  EXPECT_EQ(e.Value("shoal_job_restarts_total", {{"job_id", "done-1"}, {"role", "worker"}}), 0);
  EXPECT_EQ(e.Value("shoal_job_failures_total", {{"job_id", live.job_id}, {"cause", "hung"}}), 1);
  EXPECT_EQ(e.Value("shoal_failures_total", {{"cause", "lost"}}), 1);
  EXPECT_EQ(e.Value("shoal_failures_total", {{"cause", "exit_code"}}), 1);
  EXPECT_EQ(e.Value("shoal_job_tasks", {{"job_id", live.job_id}, {"state", "running"}}), 1);
  EXPECT_EQ(e.Value("shoal_job_tasks", {{"job_id", live.job_id}, {"state", "pending"}}), 1);
  EXPECT_EQ(e.Value("shoal_job_tasks", {{"job_id", live.job_id}, {"state", "failed"}}), 0);
  EXPECT_EQ(e.Value("shoal_task_steps_per_second", {{"job_id", live.job_id}, {"task", "worker:0"}}),
            12.5);
  EXPECT_FALSE(
      e.Value("shoal_task_steps_per_second", {{"job_id", live.job_id}, {"task", "worker:1"}}));
  EXPECT_EQ(e.Value("shoal_job_queue_wait_seconds", {{"job_id", live.job_id}}), 3.5);
  EXPECT_EQ(e.Value("shoal_job_checkpoint_age_seconds", {{"job_id", live.job_id}}), 10);
  EXPECT_FALSE(e.Value("shoal_job_checkpoint_age_seconds", {{"job_id", "done-1"}}));

  ExpectHistogramConsistent(e, "shoal_failure_detection_seconds", 3);
  ExpectHistogramConsistent(e, "shoal_failure_recovery_seconds", 2);
  EXPECT_EQ(e.Value("shoal_failure_recovery_seconds_bucket", {{"le", "300"}}), 1);
  EXPECT_EQ(e.Value("shoal_failure_recovery_seconds_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_EQ(e.Value("shoal_failure_detection_seconds_bucket", {{"le", "0.05"}}), 1);
  EXPECT_DOUBLE_EQ(e.Value("shoal_failure_detection_seconds_sum", {}).value_or(-1), 35.04);
  // The escapes as the format writes them.
  EXPECT_THAT(text, ::testing::HasSubstr(R"(job_id="odd\"id\\with\nnewline")"));
}

TEST(RenderJobMetricsTest, JobsEndedLongAgoAreCountedButHaveNoSeriesOfTheirOwn) {
  JobMetricFacts old_job = Finished("old-1", "failed", 0);
  old_job.failures_by_cause = {{"exit_code", 1}};
  old_job.detection_seconds = {0.0};
  JobMetricFacts recent = Finished("recent-1", "succeeded", 15 * 60'000);  // 5 min ago
  Exposition e = Parse(RenderJobMetrics(
      {old_job, recent}, {.now_unix_ms = kT0 + 20 * 60'000, .recent_ms = 10 * 60'000}));
  EXPECT_EQ(e.Value("shoal_jobs", {{"state", "failed"}}), 1);
  EXPECT_EQ(e.Value("shoal_failures_total", {{"cause", "exit_code"}}), 1);
  ExpectHistogramConsistent(e, "shoal_failure_detection_seconds", 1);
  for (const auto& s : e.samples) {
    if (s.labels.count("job_id")) {
      EXPECT_NE(s.labels.at("job_id"), "old-1") << s.name;
    }
  }
  EXPECT_TRUE(e.Value("shoal_job_info",
                      {{"job_id", "recent-1"}, {"name", "train"}, {"state", "succeeded"}}));
}

TEST(RenderJobMetricsTest, EmptyDirectoryStillListsEveryFamily) {
  Exposition e = Parse(RenderJobMetrics({}, {.now_unix_ms = kT0}));
  for (const char* family :
       {"shoal_jobs", "shoal_failures_total", "shoal_failure_detection_seconds",
        "shoal_failure_recovery_seconds", "shoal_job_info", "shoal_job_tasks",
        "shoal_job_restarts_total", "shoal_job_failures_total", "shoal_job_queue_wait_seconds",
        "shoal_job_checkpoint_age_seconds", "shoal_task_steps_per_second"}) {
    EXPECT_TRUE(e.types.count(family)) << family;
  }
  ExpectHistogramConsistent(e, "shoal_failure_recovery_seconds", 0);
}

// ---- the cache

TEST_F(JobDirs, CacheRereadsOnlyChangedJournalsAndForgetsDeletedJobs) {
  std::vector<std::string> dirs;
  for (int i = 0; i < 3; ++i) {
    std::string id = absl::StrCat("done-", i);
    std::string dir = Job(id);
    auto j = Started(id, {"worker:0"});
    j.push_back(JobState(1'000, "succeeded"));
    WriteJournal(dir, j);
    WriteStatus(dir, "succeeded", 1'000);
    dirs.push_back(dir);
  }
  std::string live = Job("live-1");
  WriteJournal(live, Started("live-1", {"worker:0"}));
  WriteStatus(live, "running");
  StartMaster(live);
  dirs.push_back(live);

  JobMetricsCache cache;
  EXPECT_EQ(cache.Read(dirs, kT0 + 2'000).size(), 4u);
  EXPECT_EQ(cache.journals_read_last(), 4u);
  EXPECT_EQ(cache.Read(dirs, kT0 + 3'000).size(), 4u);
  EXPECT_EQ(cache.journals_read_last(), 0u);

  Append(live, Failure(2'500, "worker:0", 0, "restart-task", "exited with code 1"));
  fs::remove_all(dirs[0]);
  auto facts = cache.Read(dirs, kT0 + 4'000);
  EXPECT_EQ(cache.journals_read_last(), 1u);
  ASSERT_EQ(facts.size(), 3u);
  EXPECT_EQ(facts.back().job_id, "live-1");
  EXPECT_EQ(facts.back().failures_by_cause, (std::map<std::string, int64_t>{{"exit_code", 1}}));
}

}  // namespace
}  // namespace shoal::ui
