// What the YARN backend asks of YARN, computed from the job: places, container sizes, the AM's
// command line and the REST submission. The backend's behaviour against a real ResourceManager
// is in backend_contract_test (Yarn) and tests/e2e/test_yarn.py.
#include "backends/yarn/yarn_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/webhdfs.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {
namespace {

using common::WebHdfs;
using common::WebHdfsAddress;

using ::testing::HasSubstr;

spec::JobSpec TwoRoles() {
  spec::JobSpec job;
  job.name = "j";
  spec::Role ps;
  ps.name = "ps";
  ps.instances = 1;
  ps.resources.cpus = 0.5;
  ps.resources.memory_bytes = 0;
  spec::Role worker;
  worker.name = "worker";
  worker.instances = 2;
  worker.resources.cpus = 2.5;
  worker.resources.memory_bytes = (2ull << 30) + 1;
  worker.resources.gpus = 1;
  job.roles = {ps, worker};
  return job;
}

TEST(YarnRequestTest, OnePlacePerTaskNamedAfterIt) {
  std::vector<NodeGrant> places = YarnPlaces(TwoRoles());
  ASSERT_EQ(places.size(), 3u);
  EXPECT_EQ(places[0].name, "ps.0");
  EXPECT_EQ(places[0].for_task, "ps:0");
  EXPECT_EQ(places[2].name, "worker.1");
  EXPECT_EQ(places[2].for_task, "worker:1");
  EXPECT_EQ(places[2].cpus, 3);  // whole vcores
  EXPECT_TRUE(places[2].gpus_from_agent);
  EXPECT_EQ(places[2].gpu_count, 1u);
  EXPECT_FALSE(places[0].gpus_from_agent);
}

TEST(YarnRequestTest, ContainerHoldsTheTaskAndTheAgent) {
  spec::Resources r;
  r.memory_bytes = 2ull << 30;
  EXPECT_EQ(YarnContainerMemoryMb(r), 2048 + kAgentHeadroomMb);
  r.memory_bytes = (2ull << 30) + 1;  // rounds up to the next MB
  EXPECT_EQ(YarnContainerMemoryMb(r), 2049 + kAgentHeadroomMb);
  r.memory_bytes = 0;
  EXPECT_EQ(YarnContainerMemoryMb(r), kDefaultTaskMemoryMb + kAgentHeadroomMb);
  r.cpus = 0.25;
  EXPECT_EQ(YarnContainerVcores(r), 1u);
  r.cpus = 4;
  EXPECT_EQ(YarnContainerVcores(r), 4u);
}

// The command line must come out of /bin/sh as the argv that went in.
TEST(YarnRequestTest, ShellCommandKeepsEveryWordIntact) {
  std::vector<std::string> argv = {"/opt/shoal bin/shoal", "it's", "a\"b", "$HOME", "*", ""};
  std::string command = "printf '[%s]' " + YarnShellCommand(argv);
  FILE* p = ::popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  ::pclose(p);
  EXPECT_EQ(std::string(buf, n), "[/opt/shoal bin/shoal][it's][a\"b][$HOME][*][]");
}

TEST(YarnRequestTest, NodeManagerExpansionsAreLeftForTheShell) {
  // The NodeManager turns {{PWD}} into $PWD before the shell runs: it must not be in '...'.
  EXPECT_EQ(YarnShellCommand({"--work-dir", "{{PWD}}/agent"}), "'--work-dir' \"{{PWD}}/agent\"");
}

TEST(YarnRequestTest, SubmissionCarriesTheAmKeyButNoAgentToken) {
  YarnSubmission s;
  s.application_id = "application_1_0001";
  s.name = "shoal-j";
  s.queue = "ml";
  s.node_label = "gpu";
  s.am_command = "java -cp x shoal.yarn.ShoalAppMaster e30=";
  s.am_key = "k";
  auto body = nlohmann::json::parse(YarnSubmissionJson(s));
  EXPECT_EQ(body["application-id"], "application_1_0001");
  EXPECT_EQ(body["application-name"], "shoal-j");
  EXPECT_EQ(body["queue"], "ml");
  EXPECT_EQ(body["am-container-node-label-expression"], "gpu");
  EXPECT_EQ(body["max-app-attempts"], 1);
  EXPECT_EQ(body["am-container-spec"]["commands"]["command"], s.am_command);
  auto entries = body["am-container-spec"]["environment"]["entry"];
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]["key"], "SHOAL_AM_KEY");
  EXPECT_EQ(body["resource"]["memory"], 256);
}

TEST(YarnRequestTest, SubmissionShipsTheAmJarAsALocalResourceAndSetsItsClasspath) {
  YarnSubmission s;
  s.application_id = "application_1_0001";
  s.am_command = "java shoal.yarn.ShoalAppMaster e30=";
  s.am_key = "k";
  s.am_classpath = "{{PWD}}/shoal-yarn-am.jar:$HADOOP_CONF_DIR";
  s.local_resources = {{"shoal-yarn-am.jar", "hdfs://nn:8020/user/u/.shoal/staging/a/am.jar",
                        12345, 1700000000123}};
  auto spec = nlohmann::json::parse(YarnSubmissionJson(s))["am-container-spec"];
  auto env = spec["environment"]["entry"];
  ASSERT_EQ(env.size(), 2u);
  EXPECT_EQ(env[1]["key"], "CLASSPATH");
  EXPECT_EQ(env[1]["value"], s.am_classpath);
  auto resources = spec["local-resources"]["entry"];
  ASSERT_EQ(resources.size(), 1u);
  EXPECT_EQ(resources[0]["key"], "shoal-yarn-am.jar");
  EXPECT_EQ(resources[0]["value"]["resource"], "hdfs://nn:8020/user/u/.shoal/staging/a/am.jar");
  EXPECT_EQ(resources[0]["value"]["type"], "FILE");
  EXPECT_EQ(resources[0]["value"]["visibility"], "APPLICATION");
  EXPECT_EQ(resources[0]["value"]["size"], 12345);
  EXPECT_EQ(resources[0]["value"]["timestamp"], 1700000000123);
}

