// Elastic jobs on a backend with one place per task (Kubernetes): a slot comes back only once
// its place has an agent again, and a job may start before some of its places have room.
// A real Master on loopback; the backend grants places and starts nothing, so the test plays
// the agents itself over the real protocol. Time is a fake clock's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "common/clock.h"
#include "common/journal.h"
#include "master/journaled_state.h"
#include "master/master.h"
#include "shoal/v1/shoal.grpc.pb.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

using namespace std::chrono_literals;

constexpr int kPlaces = 3;

// One place per task, worker.0 .. worker.2, like the Kubernetes backend's pods. Lost places are
// reported by the test; replacing one starts nothing (the test registers the new agent).
class PlacePerTaskBackend final : public backends::Backend {
 public:
  std::string Name() const override { return "test"; }
  absl::StatusOr<std::vector<backends::NodeGrant>> Acquire(const spec::JobSpec&,
                                                           const std::string&) override {
    std::vector<backends::NodeGrant> grants;
    for (int i = 0; i < kPlaces; ++i) {
      backends::NodeGrant g;
      g.name = absl::StrCat("worker.", i);
      g.address = "127.0.0.1";
      g.cpus = 1;
      g.memory_bytes = 1ull << 30;
      g.for_task = absl::StrCat("worker:", i);
      grants.push_back(g);
    }
    return grants;
  }
  absl::Status StartAgents(const backends::AgentStartOptions&) override {
    return absl::OkStatus();
  }
  void SetPlaceLostCallback(PlaceLostCallback callback) override {
    std::lock_guard<std::mutex> lock(mu_);
    place_lost_ = std::move(callback);
  }
  void SetAllocationEventCallback(AllocationEventCallback callback) override {
    std::lock_guard<std::mutex> lock(mu_);
    allocation_ = std::move(callback);
  }
  void TerminatePlace(const std::string&) override {}
  void Release() override {}
  absl::Status ReplacePlace(const std::string&, const backends::AgentStartOptions&) override {
    return absl::OkStatus();
  }

  void LosePlace(const std::string& node, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    place_lost_(node, why);
  }
  void Allocate(std::vector<std::string> deferred) {
    std::lock_guard<std::mutex> lock(mu_);
    allocation_({AllocationEvent::kAllocated, "", std::move(deferred)});
  }

 private:
  std::mutex mu_;
  PlaceLostCallback place_lost_;
  AllocationEventCallback allocation_;
};

// Plays one agent: registers, starts what it is told to launch, reports what it is told to
// stop as stopped.
class FakeAgent {
 public:
  FakeAgent(v1::Master::Stub* stub, std::string node, uint32_t port)
      : node_(std::move(node)) {
    ctx_.AddMetadata("authorization", "Bearer right-token");
    stream_ = stub->AgentSession(&ctx_);
    v1::AgentMessage reg;
    reg.mutable_register_()->set_version(v1::PROTOCOL_VERSION_CURRENT);
    reg.mutable_register_()->set_node_name(node_);
    reg.mutable_register_()->mutable_inventory()->set_address("127.0.0.1");
    reg.mutable_register_()->add_free_ports(port);
    stream_->Write(reg);
    v1::MasterMessage reply;
    if (stream_->Read(&reply)) {
      accepted_ = reply.register_reply().accepted();
      reason_ = reply.register_reply().reason();
    }
    if (accepted_) reader_ = std::thread([this] { Serve(); });
  }
  ~FakeAgent() {
    ctx_.TryCancel();
    if (reader_.joinable()) reader_.join();
    stream_->Finish();
  }
  bool accepted() const { return accepted_; }
  const std::string& reason() const { return reason_; }

  // Its task `key` exits by itself with `code`.
  void Exit(const std::string& key, int code) {
    v1::AgentMessage exited;
    {
      std::lock_guard<std::mutex> lock(running_mu_);
      auto it = running_.find(key);
      if (it == running_.end()) return;
      *exited.mutable_task_exited()->mutable_task() = it->second;
      running_.erase(it);
    }
    exited.mutable_task_exited()->set_exit_code(code);
    Write(exited);
  }
  bool Runs(const std::string& key) {
    std::lock_guard<std::mutex> lock(running_mu_);
    return running_.count(key) > 0;
  }
  // Waits, up to 10 s, for the agent to run attempt `attempt` (or a later one) of `key`.
  bool RunsAttempt(const std::string& key, uint32_t attempt) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(running_mu_);
        auto it = running_.find(key);
        if (it != running_.end() && it->second.attempt() >= attempt) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  // The task `key` reports a checkpoint through the SDK.
  void Checkpoint(const std::string& key, int64_t step) {
    v1::AgentMessage m;
    {
      std::lock_guard<std::mutex> lock(running_mu_);
      auto it = running_.find(key);
      if (it == running_.end()) return;
      *m.mutable_sdk()->mutable_task() = it->second;
    }
    m.mutable_sdk()->set_json(absl::StrCat(R"({"op":"checkpointed","step":)", step, "}"));
    Write(m);
  }

