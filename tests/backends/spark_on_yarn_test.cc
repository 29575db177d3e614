// What `--spark-master yarn` adds: the executors' size and count YARN is asked for, the jars
// used in place, and the ResourceManager's address read from the cluster's yarn-site.xml.
#include "backends/spark/spark_on_yarn.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "backends/spark/spark_backend.h"
#include "backends/spark/spark_section.h"
#include "spec/spec_parser.h"

namespace shoal::backends {
namespace {

using ::testing::HasSubstr;

spec::JobSpec Job(const std::string& spark, int instances, const std::string& resources) {
  std::string text = "name: j\nspark: " + spark + "\nroles:\n  worker:\n    instances: " +
                     std::to_string(instances) + "\n    command: [x]\n    resources: " +
                     resources + "\n";
  auto job = spec::ParseJobSpec(text, "job.yaml", "/base", {SparkJobSection()});
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

TEST(SparkOnYarnTest, AsksForOneExecutorPerPlaceWithRoomForThePlacesProcesses) {
  // The DDP demo: 2 tasks of 1 core and 2 GiB. YARN would start 2 executors of 1 core and a
  // 1g heap + 384m whatever the job; the places' processes must fit the container too.
  auto conf = SparkOnYarnProperties(Job("{}", 3, "{cpus: 1, memory: 2GiB}"), 0, "",
                                    "/venv/lib/python3.11/site-packages/pyspark");
  EXPECT_EQ(conf["spark.executor.instances"], "3");
  EXPECT_EQ(conf["spark.executor.cores"], "1");
  EXPECT_EQ(conf["spark.executor.memory"], "512m");
  EXPECT_EQ(conf["spark.executor.memoryOverhead"], "2432m");  // 384m of Spark's + 2048m
  EXPECT_EQ(conf["spark.yarn.jars"], "local:/venv/lib/python3.11/site-packages/pyspark/jars/*");
  EXPECT_EQ(conf["spark.ui.enabled"], "false");
}

TEST(SparkOnYarnTest, ExecutorCoresHoldWholeBarrierTasks) {
  // 5 tasks of 1.5 cores (2 each) on executors of 4 cores: two per executor, three executors.
  auto conf = SparkOnYarnProperties(Job("{}", 5, "{cpus: 1.5, memory: 100MiB}"), 4, "4g", "");
  EXPECT_EQ(conf["spark.executor.instances"], "3");
  EXPECT_EQ(conf["spark.executor.cores"], "4");
  EXPECT_EQ(conf["spark.executor.memory"], "4g");
  EXPECT_EQ(conf["spark.executor.memoryOverhead"], "609m");  // 10 % of 4g, + 2 x 100m
  EXPECT_FALSE(conf.contains("spark.yarn.jars"));            // PySpark's home unknown
  // Without executor_cores, an executor has the cores of one task.
  conf = SparkOnYarnProperties(Job("{}", 2, "{cpus: 3}"), 0, "", "");
  EXPECT_EQ(conf["spark.executor.cores"], "3");
  EXPECT_EQ(conf["spark.executor.instances"], "2");
  EXPECT_EQ(conf["spark.executor.memoryOverhead"], "384m");
}

TEST(SparkOnYarnTest, OnlyMasterYarnGetsThemAndTheJobsConfWins) {
  auto job = Job("{conf: {spark.executor.instances: \"4\", spark.yarn.jars: \"hdfs:///j/*\"}}", 2,
                 "{cpus: 1, memory: 1GiB}");
  SparkBackendOptions options;
  options.master = "spark://127.0.0.1:7077";
  options.spark_home = "/pyspark";
  EXPECT_FALSE(SparkBackend::SparkProperties(job, options, "").contains("spark.yarn.jars"));
  options.master = "yarn";
  EXPECT_EQ(SparkBackend::SparkProperties(job, options, "")["spark.yarn.jars"],
            "local:/pyspark/jars/*");
  EXPECT_EQ(SparkBackend::SparkProperties(job, options, "")["spark.executor.instances"], "2");
  options.conf = SparkConfigOf(job).conf;
  auto conf = SparkBackend::SparkProperties(job, options, "");
  EXPECT_EQ(conf["spark.executor.instances"], "4");
  EXPECT_EQ(conf["spark.yarn.jars"], "hdfs:///j/*");
}

TEST(HadoopPropertyTest, ReadsValuesAndExpandsReferences) {
  std::string xml = R"(<?xml version="1.0"?>
<configuration>
<property><name>yarn.resourcemanager.hostname</name><value>rm.example</value></property>
<property>
  <name>yarn.resourcemanager.address</name>
  <value> ${yarn.resourcemanager.hostname}:8050 </value>
  <source>programmatically</source>
</property>
<property><name>a.b</name><value>x&amp;y</value></property>
</configuration>)";
  EXPECT_EQ(HadoopProperty(xml, "yarn.resourcemanager.address"), "rm.example:8050");
  EXPECT_EQ(HadoopProperty(xml, "a.b"), "x&y");
  EXPECT_EQ(HadoopProperty(xml, "yarn.resourcemanager"), "");
  EXPECT_EQ(HadoopProperty(xml, "missing"), "");
}

class YarnConfDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/spark-on-yarn-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ::unsetenv("HADOOP_CONF_DIR");
    ::unsetenv("YARN_CONF_DIR");
  }
  void TearDown() override {
    std::remove((dir_ + "/yarn-site.xml").c_str());
    std::remove(dir_.c_str());
    ::unsetenv("HADOOP_CONF_DIR");
    ::unsetenv("YARN_CONF_DIR");
  }
  void WriteSite(const std::string& properties) {
    std::ofstream(dir_ + "/yarn-site.xml") << "<configuration>" << properties
                                           << "</configuration>\n";
  }
  std::string dir_;
};

