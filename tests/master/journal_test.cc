// The typed journal: every record kind keeps its JSON form, a state rebuilt from the journal
// equals the live one record kind by record kind, and journals written by af9654c still load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "common/journal.h"
#include "master/job_status_json.h"
#include "master/journal_records.h"
#include "master/journaled_state.h"
#include "master/placement.h"
#include "master/rendezvous.h"
#include "master/restart_coordinator.h"
#include "master/status_publisher.h"
#include "shoal/v1/shoal.pb.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

using ::testing::ElementsAre;

spec::JobSpec ParseSpec(const std::string& yaml) {
  auto spec = spec::ParseJobSpec(yaml, "job.yaml", "/tmp", /*sections=*/{});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// ---------------------------------------------------------------- JSON forms

TEST(JournalRecordsTest, KnownRecordsKeepTheirJsonForm) {
  // Lines as af9654c wrote them (time stamps aside): parsed and written again, unchanged.
  const char* lines[] = {
      R"({"job_id":"j","master":"127.0.0.1:1","name":"n","tasks":3,"type":"job_submitted"})",
      R"({"files":["/d/part-00000.parquet","/d/part-00001.parquet"],"location":"/d","type":"dataset_listed"})",
      R"({"rank":0,"task":"ps:0","to":"pending","type":"task_state"})",
      R"({"attempt":0,"from":"starting","pid":24000,"task":"worker:0","to":"running","type":"task_state"})",
      R"({"attempt":0,"exit_code":5,"from":"running","reason":"r","signal":0,"task":"ps:0","to":"failed","type":"task_state"})",
      R"({"attempt":1,"from":"failed","task":"ps:0","to":"pending","type":"task_state"})",
      R"({"action":"restart-task","attempt":0,"cause":"exited with code 5","delay_ms":200,"restart":1,"task":"ps:0","type":"failure_handled"})",
      R"({"backend":"local","nodes":[{"address":"127.0.0.1","cores":[1,2],"cpus":1.5,"for_task":"","gpu_count":0,"gpus":["0"],"gpus_from_agent":false,"memory_bytes":7,"name":"local"}],"type":"admitted"})",
      R"({"address":"127.0.0.1","gpus":[],"hostname":"vm","node":"local","ports":3,"type":"agent_registered"})",
      R"({"generation":1,"ranks":[{"address":"127.0.0.1","node":"local","port":28870,"rank":0,"task":"ps:0"}],"type":"rendezvous","world_size":1})",
      R"({"delay_ms":0,"generation":1,"reason":"x","restarts":1,"type":"group_restart_begun"})",
      R"({"generation":1,"type":"group_restarted","world_size":2})",
      R"({"task":"worker:1","type":"slot_left"})",
      R"({"task":"worker:1","type":"slot_rejoined"})",
      R"({"node":"worker.1","task":"worker:1","type":"slot_deferred"})",
      R"({"backend":"kubernetes","deferred":["worker.2"],"type":"allocated"})",
      R"({"reason":"","to":"running","type":"job_state"})",
      R"({"outcome":"succeeded","reason":"r","type":"outcome_decided"})",
      R"({"outcome":"succeeded","reason":"r","type":"job_finished"})",
      R"({"node":"local","seconds":3.0,"type":"agent_silent"})",
      R"({"attempt":2,"last_step":7,"silent_ms":1500,"task":"worker:0","type":"task_hung"})",
      R"({"node":"n1","ok":false,"reason":"r","type":"place_replacing"})",
      R"({"attempt":0,"epoch":0,"shard":3,"task":"worker:0","type":"shard_leased"})",
      R"({"metrics":{"accuracy":0.875,"loss":0.12},"model":"mlp","repository":"/srv/models","step":1200,"task":"worker:0","type":"model_published","version":7})",
      R"({"metrics":{},"model":"mlp","repository":"/srv/models","task":"worker:0","type":"model_published","version":8})",
  };
  for (const char* text : lines) {
    nlohmann::json line = nlohmann::json::parse(text);
    line["ts"] = 1796460031092;
    line["ts_us"] = 1796460031092681;
    auto entry = FromJson(line);
    ASSERT_TRUE(entry.ok()) << entry.status();
    EXPECT_EQ(ToJson(*entry), line) << text;
    EXPECT_EQ(entry->unix_ms(), 1796460031092);
  }
}

TEST(JournalRecordsTest, AnAllocatedRecordOfAnOlderShoalHasNoDeferredPlaces) {
  auto entry = FromJson(nlohmann::json::parse(R"({"type":"allocated","backend":"slurm"})"));
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_TRUE(std::holds_alternative<Allocated>(entry->record));
  EXPECT_EQ(std::get<Allocated>(entry->record).backend, "slurm");
  EXPECT_TRUE(std::get<Allocated>(entry->record).deferred.empty());
}

TEST(JournalRecordsTest, UnknownTypesAreKeptAndWrongFieldTypesAreDataLoss) {
  auto other = FromJson(nlohmann::json::parse(R"({"type":"restart_scheduled","task":"a:0"})"));
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(std::holds_alternative<OtherRecord>(other->record));
  EXPECT_EQ(TypeOf(other->record), "restart_scheduled");

  auto bad = FromJson(nlohmann::json::parse(R"({"type":"slot_left","task":7})"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("slot_left"));
  EXPECT_EQ(FromJson(nlohmann::json::array()).status().code(), absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------- live and replayed state

const char* kJob = R"(
name: typed
on_failure: elastic
max_restarts: 3
backoff: {initial: 0s, max: 0s}
dataset: {samples: 40, shard_size: 10, epochs: 2}
roles:
  ps:
    instances: 1
    untracked: true
    on_failure: restart-task
    command: ["/bin/true"]
  worker:
    instances: {min: 1, max: 2}
    command: ["/bin/true"]
)";

// A job driven as the master drives it, through the real RestartCoordinator: every record is
// applied live and kept as the journal's line.
class LiveJob : public RestartCoordinator::Host {
 public:
  explicit LiveJob(const spec::JobSpec& spec)
      : job(kJobId, spec), restarts(&job, this, &clock, std::chrono::milliseconds(0)) {}

  static constexpr const char* kJobId = "typed-20260101-000000-abcd";

  void Record(JournalRecord record) override {
    ts_us += 1000;
    JournalEntry entry{std::move(record), ts_us};
    ASSERT_TRUE(Apply(entry, job, RecordSource::kLive, clock.Now()).ok());
    kinds.insert(entry.record.index());
    lines.push_back(ToJson(entry));
  }
  void Transition(TaskRecord& task, TaskState to, const std::string& reason) override {
    if (auto record = TransitionRecord(task, to, reason)) Record(std::move(*record));
  }
  // The agent stops it at once.
  void StopTask(TaskRecord& task, std::chrono::milliseconds, const std::string& reason) override {
    if (task.state == TaskState::kPending || IsTerminal(task.state)) return;
    task.signal = 15;
    Transition(task, TaskState::kKilled, reason);
  }
  void Notice(const std::string&) override {}
  uint64_t PostAfter(std::chrono::milliseconds, std::function<void()> task) override {
    timers.push_back(std::move(task));
    return timers.size();
  }
  bool Ending() const override {
    return job.phase == JobPhase::kStopping || IsTerminal(job.phase);
  }
  std::optional<size_t> FormWorld(uint32_t generation) override {
    RendezvousInputs in;
    in.spec = &job.spec;
    in.job_id = kJobId;
    in.job_dir = "/jobs/typed";
    in.generation = generation;
    in.tasks = &job.tasks.tasks();
    in.placement = &placement;
    in.grants = &job.grants;
    in.node_addresses = &job.node_addresses;
    in.node_gpus = &job.node_gpus;
    in.slot_ports = ports.empty() ? &job.slot_ports : &ports;
    auto plan = BuildClusterPlan(in);
    Record(RendezvousRecord(plan));
    ports.clear();
    return plan.tasks.size();
  }
  void Relaunch(const std::string&) override {}
  bool PlaceReady(const TaskRecord&) override { return true; }

  void RunTimers() {
    auto due = std::move(timers);
    timers.clear();
    for (auto& t : due) t();
  }
  // Every pending task in the world starts and runs.
  void StartAll() {
    for (auto& t : job.tasks.tasks()) {
      if (t.state != TaskState::kPending || !t.in_world) continue;
      Transition(t, TaskState::kStarting, "");
      t.pid = ++next_pid;
      Transition(t, TaskState::kRunning, "");
    }
  }
  void Shards(std::vector<nlohmann::json> records) {
    for (auto& r : records) Record(ShardRecord{std::move(r)});
  }

  FakeClock clock;
  JournaledState job;
  RestartCoordinator restarts;
  std::vector<PlacedTask> placement;
  std::map<std::string, uint32_t> ports;
  std::vector<std::function<void()>> timers;
  std::vector<nlohmann::json> lines;
  std::set<size_t> kinds;
  int64_t ts_us = 1796460031000000;
  int next_pid = 100;
};

// What a recovering master must know, as one comparable text.
std::string Describe(JournaledState& s) {
  std::ostringstream out;
  out << "phase=" << JobPhaseName(s.phase) << " reason=" << s.phase_reason
      << " submitted=" << s.submitted << " finished=" << s.finished
      << " master=" << s.master_address << " rendezvous=" << s.rendezvous_done
      << " generation=" << s.generation << " group_restart=" << s.group_restart_in_progress
      << " delay=" << s.group_restart_delay.count()
      << " group_restarts=" << s.policy.group_restarts() << "\n";
  if (s.pending_outcome) {
    out << "outcome=" << JobPhaseName(s.pending_outcome->phase) << " "
        << s.pending_outcome->reason << "\n";
  }
  for (const auto& t : s.tasks.tasks()) {
    out << t.Key() << " " << TaskStateName(t.state) << " attempt=" << t.attempt
        << " rank=" << t.global_rank << " node=" << t.node << " pid=" << t.pid
        << " exit=" << t.exit_code << " signal=" << t.signal << " reason=" << t.reason
        << " restarts=" << t.restarts << " restart_pending=" << t.restart_pending
        << " in_world=" << t.in_world << " parked=" << s.policy.IsParked(t.Key())
        << " task_restarts=" << s.policy.task_restarts(t.Key()) << "\n";
  }
  for (const auto& g : s.grants) out << "grant " << g.name << " " << g.address << "\n";
  for (const auto& n : s.granted_nodes) out << "granted " << n << "\n";
  for (const auto& n : s.deferred_places) out << "deferred " << n << "\n";
  for (const auto& [n, a] : s.node_addresses) out << "address " << n << "=" << a << "\n";
  for (const auto& [n, g] : s.node_gpus) out << "gpus " << n << "=" << g.size() << "\n";
  for (const auto& [k, p] : s.slot_ports) out << "port " << k << "=" << p << "\n";
  for (const auto& f : s.failures) {
    out << "failure " << f.role << ":" << f.index << " " << f.attempt << " " << f.cause << " "
        << f.action << " " << f.restart << " " << f.unix_ms << "\n";
  }
  out << "failures_total=" << s.failures_total << "\n";
  if (s.last_publication) {
    out << "last_publication " << ToJson(JournalRecord(s.last_publication->record)).dump() << " "
        << s.last_publication->unix_ms << "\n";
  }
  if (s.shards) out << "shards " << s.shards->Snapshot().dump() << "\n";
  out << "outcome_of_tasks=" << (s.tasks.DecideOutcome() ? s.tasks.DecideOutcome()->reason : "")
      << "\n";
  return out.str();
}

TEST(JournaledStateTest, ReplayingEveryRecordKindRebuildsTheLiveState) {
  spec::JobSpec spec = ParseSpec(kJob);
  LiveJob live(spec);
  auto compare_with_replay = [&](const std::string& when) {
    JournaledState replayed(LiveJob::kJobId, spec);
    ASSERT_TRUE(Replay(live.lines, replayed, live.clock.Now()).ok()) << when;
    EXPECT_EQ(Describe(replayed), Describe(live.job)) << when;
  };

  live.Record(JobSubmitted{LiveJob::kJobId, "typed", live.job.tasks.tasks().size(), "h:1"});
  live.Record(DatasetListed{"/data/d", spec.dataset.files});
  for (auto& t : live.job.tasks.tasks()) {
    TaskStateChanged initial;
    initial.task = t.Key();
    initial.to = "pending";
    initial.rank = t.global_rank;
    live.Record(std::move(initial));
  }
  live.Record(Queued{"waiting for CPUs"});
  live.Record(JobStateChanged{"queued", "waiting for CPUs"});
  live.Record(Allocated{"slurm", {"n2"}});
  backends::NodeGrant grant;
  grant.name = "n1";
  grant.address = "10.0.0.1";
  grant.cpus = 3;
  live.Record(Admitted{"local", {grant}});
  auto placement = PlaceTasks(spec, live.job.tasks.tasks(), live.job.grants);
  ASSERT_TRUE(placement.ok()) << placement.status();
  live.placement = *placement;
  live.Record(JobStateChanged{"starting", "waiting for agents to register"});
  live.Record(AgentRefused{"n9", "node 'n9' is not expected or already registered"});
  live.Record(AgentRegistered{"n1", "host1", "10.0.0.1", {"0"}, 3});
  auto ports = AssignTaskPorts(live.placement, {{"n1", {20000, 20001, 20002}}});
  ASSERT_TRUE(ports.ok());
  live.ports = *ports;
  live.FormWorld(0);
  live.StartAll();
  live.Record(JobStateChanged{"running", ""});
  live.Record(SidecarStarted{"tensorboard", "http://h:6006"});
  live.Record(SidecarFailed{"tensorboard", "no tensorboard"});
  live.Record(AgentNotice{"n1", "no GPUs"});
  compare_with_replay("running");

  // Shards: leased, one done.
  std::vector<nlohmann::json> records;
  ASSERT_TRUE(live.job.shards->Lease("worker:0", 0, 0, true, live.clock.Now(), &records).ok());
  ASSERT_TRUE(live.job.shards->Lease("worker:1", 0, 0, true, live.clock.Now(), &records).ok());
  ASSERT_TRUE(live.job.shards->Done("worker:0", 0, 0, 0, 5, live.clock.Now(), &records).ok());
  live.Shards(std::move(records));
  live.Record(CheckpointReported{"worker:0", 5});
  live.Record(ModelPublished{"worker:0", "mlp", 1, "/models", 5, {{"loss", 0.5}}});
  live.Record(ModelPublished{"worker:0", "mlp", 2, "/models", std::nullopt, {}});

  // ps fails alone: restart-task.
  TaskRecord* ps = live.job.tasks.Find("ps", 0);
  ps->exit_code = 5;
  live.restarts.HandleTaskFailure(*ps, "exited with code 5");
  compare_with_replay("ps restart scheduled");
  live.RunTimers();
  live.StartAll();

  // worker:1 hangs and is lost: elastic shrink, a new generation of one worker.
  TaskRecord* w1 = live.job.tasks.Find("worker", 1);
  live.Record(TaskHung{"worker:1", 0, 7, 1500});
  w1->signal = 9;
  live.restarts.HandleTaskFailure(*w1, "hung: no progress for 1.5s after step 7");
  compare_with_replay("group restart begun");
  live.RunTimers();
  live.StartAll();
  live.Record(ResumedReported{"worker:0", 1, 5});
  compare_with_replay("shrunk");

  // The slot's backoff is over: the group grows back (no checkpoint section: at once).
  live.clock.Advance(std::chrono::seconds(1));
  live.restarts.CheckGrowth();
  live.RunTimers();
  live.StartAll();
  compare_with_replay("grown");

  // The place's agent goes and comes back; a recovering master takes over.
  live.Record(AgentLeaving{"n1", "SIGTERM"});
  live.Record(master::AgentDisconnected{"n1"});
  live.Record(AgentSilent{"n1", 3.0});
  live.Record(PlaceLost{"n1", "node down"});
  live.Record(PlaceReplacing{"n1", true, ""});
  live.Record(MasterRecovered{"h:2", 4242, live.job.generation, "running"});
  live.Record(ReattachFailed{"no such allocation"});
  live.Record(AgentReattached{"n1", 3});
  compare_with_replay("recovered");

  // The end.
  live.Record(KillRequested{"killed by the user"});
  live.Record(CancelledOutside{"scancel"});
  live.Record(AdmissionRefused{"cannot be admitted: too big"});
  live.Record(OutcomeDecided{"killed", "killed by the user"});
  live.Record(JobStateChanged{"stopping", "killed by the user"});
  for (auto& t : live.job.tasks.tasks()) {
    live.StopTask(t, std::chrono::milliseconds(0), "stopped: killed by the user");
  }
  // A slot the job started without (its place deferred) would go out of the world like this;
  // here only to replay the record.
  live.Record(SlotDeferred{"worker:1", "n2"});
  live.Record(JobFinished{"killed", "killed by the user"});
  live.Record(JobStateChanged{"killed", "killed by the user"});
  compare_with_replay("finished");

  // Every record kind the master writes went through the journal (OtherRecord is for readers).
  std::set<size_t> expected;
  for (size_t i = 0; i < std::variant_size_v<JournalRecord>; ++i) expected.insert(i);
  expected.erase(JournalRecord(OtherRecord{}).index());
  EXPECT_EQ(live.kinds, expected);
}

TEST(JournaledStateTest, AnotherJobsJournalIsRefused) {
  spec::JobSpec spec = ParseSpec(kJob);
  JournaledState state("mine", spec);
  nlohmann::json line = ToJson(JournalRecord(JobSubmitted{"theirs", "x", 3, "h:1"}));
  auto st = Replay({line}, state, Clock::TimePoint{});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("belongs to job theirs, not mine"));
  JournaledState empty("mine", spec);
  EXPECT_EQ(Replay({}, empty, Clock::TimePoint{}).code(), absl::StatusCode::kDataLoss);
}

// A Parquet dataset's shards come from submit.json (spec.dataset.files); a journal that listed
// other files numbered its shards differently, and its shard records would mean other files.
TEST(JournaledStateTest, AJournalListingOtherParquetFilesIsRefused) {
  spec::JobSpec spec = ParseSpec(
      "name: p\ndataset: {parquet: /d}\nroles:\n  worker: {command: [x]}\n");
  spec.dataset.files = {"/d/part-00000.parquet", "/d/part-00001.parquet"};
  auto journal = [&](std::vector<std::string> files) {
    return std::vector<nlohmann::json>{
        ToJson(JournalRecord(JobSubmitted{"mine", "p", 1, "h:1"})),
        ToJson(JournalRecord(DatasetListed{"/d", std::move(files)}))};
  };
  JournaledState same("mine", spec);
  EXPECT_TRUE(Replay(journal(spec.dataset.files), same, Clock::TimePoint{}).ok());
  JournaledState other("mine", spec);
  auto st = Replay(journal({"/d/part-00001.parquet", "/d/part-00002.parquet"}), other,
                   Clock::TimePoint{});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(),
              ::testing::HasSubstr("the journal's dataset_listed (2 files of /d) differs from "
                                   "the job's submit.json (2 files)"));
  spec::JobSpec without = ParseSpec("name: p\nroles:\n  worker: {command: [x]}\n");
  JournaledState none("mine", without);
  EXPECT_EQ(Replay(journal({"/d/a.parquet"}), none, Clock::TimePoint{}).code(),
            absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------- af9654c's journals

std::string Fixture(const std::string& name) {
  return std::string(SHOAL_SOURCE_DIR) + "/tests/master/testdata/journal_af9654c/" + name;
}

// A job run by af9654c (tests/master/testdata/journal_af9654c/spec.yaml: an untracked ps that
// fails once under restart-task, an elastic worker role that shrinks when worker:1 fails and
// grows back). Its journal loads, and the status built from the recovered state is the one
// that master published in status.json.
TEST(JournalCompatibilityTest, AJournalOfAf9654cLoadsToTheStatusItPublished) {
  auto spec = spec::ParseJobSpecFile(Fixture("spec.yaml"), /*sections=*/{});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto lines = Journal::ReadAll(Fixture("events.jsonl"));
  ASSERT_TRUE(lines.ok()) << lines.status();
  std::ifstream status_file(Fixture("status.json"));
  nlohmann::json published = nlohmann::json::parse(status_file);

  JournaledState state(published["job_id"].get<std::string>(), *spec);
  ASSERT_TRUE(Replay(*lines, state, Clock::TimePoint{}).ok());
  EXPECT_TRUE(state.finished);
  EXPECT_EQ(state.master_address, (*lines)[0]["master"].get<std::string>());
  nlohmann::json recovered = JobStatusToJson(BuildJobStatus(state, {}));
  for (const char* key : {"state", "reason", "generation", "group_restarts", "failures",
                          "failures_total", "job_id"}) {
    EXPECT_EQ(recovered[key], published[key]) << key;
  }
  ASSERT_EQ(recovered["tasks"].size(), published["tasks"].size());
  for (size_t i = 0; i < published["tasks"].size(); ++i) {
    for (const char* key : {"task", "state", "node", "pid", "rank", "reason", "restarts",
                            "exit_code", "signal", "in_world"}) {
      EXPECT_EQ(recovered["tasks"][i][key], published["tasks"][i][key])
          << published["tasks"][i]["task"] << " " << key;
    }
  }
}

// The same journal cut where a master could have died: after the elastic shrink, before the
// group grew back.
TEST(JournalCompatibilityTest, AJournalOfAf9654cCutMidRunLoads) {
  auto spec = spec::ParseJobSpecFile(Fixture("spec.yaml"), /*sections=*/{});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto lines = Journal::ReadAll(Fixture("events.jsonl"));
  ASSERT_TRUE(lines.ok());
  std::vector<nlohmann::json> prefix;
  for (const auto& line : *lines) {
    prefix.push_back(line);
    if (line["type"] == "group_restarted") break;
  }
  JournaledState state((*lines)[0]["job_id"].get<std::string>(), *spec);
  ASSERT_TRUE(Replay(prefix, state, Clock::TimePoint{}).ok());
  EXPECT_EQ(state.phase, JobPhase::kRunning);
  EXPECT_FALSE(state.finished);
  EXPECT_EQ(state.generation, 1u);
  EXPECT_FALSE(state.group_restart_in_progress);
  EXPECT_EQ(state.policy.group_restarts(), 1u);
  EXPECT_TRUE(state.policy.IsParked("worker:1"));
  EXPECT_EQ(state.policy.task_restarts("ps:0"), 1u);
  const TaskRecord* w1 = state.tasks.Find("worker", 1);
  EXPECT_EQ(w1->state, TaskState::kFailed);
  EXPECT_FALSE(w1->in_world);
  EXPECT_TRUE(w1->restart_pending);
  EXPECT_EQ(state.tasks.Find("worker", 0)->state, TaskState::kPending);
  EXPECT_EQ(state.tasks.Find("worker", 0)->attempt, 1u);
  EXPECT_EQ(state.tasks.Find("ps", 0)->state, TaskState::kStarting);
  EXPECT_THAT(state.slot_ports, ::testing::SizeIs(3));
  EXPECT_EQ(state.grants.size(), 1u);
  EXPECT_EQ(state.grants[0].cpus, 1.5);
  ASSERT_EQ(state.failures.size(), 2u);
  EXPECT_EQ(state.failures[1].action, "shrink-group");
}

}  // namespace
}  // namespace shoal::master
