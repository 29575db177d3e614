#include "master/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>

#include "absl/strings/str_cat.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

using ::testing::ElementsAre;

// Answers Acquire from a script: each entry is the next answer.
class ScriptedBackend final : public backends::Backend {
 public:
  std::string Name() const override { return "scripted"; }
  absl::StatusOr<std::vector<backends::NodeGrant>> Acquire(const spec::JobSpec&,
                                                           const std::string&) override {
    auto answer = answers.front();
    if (answers.size() > 1) answers.pop_front();
    return answer;
  }
  absl::Status StartAgents(const backends::AgentStartOptions&) override {
    ++agents_started;
    return start_agents;
  }
  void SetPlaceLostCallback(PlaceLostCallback) override {}
  void TerminatePlace(const std::string&) override {}
  void Release() override {}

  std::deque<absl::StatusOr<std::vector<backends::NodeGrant>>> answers;
  absl::Status start_agents;
  int agents_started = 0;
};

class RecordingHost : public Admission::Host {
 public:
  explicit RecordingHost(JournaledState* job) : job_(job) {}
  void Record(JournalRecord record) override {
    JournalEntry entry{record, 0};
    ASSERT_TRUE(Apply(entry, *job_, RecordSource::kLive, Clock::TimePoint{}).ok());
    records.push_back(TypeOf(record));
  }
  void SetPhase(JobPhase phase, const std::string& reason) override {
    Record(JobStateChanged{JobPhaseName(phase), reason});
  }
  void BeginStopping(JobPhase outcome, const std::string& reason) override {
    stopped = std::string(JobPhaseName(outcome)) + ": " + reason;
  }
  bool Ending() const override { return !stopped.empty(); }
  uint64_t PostAfter(std::chrono::milliseconds, std::function<void()> task) override {
    timers.push_back(std::move(task));
    return timers.size();
  }
  void CancelTimer(uint64_t id) override {
    if (id > 0 && id <= timers.size()) timers[id - 1] = nullptr;
  }
  bool Registered(const std::string& node) override { return registered.count(node) > 0; }
  void AgentsStarted() override { ++agents_started; }
  backends::AgentStartOptions AgentStartOptions() const override { return {}; }
  void RendezvousMayComplete() override { ++rendezvous_checks; }

  // Runs the timers set so far (not those they set).
  void RunTimers() {
    auto due = std::move(timers);
    timers.clear();
    for (auto& t : due) {
      if (t) t();
    }
  }

  JournaledState* job_;
  std::vector<std::string> records;
  std::vector<std::function<void()>> timers;
  std::set<std::string> registered;
  std::string stopped;
  int agents_started = 0;
  int rendezvous_checks = 0;
};

spec::JobSpec TwoWorkers() {
  auto spec = spec::ParseJobSpec(R"(
name: admitted
roles:
  worker:
    instances: 2
    command: ["/bin/true"]
)",
                                 "job.yaml", "/tmp", /*sections=*/{});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

backends::NodeGrant Grant(const std::string& name, double cpus) {
  backends::NodeGrant g;
  g.name = name;
  g.address = "127.0.0.1";
  g.cpus = cpus;
  g.memory_bytes = uint64_t{1} << 30;
  return g;
}

TEST(AdmissionTest, WaitsQueuedWhileTheBackendIsBusyThenStartsTheAgents) {
  spec::JobSpec spec = TwoWorkers();
  JournaledState job("a-1", spec);
  ScriptedBackend backend;
  backend.answers = {absl::UnavailableError("waiting for 2 CPUs"),
                     absl::UnavailableError("waiting for 2 CPUs"),
                     std::vector<backends::NodeGrant>{Grant("n1", 2)}};
  RecordingHost host(&job);
  Admission admission(&job, &backend, &host, {"a-1", std::chrono::milliseconds(1000),
                                             std::chrono::milliseconds(30000)});
  admission.TryAdmit();
  EXPECT_EQ(job.phase, JobPhase::kQueued);
  EXPECT_EQ(job.phase_reason, "waiting for 2 CPUs");
  host.RunTimers();  // the same reason again: journaled once
  EXPECT_THAT(host.records, ElementsAre("queued", "job_state"));
  host.RunTimers();
  EXPECT_THAT(host.records, ElementsAre("queued", "job_state", "admitted", "job_state"));
  EXPECT_EQ(job.phase, JobPhase::kStarting);
  EXPECT_EQ(job.grants.size(), 1u);
  EXPECT_EQ(admission.placement().size(), 2u);
  EXPECT_EQ(backend.agents_started, 1);
  EXPECT_EQ(host.agents_started, 1);

  // n1's agent never registers: the job fails, naming it.
  host.RunTimers();
  EXPECT_EQ(host.stopped, "failed: agents on n1 did not register within 30.0s");
}