  void Notice(const std::string& text) {
    v1::AgentMessage m;
    m.set_notice(text);
    Write(m);
  }

 private:
  void Write(const v1::AgentMessage& m) {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_->Write(m);
  }
  void Serve() {
    v1::MasterMessage m;
    while (stream_->Read(&m)) {
      if (m.has_launch()) {
        {
          std::lock_guard<std::mutex> lock(running_mu_);
          running_[absl::StrCat(m.launch().task().role(), ":", m.launch().task().index())] =
              m.launch().task();
        }
        v1::AgentMessage started;
        *started.mutable_task_started()->mutable_task() = m.launch().task();
        started.mutable_task_started()->set_pid(4242);
        Write(started);
      } else if (m.has_stop()) {
        for (const auto& id : m.stop().tasks()) {
          v1::AgentMessage exited;
          {
            std::lock_guard<std::mutex> lock(running_mu_);
            auto it = running_.find(absl::StrCat(id.role(), ":", id.index()));
            if (it == running_.end()) continue;
            *exited.mutable_task_exited()->mutable_task() = it->second;
            running_.erase(it);
          }
          exited.mutable_task_exited()->set_signal(15);
          exited.mutable_task_exited()->set_stopped_by_agent(true);
          Write(exited);
        }
      }
    }
  }

  std::string node_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::MasterMessage>> stream_;
  bool accepted_ = false;
  std::string reason_;
  std::mutex write_mu_;
  std::mutex running_mu_;
  std::map<std::string, v1::TaskId> running_;
  std::thread reader_;
};

class ElasticPlacesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-elastic-places-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::string checkpoints = Checkpoints() ? "checkpoint: {dir: /tmp}\n" : "";
    auto parsed = spec::ParseJobSpec(checkpoints + R"(
name: edl
on_failure: elastic
max_restarts: 10
backoff: {initial: 5s, max: 5s}
roles:
  worker:
    instances: {min: 2, max: 3}
    command: ["/bin/true"]
)",
                                     "job.yaml", "/tmp", /*sections=*/{});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    spec_ = *parsed;
    MasterOptions options;
    options.job_id = "edl-test";
    options.job_dir = dir_.string();
    options.spec = spec_;
    options.token = "right-token";
    options.clock = &clock_;
    // Heartbeats are not what these tests are about: no agent is ever silent.
    options.heartbeat_interval = std::chrono::hours(1);
    auto backend = std::make_unique<PlacePerTaskBackend>();
    backend_ = backend.get();
    auto m = Master::Create(options, std::move(backend));
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = std::move(*m);
    ASSERT_TRUE(master_->Start().ok());
    stub_ = v1::Master::NewStub(
        grpc::CreateChannel(master_->address(), grpc::InsecureChannelCredentials()));
  }

  // Whether the job keeps checkpoints (growth then waits for the next one).
  virtual bool Checkpoints() const { return false; }

  void TearDown() override {
    if (master_) master_->Kill("test over");
    agents_.clear();
    master_.reset();
    std::filesystem::remove_all(dir_);
  }

  FakeAgent* StartAgent(int place) {
    agents_[place] = std::make_unique<FakeAgent>(stub_.get(), absl::StrCat("worker.", place),
                                                 23456 + place);
    return agents_[place].get();
  }

  std::vector<nlohmann::json> Events(const std::string& type) {
    std::vector<nlohmann::json> out;
    auto all = Journal::ReadAll((dir_ / "events.jsonl").string());
    if (!all.ok()) return out;
    for (auto& r : *all) {
      if (r.value("type", "") == type) out.push_back(r);
    }
    return out;
  }

  // Waits, up to 20 s of real time, for the journal to hold a record for which `match` holds.
  bool JournalGets(const std::string& type,
                   std::function<bool(const nlohmann::json&)> match = nullptr) {
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& r : Events(type)) {
        if (!match || match(r)) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  bool GroupRestarted(uint32_t generation, uint64_t world_size) {
    return JournalGets("group_restarted", [&](const nlohmann::json& r) {
      return r.value("generation", 0u) == generation && r.value("world_size", 0u) == world_size;
    });
  }
  // Every timer of the master's loop that is due now has run: the loop runs due timers before
  // the messages that arrived with them, and a notice sent now comes back in the journal.
  void LoopCaughtUp() {
    std::string text = absl::StrCat("sync ", ++syncs_);
    agents_.begin()->second->Notice(text);
    ASSERT_TRUE(JournalGets("notice", [&](const nlohmann::json& r) {
      return r.value("message", "") == text;
    }));
  }

  FakeClock clock_;
  std::filesystem::path dir_;
  spec::JobSpec spec_;
  PlacePerTaskBackend* backend_ = nullptr;
  std::unique_ptr<Master> master_;
  std::unique_ptr<v1::Master::Stub> stub_;
  std::map<int, std::unique_ptr<FakeAgent>> agents_;
  int syncs_ = 0;
};

