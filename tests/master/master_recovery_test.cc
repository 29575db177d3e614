// A real Master taking a job over from its journal (options.recover): what the journal held is
// what the new master shows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "backends/backend.h"
#include "common/clock.h"
#include "common/journal.h"
#include "master/master.h"
#include "shoal/v1/shoal.pb.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

// Grants one place and re-attaches to it; starts nothing (no agent will come back in the test).
class ReattachingBackend final : public backends::Backend {
 public:
  std::string Name() const override { return "test"; }
  absl::StatusOr<std::vector<backends::NodeGrant>> Acquire(const spec::JobSpec&,
                                                           const std::string&) override {
    return absl::UnavailableError("the test's job was admitted before the master died");
  }
  absl::Status StartAgents(const backends::AgentStartOptions&) override {
    return absl::OkStatus();
  }
  absl::Status Reattach(const std::string&, const std::vector<backends::NodeGrant>&,
                        const backends::AgentStartOptions&) override {
    return absl::OkStatus();
  }
  void SetPlaceLostCallback(PlaceLostCallback) override {}
  void TerminatePlace(const std::string&) override {}
  void Release() override {}
  absl::Status ReplacePlace(const std::string&, const backends::AgentStartOptions&) override {
    return absl::OkStatus();
  }
};

// What a master of a dataset job journaled before it died: worker:0 runs, has completed shard 0
// and holds a lease on shard 1.
const char* kJournal[] = {
    R"({"type":"job_submitted","job_id":"rec-test","name":"rec","tasks":1,"master":"127.0.0.1:0","ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","to":"pending","rank":0,"ts":1,"ts_us":1000})",
    R"({"type":"admitted","backend":"test","nodes":[{"name":"node-a","address":"127.0.0.1","cpus":4.0,"memory_bytes":1073741824,"cores":[],"gpus":[],"for_task":"","gpus_from_agent":false,"gpu_count":0}],"ts":1,"ts_us":1000})",
    R"({"type":"job_state","to":"starting","reason":"waiting for agents to register","ts":1,"ts_us":1000})",
    R"({"type":"agent_registered","node":"node-a","hostname":"h","address":"127.0.0.1","gpus":[],"ports":1,"ts":1,"ts_us":1000})",
    R"({"type":"rendezvous","generation":0,"world_size":1,"ranks":[{"task":"worker:0","rank":0,"node":"node-a","address":"127.0.0.1","port":23456}],"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"pending","to":"starting","attempt":0,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"starting","to":"running","attempt":0,"pid":4242,"ts":1,"ts_us":1000})",
    R"({"type":"job_state","to":"running","reason":"","ts":1,"ts_us":1000})",
    R"({"type":"shard_leased","epoch":0,"shard":0,"task":"worker:0","attempt":0,"ts":1,"ts_us":1000})",
    R"({"type":"shard_done","epoch":0,"shard":0,"task":"worker:0","attempt":0,"step":10,"ts":1,"ts_us":1000})",
    R"({"type":"shard_leased","epoch":0,"shard":1,"task":"worker:0","attempt":0,"ts":1,"ts_us":1000})",
};