TEST(AdmissionTest, ThousandsOfMissingAgentsAreNamedBrieflyInTheReason) {
  // A 1,000-place job whose agents never register (kwok's fake nodes run nothing): the
  // reason, journaled and shown by status and the client, names a few and counts the rest.
  auto spec = spec::ParseJobSpec(R"(
name: wide
roles:
  worker:
    instances: 1000
    command: ["/bin/true"]
)",
                                 "job.yaml", "/tmp", /*sections=*/{});
  ASSERT_TRUE(spec.ok()) << spec.status();
  JournaledState job("a-wide", *spec);
  ScriptedBackend backend;
  std::vector<backends::NodeGrant> grants;
  for (int i = 0; i < 1000; ++i) grants.push_back(Grant(absl::StrCat("worker.", i), 1));
  backend.answers = {grants};
  RecordingHost host(&job);
  host.registered = {"worker.0", "worker.2"};
  Admission admission(&job, &backend, &host, {"a-wide", std::chrono::milliseconds(1000),
                                             std::chrono::milliseconds(30000)});
  admission.TryAdmit();
  host.RunTimers();
  EXPECT_EQ(host.stopped,
            "failed: agents on worker.1, worker.3, worker.4, worker.5, worker.6, worker.7, "
            "worker.8, worker.9, worker.10, worker.11 and 988 more did not register within "
            "30.0s");
}

TEST(AdmissionTest, ARefusalOrATaskThatFitsNowhereFailsTheJob) {
  spec::JobSpec spec = TwoWorkers();
  {
    JournaledState job("a-2", spec);
    ScriptedBackend backend;
    backend.answers = {absl::InvalidArgumentError("no partition 'gpu'")};
    RecordingHost host(&job);
    Admission admission(&job, &backend, &host, {"a-2"});
    admission.TryAdmit();
    EXPECT_EQ(host.stopped, "failed: cannot be admitted: no partition 'gpu'");
    EXPECT_THAT(host.records, ElementsAre("admission_refused"));
  }
  {
    JournaledState job("a-3", spec);
    ScriptedBackend backend;
    backend.answers = {std::vector<backends::NodeGrant>{Grant("n1", 0.5)}};
    RecordingHost host(&job);
    Admission admission(&job, &backend, &host, {"a-3"});
    admission.TryAdmit();
    EXPECT_THAT(host.stopped, ::testing::HasSubstr("does not fit"));
    EXPECT_TRUE(host.records.empty());  // nothing admitted
    EXPECT_EQ(backend.agents_started, 0);
  }
}

TEST(AdmissionTest, ABatchSchedulerQueuesAllocatesOrCancels) {
  spec::JobSpec spec = TwoWorkers();
  JournaledState job("a-4", spec);
  ScriptedBackend backend;
  backend.answers = {std::vector<backends::NodeGrant>{Grant("n1", 2)}};
  RecordingHost host(&job);
  Admission admission(&job, &backend, &host, {"a-4"});
  admission.TryAdmit();
  using Kind = backends::Backend::AllocationEvent::Kind;
  admission.OnAllocationEvent({Kind::kQueued, "Resources"});
  EXPECT_EQ(job.phase, JobPhase::kQueued);
  host.RunTimers();  // the registration deadline was cancelled while queued
  EXPECT_EQ(host.stopped, "");
  admission.OnAllocationEvent({Kind::kAllocated, ""});
  EXPECT_EQ(job.phase, JobPhase::kStarting);
  admission.OnAllocationEvent({Kind::kCancelled, "scancel"});
  EXPECT_EQ(host.stopped, "killed: scancel");
  EXPECT_EQ(host.records.back(), "cancelled_outside");
}

// A backend with one place per task names the places that wait for room (elastic slots
// beyond min): the registration deadline does not wait for them.
TEST(AdmissionTest, DeferredPlacesAreNotWaitedForByTheRegistrationDeadline) {
  spec::JobSpec spec = TwoWorkers();
  JournaledState job("a-5", spec);
  ScriptedBackend backend;
  backend.answers = {std::vector<backends::NodeGrant>{Grant("w0", 1), Grant("w1", 1),
                                                      Grant("w2", 1)}};
  RecordingHost host(&job);
  Admission admission(&job, &backend, &host, {"a-5"});
  admission.TryAdmit();
  using Kind = backends::Backend::AllocationEvent::Kind;
  admission.OnAllocationEvent({Kind::kAllocated, "", {"w2"}});
  EXPECT_EQ(host.records.back(), "allocated");
  EXPECT_EQ(job.deferred_places, std::set<std::string>{"w2"});
  EXPECT_EQ(host.rendezvous_checks, 1);
  host.registered = {"w0"};
  host.RunTimers();
  EXPECT_EQ(host.stopped, "failed: agents on w1 did not register within 30.0s");
}

}  // namespace
}  // namespace shoal::master
