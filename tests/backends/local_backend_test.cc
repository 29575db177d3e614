#include "backends/local/local_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace shoal::backends {
namespace {

class LocalBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-ledger-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  LocalBackendOptions Options(double cpus, std::vector<std::string> gpus = {}) {
    LocalBackendOptions o;
    o.machine.hostname = "test";
    o.machine.cpus = cpus;
    for (uint32_t c = 0; c < cpus; ++c) o.machine.cores.push_back(c);
    o.machine.memory_bytes = 8ull << 30;
    o.machine.gpus = std::move(gpus);
    o.ledger_dir = dir_.string();
    return o;
  }

  static spec::JobSpec Job(uint32_t workers, double cpus, uint32_t gpus = 0) {
    spec::JobSpec job;
    job.name = "j";
    spec::Role r;
    r.name = "worker";
    r.instances = workers;
    r.argv = {"true"};
    r.resources.cpus = cpus;
    r.resources.gpus = gpus;
    job.roles.push_back(r);
    return job;
  }

  std::filesystem::path dir_;
};

TEST_F(LocalBackendTest, GrantsTheWholeGangOnOneNode) {
  LocalBackend backend(Options(4));
  auto grants = backend.Acquire(Job(2, 1), "job-a");
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_EQ(grants->size(), 1u);
  EXPECT_DOUBLE_EQ((*grants)[0].cpus, 2);
  EXPECT_EQ((*grants)[0].cores.size(), 2u);
}

TEST_F(LocalBackendTest, QueuesJobThatDoesNotFitBesideAnotherAndSaysWhy) {
  LocalBackend first(Options(4, {"0", "1"}));
  ASSERT_TRUE(first.Acquire(Job(3, 1), "job-a").ok());
  LocalBackend second(Options(4, {"0", "1"}));
  auto grants = second.Acquire(Job(2, 1), "job-b");
  ASSERT_EQ(grants.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(grants.status().message().find("2.00 CPUs (1.00 free)"), std::string::npos)
      << grants.status();
  EXPECT_NE(grants.status().message().find("job-a"), std::string::npos);
  first.Release();
  EXPECT_TRUE(second.Acquire(Job(2, 1), "job-b").ok());
}

TEST_F(LocalBackendTest, NeverGivesTheSameGpuOrCoreToTwoJobs) {
  LocalBackend first(Options(4, {"0", "1"}));
  LocalBackend second(Options(4, {"0", "1"}));
  auto a = first.Acquire(Job(1, 2, 1), "job-a");
  auto b = second.Acquire(Job(1, 2, 1), "job-b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)[0].gpus, (*b)[0].gpus);
  for (uint32_t c : (*a)[0].cores) {
    EXPECT_EQ(std::count((*b)[0].cores.begin(), (*b)[0].cores.end(), c), 0);
  }
}

TEST_F(LocalBackendTest, JobLargerThanTheMachineCanNeverFit) {
  LocalBackend backend(Options(2));
  auto grants = backend.Acquire(Job(4, 1), "job-a");
  EXPECT_EQ(grants.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LocalBackendTest, ReservationOfADeadMasterIsIgnored) {
  ResourceLedger ledger(dir_.string());
  auto r = ledger.ReserveIf([](const std::vector<Reservation>&) -> absl::StatusOr<Reservation> {
    Reservation dead;
    dead.job_id = "ghost";
    dead.owner_pid = 999999999;  // no such process
    dead.cpus = 4;
    return dead;
  });
  ASSERT_TRUE(r.ok());
  LocalBackend backend(Options(4));
  EXPECT_TRUE(backend.Acquire(Job(4, 1), "job-a").ok());
}

}  // namespace
}  // namespace shoal::backends