// A preempted pod's replacement may wait long for room. Re-forming the group with its slot
// before its agent registers would restart the survivors into a rendezvous that waits for it:
// the elastic job would stall like a fixed-size one.
TEST_F(ElasticPlacesTest, GrowthWaitsForTheLostPlacesNewAgent) {
  for (int i = 0; i < kPlaces; ++i) ASSERT_TRUE(StartAgent(i)->accepted());
  ASSERT_TRUE(JournalGets("job_state", [](const auto& r) { return r["to"] == "running"; }));

  backend_->LosePlace("worker.2", "preempted");
  ASSERT_TRUE(JournalGets("place_replacing", [](const auto& r) { return r["ok"] == true; }));
  agents_.erase(2);  // the pod is gone
  ASSERT_TRUE(GroupRestarted(1, 2));

  // The slot's backoff has passed long ago, but its place has no agent yet.
  clock_.Advance(60s);
  LoopCaughtUp();
  EXPECT_EQ(Events("group_restart_begun").size(), 1u)
      << "the group re-formed before worker.2's new agent registered";

  ASSERT_TRUE(StartAgent(2)->accepted()) << agents_[2]->reason();
  ASSERT_TRUE(GroupRestarted(2, 3));
  auto begun = Events("group_restart_begun");
  ASSERT_EQ(begun.size(), 2u);
  EXPECT_NE(begun[1].value("reason", "").find("capacity is back"), std::string::npos)
      << begun[1].dump();
}

class ElasticPlacesWithCheckpointsTest : public ElasticPlacesTest {
 protected:
  bool Checkpoints() const override { return true; }
};

// With checkpoints growth happens at the checkpoint after the slot is back: not at one while
// its place has no agent, and at the first one after its new agent registered.
TEST_F(ElasticPlacesWithCheckpointsTest, GrowthAtACheckpointWaitsForTheLostPlacesNewAgent) {
  for (int i = 0; i < kPlaces; ++i) ASSERT_TRUE(StartAgent(i)->accepted());
  ASSERT_TRUE(JournalGets("job_state", [](const auto& r) { return r["to"] == "running"; }));

  backend_->LosePlace("worker.2", "preempted");
  ASSERT_TRUE(JournalGets("place_replacing", [](const auto& r) { return r["ok"] == true; }));
  agents_.erase(2);
  ASSERT_TRUE(GroupRestarted(1, 2));
  ASSERT_TRUE(agents_[0]->RunsAttempt("worker:0", 1));

  clock_.Advance(60s);
  LoopCaughtUp();
  agents_[0]->Checkpoint("worker:0", 100);
  ASSERT_TRUE(JournalGets("checkpoint", [](const auto& r) { return r["step"] == 100; }));
  LoopCaughtUp();
  EXPECT_EQ(Events("group_restart_begun").size(), 1u)
      << "the group re-formed at a checkpoint before worker.2's new agent registered";

  ASSERT_TRUE(StartAgent(2)->accepted()) << agents_[2]->reason();
  LoopCaughtUp();
  EXPECT_EQ(Events("group_restart_begun").size(), 1u) << "grew before the next checkpoint";
  agents_[0]->Checkpoint("worker:0", 200);
  ASSERT_TRUE(GroupRestarted(2, 3));
}