TEST(YarnRequestTest, AmConfigListsEveryPlace) {
  YarnAmPlace p;
  p.name = "worker.0";
  p.memory_mb = 640;
  p.vcores = 2;
  p.gpus = 1;
  p.command = "'shoal' 'agent'";
  auto config = nlohmann::json::parse(YarnAmConfigJson({p}, 60000));
  EXPECT_EQ(config["idle_timeout_ms"], 60000);
  ASSERT_EQ(config["places"].size(), 1u);
  EXPECT_EQ(config["places"][0]["name"], "worker.0");
  EXPECT_EQ(config["places"][0]["memory_mb"], 640);
  EXPECT_EQ(config["places"][0]["gpus"], 1);
}

TEST(YarnRequestTest, AmConfigCarriesTheAgentsFilesAndTheStagingDir) {
  auto config = nlohmann::json::parse(
      YarnAmConfigJson({}, 60000, {{"shoal", "hdfs://nn:8020/s/shoal", 7, 8}}, "/s"));
  EXPECT_EQ(config["staging_dir"], "/s");
  ASSERT_EQ(config["agent_resources"].size(), 1u);
  EXPECT_EQ(config["agent_resources"][0]["name"], "shoal");
  EXPECT_EQ(config["agent_resources"][0]["url"], "hdfs://nn:8020/s/shoal");
  EXPECT_EQ(config["agent_resources"][0]["size"], 7);
  EXPECT_EQ(config["agent_resources"][0]["timestamp"], 8);
}

TEST(YarnRequestTest, WebHdfsIsTheNameNodesHostOnItsHttpPortUnlessGiven) {
  EXPECT_EQ(WebHdfsAddress("hdfs://nn.example:8020", "").value(), "http://nn.example:9870");
  EXPECT_EQ(WebHdfsAddress("hdfs://nameservice1/", "").value(), "http://nameservice1:9870");
  EXPECT_EQ(WebHdfsAddress("hdfs://nn:8020", "http://nn:50070").value(), "http://nn:50070");
  for (const char* bad : {"file:///", "", "hdfs://", "s3a://bucket"}) {
    auto got = WebHdfsAddress(bad, "");
    EXPECT_FALSE(got.ok()) << bad;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("hdfs://HOST:PORT")) << bad;
  }
}

TEST(YarnRequestTest, RmWebAddressMustBeHttpHostPort) {
  EXPECT_EQ(NormalizeRmWebAddress("http://rm:8088/").value(), "http://rm:8088");
  for (const char* bad : {"rm:8088", "http://rm", "http://rm:0", "https://rm:8088",
                          "http://rm:8088/cluster", "http://:8088"}) {
    auto got = NormalizeRmWebAddress(bad);
    EXPECT_FALSE(got.ok()) << bad;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("http://HOST:PORT")) << bad;
  }
}

TEST(YarnRequestTest, DefaultClasspathIsYarnsApplicationClasspath) {
  std::string cp = DefaultYarnAmClasspath();
  EXPECT_THAT(cp, ::testing::StartsWith("{{HADOOP_CONF_DIR}}:"));
  EXPECT_THAT(cp, HasSubstr("{{HADOOP_YARN_HOME}}/share/hadoop/yarn/*"));
}

TEST(YarnRequestTest, ClusterClasspathSettingBecomesAClasspath) {
  EXPECT_EQ(YarnClasspathFromConfig(
                "$HADOOP_CONF_DIR,\n  $HADOOP_COMMON_HOME/share/hadoop/common/*, ,/opt/lib/*"),
            "$HADOOP_CONF_DIR:$HADOOP_COMMON_HOME/share/hadoop/common/*:/opt/lib/*");
  EXPECT_EQ(YarnClasspathFromConfig(" "), "");
}

TEST(YarnRequestTest, AmClassLoadingFailuresAreRecognised) {
  EXPECT_EQ(AmMissingClass("Exception in thread \"main\" java.lang.NoClassDefFoundError: "
                           "org/apache/hadoop/yarn/client/api/async/"
                           "NMClientAsync$AbstractCallbackHandler\n\tat java.base/...")
                .value_or(""),
            "org.apache.hadoop.yarn.client.api.async.NMClientAsync$AbstractCallbackHandler");
  EXPECT_EQ(AmMissingClass("Caused by: java.lang.ClassNotFoundException: a.B\n").value_or(""),
            "a.B");
  EXPECT_EQ(AmMissingClass("Error: Could not find or load main class shoal.yarn.ShoalAppMaster")
                .value_or(""),
            "shoal.yarn.ShoalAppMaster");
  EXPECT_FALSE(AmMissingClass("Container killed on request. Exit code is 143").has_value());
  std::string message = AmClasspathFailureMessage("a.B", "/x/*", "SHOAL_YARN_AM_CLASSPATH");
  EXPECT_THAT(message, HasSubstr("found no class a.B"));
  EXPECT_THAT(message, HasSubstr("/x/* (from SHOAL_YARN_AM_CLASSPATH)"));
  EXPECT_THAT(message, HasSubstr("yarn.application.classpath"));
}

}  // namespace
}  // namespace shoal::backends
