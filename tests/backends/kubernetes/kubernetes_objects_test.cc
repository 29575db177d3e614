// The objects a job is made of on Kubernetes, held to golden files (the pod of a role with
// every section key set, the owner and the Secret). After an intended change, rerun with
// SHOAL_UPDATE_GOLDEN=1 and review the diff.
#include "backends/kubernetes/kubernetes_objects.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "golden_files.h"
#include "common/files.h"
#include "spec/spec_parser.h"

namespace shoal::backends {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using golden::ExpectGolden;
using golden::GoldenPath;

constexpr char kJob[] = R"(name: digits
framework: pytorch
roles:
  worker:
    instances: 2
    command: [python3, train.py]
    resources: {cpus: 1.5, memory: 2GiB, gpus: 1}
  ps:
    command: [python3, ps.py]
    resources: {cpus: 0.5}
kubernetes:
  namespace: ml
  image: train:1
  image_pull_policy: Never
  priority_class: batch-low
  labels: {team: vision}
  annotations: {example.com/owner: ada}
  node_selector: {disk: ssd}
  tolerations: [{key: spot, operator: Exists, effect: NoSchedule}]
  volumes:
    - {name: code, host_path: /src/examples, mount_path: /src/examples, read_only: true}
  roles:
    worker:
      node_selector: {accelerator: gpu}
      tolerations: [{key: nvidia.com/gpu, operator: Exists}]
      volumes: [{name: scratch, empty_dir: {medium: Memory, size_limit: 512MiB}, mount_path: /scratch}]
    ps:
      image: cpu:1
)";

struct Fixture {
  spec::JobSpec job;
  const KubernetesConfig* config = nullptr;
  JobObjectsContext context;
  PodAgentArgs agent;
};

Fixture Make() {
  static const spec::JobSections sections = {KubernetesJobSection()};
  absl::StatusOr<spec::JobSpec> job = spec::ParseJobSpec(kJob, "job.yaml", "/src", sections);
  EXPECT_TRUE(job.ok()) << job.status();
  Fixture f;
  f.job = *job;
  f.config = &KubernetesConfigOf(f.job);
  f.context.job_id = "digits-20261205-120000-ab12";
  f.context.ns = "ml";
  f.context.job_object = JobObjectName(f.context.job_id);
  f.context.owner_uid = "0f6c1a52-1111-2222-3333-444455556666";
  f.context.task_image = f.config->image;
  f.context.image_pull_policy = f.config->image_pull_policy;
  f.context.agent_image = kDefaultAgentImage;
  f.agent.master_address = "10.0.2.15:41000";
  f.agent.ports = 2;
  f.agent.master_grace_ms = 10000;
  f.agent.heartbeat_interval_ms = 1000;
  f.agent.watchdog_ms = 31000;
  return f;
}

TEST(KubernetesObjects, PodOfAGpuWorker) {
  Fixture f = Make();
  ExpectGolden("pod_worker_1", TaskPod(f.job.roles[0], 1, 0, *f.config, f.context, f.agent));
}

TEST(KubernetesObjects, PodOfACpuRoleWithItsOwnImage) {
  Fixture f = Make();
  ExpectGolden("pod_ps_0_attempt_2", TaskPod(f.job.roles[1], 0, 2, *f.config, f.context, f.agent));
}

// With the agent on the node (kubernetes.agent_host_path): its directory mounted read-only
// where the init container's copy was, the same command, and no init container.
TEST(KubernetesObjects, PodWithTheAgentOnTheNode) {
  Fixture f = Make();
  f.context.agent_host_path = "/var/lib/shoal/agent";
  nlohmann::json pod = TaskPod(f.job.roles[0], 1, 0, *f.config, f.context, f.agent);
  ExpectGolden("pod_worker_1_agent_host_path", pod);
  EXPECT_FALSE(pod["spec"].contains("initContainers"));
  nlohmann::json without = TaskPod(f.job.roles[0], 1, 0, *f.config, Make().context, f.agent);
  EXPECT_EQ(pod["spec"]["containers"][0]["command"], without["spec"]["containers"][0]["command"]);
}

TEST(KubernetesObjects, OwnerAndSecret) {
  Fixture f = Make();
  ExpectGolden("owner", OwnerConfigMap(*f.config, f.context));
  ExpectGolden("secret", TokenSecret(*f.config, f.context, "s3cr3t-token-value"));
}

TEST(KubernetesObjects, TheTokenIsNeverInAPod) {
  Fixture f = Make();
  for (const spec::Role& role : f.job.roles) {
    std::string pod = TaskPod(role, 0, 0, *f.config, f.context, f.agent).dump();
    EXPECT_THAT(pod, HasSubstr("secretKeyRef"));
    EXPECT_THAT(pod, Not(HasSubstr("s3cr3t")));
  }
}

TEST(KubernetesObjects, NamesAreValidAndDistinct) {
  EXPECT_EQ(JobObjectName("digits-20261205-120000-ab12"), "shoal-digits-20261205-120000-ab12");
  EXPECT_EQ(JobObjectName("My_Job.v2-20261205-120000-ab12"),
            "shoal-my-job-v2-20261205-120000-ab12");
  std::string long_a = std::string(60, 'a') + "-20261205-120000-0001";
  std::string long_b = std::string(60, 'a') + "-20261205-120000-0002";
  EXPECT_LE(JobObjectName(long_a).size(), 45u);
  EXPECT_NE(JobObjectName(long_a), JobObjectName(long_b));
  EXPECT_TRUE(IsDnsLabel(JobObjectName(long_a))) << JobObjectName(long_a);
  EXPECT_EQ(PodName("shoal-x", "Eval_Role", 3, 1), "shoal-x-eval-role-3-1");
}

TEST(KubernetesObjects, Quantities) {
  EXPECT_EQ(CpuQuantity(1.5), "1500m");
  EXPECT_EQ(CpuQuantity(0.25), "250m");
  EXPECT_EQ(MemoryQuantity(2ull << 30), "2048Mi");
  EXPECT_EQ(MemoryQuantity(1000), "1000");
}

}  // namespace
}  // namespace shoal::backends