// The backend granted worker.2 but has no room for it yet: the job starts with the two others,
// and worker.2 joins when its agent registers. Never a failure, and a new master replaying the
// journal sees the same.
TEST_F(ElasticPlacesTest, AJobStartsWithoutItsDeferredPlaceAndGrowsWhenItsAgentComes) {
  ASSERT_TRUE(JournalGets("admitted"));
  backend_->Allocate({"worker.2"});
  ASSERT_TRUE(JournalGets("allocated"));
  ASSERT_TRUE(StartAgent(0)->accepted());
  ASSERT_TRUE(StartAgent(1)->accepted());
  ASSERT_TRUE(JournalGets("rendezvous"));
  EXPECT_EQ(Events("rendezvous")[0].value("world_size", 0u), 2u);
  ASSERT_TRUE(JournalGets("job_state", [](const auto& r) { return r["to"] == "running"; }));
  ASSERT_TRUE(JournalGets("slot_deferred"));
  EXPECT_TRUE(Events("failure_handled").empty());

  {
    // Status is published at most every 50 ms of the master's clock.
    std::string reason;
    bool in_world = true;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (reason.empty() && std::chrono::steady_clock::now() < deadline) {
      v1::JobStatus status;
      master_->FillStatus(&status);
      for (const auto& t : status.tasks()) {
        if (t.task().index() != 2) continue;
        reason = t.reason();
        in_world = t.in_world();
      }
      clock_.Advance(100ms);
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_EQ(reason, "waiting for room in the cluster; the job started without it");
    EXPECT_FALSE(in_world);
  }
  {
    // What a recovering master rebuilds from the journal.
    auto lines = Journal::ReadAll((dir_ / "events.jsonl").string());
    ASSERT_TRUE(lines.ok());
    JournaledState replayed("edl-test", spec_);
    ASSERT_TRUE(Replay(*lines, replayed, clock_.Now()).ok());
    EXPECT_EQ(replayed.deferred_places, std::set<std::string>{"worker.2"});
    const TaskRecord* w2 = replayed.tasks.Find("worker", 2);
    EXPECT_FALSE(w2->in_world);
    EXPECT_EQ(w2->node, "worker.2");
    EXPECT_TRUE(replayed.policy.IsParked("worker:2"));
    EXPECT_EQ(replayed.failures_total, 0u);
    EXPECT_EQ(replayed.policy.group_restarts(), 0u);
    EXPECT_FALSE(replayed.tasks.DecideOutcome().has_value());
  }

  ASSERT_TRUE(StartAgent(2)->accepted()) << agents_[2]->reason();
  ASSERT_TRUE(GroupRestarted(1, 3));
  EXPECT_TRUE(Events("failure_handled").empty());
  auto ranks = Events("rendezvous").back()["ranks"];
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2]["task"], "worker:2");
  EXPECT_EQ(ranks[2]["port"], 23458);  // the port its own agent offered
}

// The deferred place's pod is lost before it ever got room: the job is not failed (it never
// needed that agent to start), and the place is asked for again once the job runs, since its
// slot is parked there.
TEST_F(ElasticPlacesTest, ADeferredPlaceLostBeforeItsAgentCameIsReplaced) {
  ASSERT_TRUE(JournalGets("admitted"));
  backend_->Allocate({"worker.2"});
  ASSERT_TRUE(JournalGets("allocated"));
  backend_->LosePlace("worker.2", "preempted");
  ASSERT_TRUE(JournalGets("place_lost"));
  ASSERT_TRUE(StartAgent(0)->accepted());
  ASSERT_TRUE(StartAgent(1)->accepted());
  ASSERT_TRUE(JournalGets("job_state", [](const auto& r) { return r["to"] == "running"; }));
  EXPECT_TRUE(Events("outcome_decided").empty()) << Events("outcome_decided")[0].dump();
  ASSERT_TRUE(JournalGets("place_replacing", [](const auto& r) {
    return r["node"] == "worker.2" && r["ok"] == true;
  }));
  ASSERT_TRUE(StartAgent(2)->accepted()) << agents_[2]->reason();
  ASSERT_TRUE(GroupRestarted(1, 3));
}

// The backend must leave each elastic role at least min places with room; if it does not, the
// job fails saying so rather than waiting for ever.
TEST_F(ElasticPlacesTest, DeferringARoleBelowItsMinFailsTheJobWithTheReason) {
  ASSERT_TRUE(JournalGets("admitted"));
  backend_->Allocate({"worker.1", "worker.2"});
  ASSERT_TRUE(JournalGets("allocated"));
  ASSERT_TRUE(StartAgent(0)->accepted());
  ASSERT_TRUE(JournalGets("job_finished"));
  auto finished = Events("job_finished")[0];
  EXPECT_EQ(finished.value("outcome", ""), "failed");
  EXPECT_EQ(finished.value("reason", ""),
            "the backend deferred the places of all but 1 of the worker tasks; the role needs "
            "at least 2 to start");
}

// A deferred place's agent that never comes does not keep the job from succeeding.
TEST_F(ElasticPlacesTest, AJobThatEndsBeforeItsDeferredSlotJoinedSucceeds) {
  ASSERT_TRUE(JournalGets("admitted"));
  backend_->Allocate({"worker.2"});
  ASSERT_TRUE(StartAgent(0)->accepted());
  ASSERT_TRUE(StartAgent(1)->accepted());
  ASSERT_TRUE(JournalGets("job_state", [](const auto& r) { return r["to"] == "running"; }));
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(agents_[0]->Runs("worker:0") && agents_[1]->Runs("worker:1")) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  agents_[0]->Exit("worker:0", 0);
  agents_[1]->Exit("worker:1", 0);
  ASSERT_TRUE(JournalGets("job_finished"));
  EXPECT_EQ(Events("job_finished")[0].value("outcome", ""), "succeeded")
      << Events("job_finished")[0].dump();
  EXPECT_TRUE(Events("failure_handled").empty());
}

}  // namespace
}  // namespace shoal::master