TEST(MasterRecoveryTest, TheShardTableIsRebuiltFromTheJournal) {
  auto dir = std::filesystem::temp_directory_path() /
             ("shoal-master-recovery-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream journal(dir / "events.jsonl");
    for (const char* line : kJournal) journal << line << "\n";
  }
  spec::JobSpec job;
  job.name = "rec";
  spec::Role role;
  role.name = "worker";
  role.instances = 1;
  role.argv = {"/bin/true"};
  role.working_dir = "/";
  job.roles.push_back(role);
  job.success_roles = {"worker"};
  job.dataset.samples = 40;
  job.dataset.shard_size = 10;
  job.dataset.configured = true;
  FakeClock clock;
  MasterOptions options;
  options.job_id = "rec-test";
  options.job_dir = dir.string();
  options.spec = job;
  options.token = "right-token";
  options.clock = &clock;
  options.recover = true;
  auto master = Master::Create(options, std::make_unique<ReattachingBackend>());
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE((*master)->Start().ok());

  // The status the new master publishes once it has taken over.
  nlohmann::json shards;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    v1::JobStatus status;
    (*master)->FillStatus(&status);
    if (!status.shards_json().empty()) {
      shards = nlohmann::json::parse(status.shards_json());
      break;
    }
    // Status is published at most every 50 ms of the master's clock.
    clock.Advance(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(shards.is_object()) << "no status with shards within 10 s; " << [&] {
    v1::JobStatus status;
    (*master)->FillStatus(&status);
    return status.DebugString();
  }();
  EXPECT_EQ(shards["epoch_counts"][0]["done"], 1) << shards.dump();
  EXPECT_EQ(shards["epoch_counts"][0]["leased"], 1) << shards.dump();
  ASSERT_EQ(shards["leases"].size(), 1u) << shards.dump();
  EXPECT_EQ(shards["leases"][0]["shard"], 1);
  EXPECT_EQ(shards["leases"][0]["task"], "worker:0");

  (*master)->Kill("test over");
  master->reset();
  std::filesystem::remove_all(dir);
}

// An elastic job whose worker:1 left the world (shrunk) before the master died; neither agent
// comes back to the new master.
const char* kShrunkJournal[] = {
    R"({"type":"job_submitted","job_id":"rec-edl","name":"edl","tasks":2,"master":"127.0.0.1:0","ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","to":"pending","rank":0,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:1","to":"pending","rank":1,"ts":1,"ts_us":1000})",
    R"({"type":"admitted","backend":"test","nodes":[{"name":"node-a","address":"127.0.0.1","cpus":1.0,"memory_bytes":1073741824,"for_task":"worker:0"},{"name":"node-b","address":"127.0.0.1","cpus":1.0,"memory_bytes":1073741824,"for_task":"worker:1"}],"ts":1,"ts_us":1000})",
    R"({"type":"job_state","to":"starting","reason":"waiting for agents to register","ts":1,"ts_us":1000})",
    R"({"type":"agent_registered","node":"node-a","hostname":"h","address":"127.0.0.1","gpus":[],"ports":1,"ts":1,"ts_us":1000})",
    R"({"type":"agent_registered","node":"node-b","hostname":"h","address":"127.0.0.1","gpus":[],"ports":1,"ts":1,"ts_us":1000})",
    R"({"type":"rendezvous","generation":0,"world_size":2,"ranks":[{"task":"worker:0","rank":0,"node":"node-a","address":"127.0.0.1","port":23456},{"task":"worker:1","rank":1,"node":"node-b","address":"127.0.0.1","port":23457}],"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"pending","to":"starting","attempt":0,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:1","from":"pending","to":"starting","attempt":0,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"starting","to":"running","attempt":0,"pid":4242,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:1","from":"starting","to":"running","attempt":0,"pid":4243,"ts":1,"ts_us":1000})",
    R"({"type":"job_state","to":"running","reason":"","ts":1,"ts_us":1000})",
    R"({"type":"failure_handled","task":"worker:1","attempt":0,"action":"shrink-group","cause":"exited with code 1","restart":1,"delay_ms":0,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:1","from":"running","to":"failed","attempt":0,"exit_code":1,"signal":0,"ts":1,"ts_us":1000})",
    R"({"type":"slot_left","task":"worker:1","ts":1,"ts_us":1000})",
    R"({"type":"group_restart_begun","generation":1,"reason":"worker:1 exited with code 1","restarts":1,"delay_ms":0,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"running","to":"killed","attempt":0,"exit_code":0,"signal":15,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"killed","to":"pending","attempt":1,"ts":1,"ts_us":1000})",
    R"({"type":"rendezvous","generation":1,"world_size":1,"ranks":[{"task":"worker:0","rank":0,"node":"node-a","address":"127.0.0.1","port":23456}],"ts":1,"ts_us":1000})",
    R"({"type":"group_restarted","generation":1,"world_size":1,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"pending","to":"starting","attempt":1,"ts":1,"ts_us":1000})",
    R"({"type":"task_state","task":"worker:0","from":"starting","to":"running","attempt":1,"pid":4244,"ts":1,"ts_us":1000})",
};

// node-b holds only a parked slot: left dead, the slot could never come back, so the new master
// asks for a new agent there once the old one did not come back.
TEST(MasterRecoveryTest, APlaceOfOnlyAParkedSlotThatDoesNotComeBackIsReplaced) {
  auto dir = std::filesystem::temp_directory_path() /
             ("shoal-master-recovery-edl-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream journal(dir / "events.jsonl");
    for (const char* line : kShrunkJournal) journal << line << "\n";
  }
  auto job = spec::ParseJobSpec(R"(
name: edl
on_failure: elastic
max_restarts: 5
roles:
  worker:
    instances: {min: 1, max: 2}
    command: ["/bin/true"]
)",
                                "job.yaml", "/tmp", /*sections=*/{});
  ASSERT_TRUE(job.ok()) << job.status();
  FakeClock clock;
  MasterOptions options;
  options.job_id = "rec-edl";
  options.job_dir = dir.string();
  options.spec = *job;
  options.token = "right-token";
  options.clock = &clock;
  options.recover = true;
  options.heartbeat_interval = std::chrono::hours(1);
  auto master = Master::Create(options, std::make_unique<ReattachingBackend>());
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE((*master)->Start().ok());

  auto replacing_b = [&] {
    auto all = Journal::ReadAll((dir / "events.jsonl").string());
    if (!all.ok()) return false;
    for (const auto& r : *all) {
      if (r.value("type", "") == "place_replacing" && r.value("node", "") == "node-b") return true;
    }
    return false;
  };
  auto recovered = [&] {
    auto all = Journal::ReadAll((dir / "events.jsonl").string());
    if (!all.ok()) return false;
    for (const auto& r : *all) {
      if (r.value("type", "") == "master_recovered") return true;
    }
    return false;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!recovered() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(recovered());
  clock.Advance(options.register_timeout + std::chrono::seconds(1));
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!replacing_b() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(replacing_b()) << "node-b, where the parked worker:1 waits, was left dead";

  (*master)->Kill("test over");
  master->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal::master
