// The `spark:` job-file section, --spark-master and the Spark properties the backend derives from
// a job: every key's rule and message (file:line: spark.<key>: ...).
#include "backends/spark/spark_section.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/spark/spark_backend.h"
#include "backends/spark/spark_provider.h"
#include "spec/spec_parser.h"

namespace shoal::backends {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<spec::JobSpec> Parse(const std::string& spark, const std::string& resources =
                                                                   "{cpus: 1}") {
  return spec::ParseJobSpec("name: j\nspark: " + spark +
                                "\nroles:\n  worker:\n    instances: 2\n    command: [x]\n"
                                "    resources: " + resources + "\n",
                            "job.yaml", "/base", {SparkJobSection()});
}

TEST(SparkSectionTest, ReadsEveryKey) {
  auto job = Parse(
      "{master: \"spark://h1:7077,h2:7077\", deploy_mode: client, executor_memory: 1g, "
      "executor_cores: 2, conf: {spark.executor.memoryOverhead: 512m, spark.task.maxFailures: 8}}");
  ASSERT_TRUE(job.ok()) << job.status();
  const SparkConfig& c = SparkConfigOf(*job);
  EXPECT_EQ(c.master, "spark://h1:7077,h2:7077");
  EXPECT_EQ(c.deploy_mode, "client");
  EXPECT_EQ(c.executor_memory, "1g");
  EXPECT_EQ(c.executor_cores, 2u);
  EXPECT_EQ(c.conf, (std::map<std::string, std::string>{{"spark.executor.memoryOverhead", "512m"},
                                                        {"spark.task.maxFailures", "8"}}));
}

TEST(SparkSectionTest, AcceptsEveryKindOfMaster) {
  for (const char* master : {"spark://host:7077", "yarn", "local-cluster[2,1,1024]",
                             "k8s://https://10.0.0.1:6443", "spark://[::1]:7077"}) {
    EXPECT_TRUE(IsSparkMaster(master)) << master;
  }
  for (const char* master : {"spark://", "spark://host", "spark://host:0", "local[2]", "mesos://x",
                             "local-cluster[2,1]", "k8s://", "YARN"}) {
    EXPECT_FALSE(IsSparkMaster(master)) << master;
  }
}

// A job file's values may be long; a recursive matcher (std::regex) overflowed the stack.
TEST(SparkSectionTest, LongValuesAreCheckedWithoutRecursion) {
  std::string digits(2'000'000, '1');
  EXPECT_FALSE(IsSparkMemory(digits + "m"));
  EXPECT_FALSE(IsSparkMaster("local-cluster[" + digits + ",1,1]"));
  EXPECT_TRUE(IsSparkMemory("512m") && IsSparkMemory("2G") && IsSparkMemory("1024kb"));
  EXPECT_FALSE(IsSparkMemory("0") || IsSparkMemory("1x") || IsSparkMemory("m") ||
               IsSparkMemory("1mbb"));
}

TEST(SparkSectionTest, EachBadKeyIsNamedWithItsLine) {
  auto job = Parse("{master: \"spark//h:7077\"}");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "job.yaml:2: spark.master: must be a Spark master URL: spark://HOST:PORT[,HOST:PORT...], "
            "yarn, local-cluster[WORKERS,CORES,MEMORY_MB] or k8s://https://HOST:PORT, got "
            "'spark//h:7077'");
  job = Parse("{deploy_mode: cluster}");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(),
              HasSubstr("job.yaml:2: spark.deploy_mode: must be client (the Shoal master runs "
                        "beside the Spark driver"));
  job = Parse("{executor_memory: lots}");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "job.yaml:2: spark.executor_memory: must be a Spark memory size, e.g. 512m or 1g, got "
            "'lots'");
  job = Parse("{executor_cores: 0}");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "job.yaml:2: spark.executor_cores: must be a whole number of cores from 1 to 1024, "
            "got 0");
  job = Parse("{executor_memroy: 1g}");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(),
              HasSubstr("job.yaml:2: spark.executor_memroy: unknown key; did you mean "
                        "'executor_memory'?"));
  job = Parse("ml");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr("job.yaml:2: spark: must be a map with master"));
}

TEST(SparkSectionTest, ConfTakesSparkPropertiesButNotTheSectionsOwnOrDynamicAllocation) {
  auto job = Parse("{conf: {executor.memory: 1g}}");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "job.yaml:2: spark.conf.executor.memory: must name a Spark property (spark.*), got "
            "'executor.memory'");
  job = Parse("{conf: {spark.master: yarn}}");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "job.yaml:2: spark.conf.spark.master: is the section's own `master` (or "
            "--spark-master)");
  job = Parse("{conf: {spark.dynamicAllocation.enabled: true}}");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(),
              HasSubstr("spark.conf.spark.dynamicAllocation.enabled: cannot be true: Spark runs "
                        "no barrier stage with dynamic allocation"));
  EXPECT_TRUE(Parse("{conf: {spark.dynamicAllocation.enabled: false}}").ok());
}

