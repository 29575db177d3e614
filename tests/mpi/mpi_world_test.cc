#include "mpi/mpi_world.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::mpi {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kCluster[] = R"json({
  "job_id": "j", "restart_count": 0,
  "cluster": {},
  "tasks": [
    {"role": "launcher", "index": 0, "rank": 0, "node": "n0", "address": "10.0.0.1", "port": 4000},
    {"role": "worker", "index": 1, "rank": 2, "node": "n1", "address": "10.0.0.2", "port": 4002},
    {"role": "worker", "index": 0, "rank": 1, "node": "n0", "address": "10.0.0.1", "port": 4001}
  ]})json";

TEST(MpiWorldTest, WorkerHostsAreTheWorkerTasksByIndex) {
  auto hosts = WorkerHosts(kCluster);
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 2u);
  EXPECT_EQ((*hosts)[0].alias, "shoal-worker-0");
  EXPECT_EQ((*hosts)[0].address, "10.0.0.1");
  EXPECT_EQ((*hosts)[0].port, 4001u);
  EXPECT_EQ((*hosts)[1].alias, "shoal-worker-1");
  EXPECT_EQ((*hosts)[1].port, 4002u);
  EXPECT_EQ(Hostfile(*hosts, 3), "shoal-worker-0 slots=3\nshoal-worker-1 slots=3\n");
}

TEST(MpiWorldTest, FindTaskNamesTheMissingTask) {
  auto me = FindTask(kCluster, "worker", 1);
  ASSERT_TRUE(me.ok());
  EXPECT_EQ(me->address, "10.0.0.2");
  auto missing = FindTask(kCluster, "worker", 7);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("worker:7"));
}

TEST(MpiWorldTest, MalformedClusterSpecsAreErrorsNotCrashes) {
  EXPECT_FALSE(WorkerHosts("not json").ok());
  EXPECT_FALSE(WorkerHosts(R"({"tasks": 3})").ok());
  EXPECT_FALSE(WorkerHosts(R"({"tasks": [{"role": "worker", "index": "x"}]})").ok());
  auto none = WorkerHosts(R"({"tasks": [{"role": "launcher", "index": 0, "address": "a", "port": 1}]})");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("no worker tasks"));
}

TEST(MpiWorldTest, LauncherRunsAPlainProgramThroughMpirun) {
  EXPECT_THAT(LauncherArgv({"python3", "train.py"}, 4),
              ElementsAre("mpirun", "-np", "4", "--bind-to", "none", "python3", "train.py"));
}

TEST(MpiWorldTest, LauncherRunsAnMpirunCommandAsWritten) {
  std::vector<std::string> own = {"/usr/bin/mpiexec", "-np", "2", "./a.out"};
  EXPECT_EQ(LauncherArgv(own, 4), own);
  std::vector<std::string> plain = {"mpirun", "--map-by", "node", "./a.out"};
  EXPECT_EQ(LauncherArgv(plain, 4), plain);
}

TEST(MpiWorldTest, RequestsRoundTripAndMalformedOnesAreRefused) {
  std::string line = EncodeRequest({"s3cret", "orted -mca ess \"env\""});
  ASSERT_EQ(line.back(), '\n');
  line.pop_back();
  auto r = DecodeRequest(line);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->secret, "s3cret");
  EXPECT_EQ(r->command, "orted -mca ess \"env\"");
  EXPECT_FALSE(DecodeRequest("{").ok());
  EXPECT_FALSE(DecodeRequest(R"({"secret": "s"})").ok());
  EXPECT_FALSE(DecodeRequest(R"({"secret": "s", "command": ""})").ok());
  EXPECT_FALSE(DecodeRequest(R"({"secret": 1, "command": "x"})").ok());
}

TEST(MpiWorldTest, SecretsCompareWholly) {
  EXPECT_TRUE(SecretsEqual("abc", "abc"));
  EXPECT_FALSE(SecretsEqual("abc", "abd"));
  EXPECT_FALSE(SecretsEqual("abc", "abcd"));
  EXPECT_FALSE(SecretsEqual("", "a"));
}

}  // namespace
}  // namespace shoal::mpi