TEST_F(YarnConfDirTest, NeedsHadoopOrYarnConfDirWithAYarnSite) {
  EXPECT_THAT(std::string(YarnConfDir().status().message()),
              HasSubstr("needs HADOOP_CONF_DIR or YARN_CONF_DIR"));
  ::setenv("YARN_CONF_DIR", dir_.c_str(), 1);
  EXPECT_THAT(std::string(YarnConfDir().status().message()),
              HasSubstr("YARN_CONF_DIR=" + dir_ + " has no readable yarn-site.xml"));
  WriteSite("");
  EXPECT_EQ(*YarnConfDir(), dir_);
  ::setenv("HADOOP_CONF_DIR", "/nonexistent", 1);  // HADOOP_CONF_DIR first, as Spark
  EXPECT_THAT(std::string(YarnConfDir().status().message()), HasSubstr("HADOOP_CONF_DIR="));
}

TEST_F(YarnConfDirTest, FindsTheResourceManagersAddress) {
  WriteSite("<property><name>yarn.resourcemanager.address</name><value>localhost:37541</value>"
            "</property>");
  EXPECT_EQ(*YarnResourceManagerAddress(dir_), (std::pair<std::string, std::string>{
                                                   "localhost", "37541"}));
  WriteSite("<property><name>yarn.resourcemanager.hostname</name><value>rm1</value></property>");
  EXPECT_EQ(YarnResourceManagerAddress(dir_)->second, "8032");
  WriteSite("<property><name>yarn.resourcemanager.ha.enabled</name><value>true</value></property>"
            "<property><name>yarn.resourcemanager.ha.rm-ids</name><value>a, b</value></property>"
            "<property><name>yarn.resourcemanager.hostname.a</name><value>rm-a</value></property>");
  EXPECT_EQ(YarnResourceManagerAddress(dir_)->first, "rm-a");
  WriteSite("");
  EXPECT_THAT(std::string(YarnResourceManagerAddress(dir_).status().message()),
              HasSubstr("sets neither yarn.resourcemanager.address nor"));
}

}  // namespace
}  // namespace shoal::backends