TEST(SparkMasterTest, TheFlagWinsOverTheSectionWhichWinsOverTheEnvironment) {
  ::setenv("SHOAL_SPARK_MASTER", "spark://env:7077", 1);
  auto job = Parse("{master: \"spark://file:7077\"}");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(*SparkMasterFor(*job, {{"--spark-master", "yarn"}}), "yarn");
  EXPECT_EQ(*SparkMasterFor(*job, {}), "spark://file:7077");
  auto bare = Parse("{}");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(*SparkMasterFor(*bare, {}), "spark://env:7077");
  EXPECT_EQ(SparkMasterFor(*job, {{"--spark-master", "spark:/x"}}).status().message(),
            "invalid flag: --spark-master: must be a Spark master URL: "
            "spark://HOST:PORT[,HOST:PORT...], yarn, local-cluster[WORKERS,CORES,MEMORY_MB] or "
            "k8s://https://HOST:PORT, got 'spark:/x'");
  ::unsetenv("SHOAL_SPARK_MASTER");
  EXPECT_THAT(std::string(SparkMasterFor(*bare, {}).status().message()),
              HasSubstr("--backend spark needs the Spark master"));
}

TEST(SparkPropertiesTest, BarrierTasksAreAsBigAsTheBiggestTaskAndGetGpus) {
  auto job = Parse("{executor_memory: 512m, executor_cores: 4, conf: {spark.task.cpus: \"3\"}}",
                   "{cpus: 1.5, gpus: 1}");
  ASSERT_TRUE(job.ok()) << job.status();
  SparkBackendOptions options;
  options.executor_memory = "512m";
  options.executor_cores = 4;
  auto conf = SparkBackend::SparkProperties(*job, options, "10.0.0.5");
  EXPECT_EQ(conf["spark.task.cpus"], "2");
  EXPECT_EQ(conf["spark.task.resource.gpu.amount"], "1");
  EXPECT_EQ(conf["spark.executor.resource.gpu.amount"], "2");  // two 2-core tasks per executor
  EXPECT_EQ(conf["spark.executor.memory"], "512m");
  EXPECT_EQ(conf["spark.executor.cores"], "4");
  EXPECT_EQ(conf["spark.submit.deployMode"], "client");
  EXPECT_EQ(conf["spark.driver.host"], "10.0.0.5");
  // The job's own conf comes last and wins.
  options.conf = SparkConfigOf(*job).conf;
  EXPECT_EQ(SparkBackend::SparkProperties(*job, options, "")["spark.task.cpus"], "3");
}

TEST(SparkSectionTest, AgentImageIsAnImageReference) {
  auto job = Parse("{agent_image: registry.example/shoal-agent:1.0}");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(SparkConfigOf(*job).agent_image, "registry.example/shoal-agent:1.0");
  auto bad = Parse("{agent_image: \"two words\"}");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("job.yaml:2: spark.agent_image: must be an image reference"));
}

// On Kubernetes, Spark starts exactly spark.executor.instances pods (2 by default, of 1 core):
// as many as the gang needs, each big enough for its places, their memory outside the heap
// on top of Spark's own overhead (ContainerExecutorProperties, as on YARN).
TEST(SparkPropertiesTest, KubernetesExecutorsAreSizedForTheGang) {
  auto job = Parse("{}", "{cpus: 2, memory: 1GiB}");
  ASSERT_TRUE(job.ok()) << job.status();
  SparkBackendOptions options;
  options.master = "k8s://https://10.0.0.1:6443";
  auto conf = SparkBackend::SparkProperties(*job, options, "10.0.0.5");
  EXPECT_EQ(conf["spark.executor.instances"], "2");
  EXPECT_EQ(conf["spark.executor.cores"], "2");
  EXPECT_EQ(conf["spark.executor.memory"], "512m");
  EXPECT_EQ(conf["spark.executor.memoryOverhead"], "1408m");  // Spark's 384m + the place's 1g
  options.executor_cores = 4;  // both places in one executor
  conf = SparkBackend::SparkProperties(*job, options, "10.0.0.5");
  EXPECT_EQ(conf["spark.executor.instances"], "1");
  EXPECT_EQ(conf["spark.executor.memoryOverhead"], "2432m");
  // Other masters size their executors themselves.
  options.master = "spark://h:7077";
  EXPECT_FALSE(SparkBackend::SparkProperties(*job, options, "").contains("spark.executor.instances"));
}

TEST(SparkPropertiesTest, TheExecutorPodTemplateBringsTheAgentBundle) {
  nlohmann::json pod = SparkBackend::ExecutorPodTemplate("registry.example/agent:1", "Never");
  const auto& init = pod["spec"]["initContainers"][0];
  EXPECT_EQ(init["image"], "registry.example/agent:1");
  EXPECT_EQ(init["imagePullPolicy"], "Never");
  EXPECT_EQ(init["volumeMounts"][0]["mountPath"], "/mnt/shoal");
  const auto& executor = pod["spec"]["containers"][0];
  EXPECT_EQ(executor["volumeMounts"][0]["mountPath"], "/opt/shoal");
  EXPECT_EQ(pod["spec"]["volumes"][0]["name"], executor["volumeMounts"][0]["name"]);
}

}  // namespace
}  // namespace shoal::backends
