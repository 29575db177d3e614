// The `kubernetes:` section of the job file: what it accepts, and a message naming
// file:line:key for every way it can be wrong.
#include "backends/kubernetes/kubernetes_section.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/spec_parser.h"

namespace shoal::backends {
namespace {

using ::testing::HasSubstr;

const spec::JobSections& Sections() {
  static const spec::JobSections sections = {KubernetesJobSection()};
  return sections;
}

constexpr char kHead[] =
    "name: k\n"
    "roles:\n"
    "  worker: {command: [python3, train.py], instances: 2}\n"
    "  ps: {command: [python3, ps.py]}\n";

absl::StatusOr<spec::JobSpec> Parse(const std::string& section) {
  return spec::ParseJobSpec(std::string(kHead) + section, "job.yaml", "/jobs", Sections());
}

std::string Refusal(const std::string& section) {
  absl::StatusOr<spec::JobSpec> job = Parse(section);
  EXPECT_FALSE(job.ok()) << "accepted:\n" << section;
  if (job.ok()) return "";
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(job.status().message());
}

TEST(KubernetesSection, EveryKeyIsRead) {
  absl::StatusOr<spec::JobSpec> job = Parse(
      "kubernetes:\n"
      "  namespace: ml-team\n"
      "  image: registry.example.com/train:1.2\n"
      "  image_pull_policy: IfNotPresent\n"
      "  agent_image: localhost/shoal-agent:test\n"
      "  agent_host_path: /var/lib/shoal/agent-v2\n"
      "  service_account: trainer\n"
      "  node_selector: {disk: ssd}\n"
      "  tolerations:\n"
      "    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n"
      "    - {key: spot, value: 'yes', effect: NoExecute, toleration_seconds: 30}\n"
      "  priority_class: batch-low\n"
      "  labels: {team: vision}\n"
      "  annotations: {example.com/owner: 'Ada Lovelace'}\n"
      "  host_network: true\n"
      "  volumes:\n"
      "    - {name: data, host_path: /data, mount_path: /data, read_only: true}\n"
      "    - {name: ckpt, persistent_volume_claim: ckpt-claim, mount_path: /ckpt}\n"
      "    - {name: conf, config_map: train-conf, mount_path: /etc/train}\n"
      "    - {name: scratch, empty_dir: {medium: Memory, size_limit: 1GiB}, mount_path: /scratch}\n"
      "  roles:\n"
      "    ps:\n"
      "      image: cpu-image:1\n"
      "      node_selector: {pool: cpu}\n"
      "      volumes: [{name: ps-cache, empty_dir: {}, mount_path: /cache}]\n");
  ASSERT_TRUE(job.ok()) << job.status();
  const KubernetesConfig& c = KubernetesConfigOf(*job);
  EXPECT_EQ(c.namespace_, "ml-team");
  EXPECT_EQ(c.image, "registry.example.com/train:1.2");
  EXPECT_EQ(c.image_pull_policy, "IfNotPresent");
  EXPECT_EQ(c.agent_image, "localhost/shoal-agent:test");
  EXPECT_EQ(c.agent_host_path, "/var/lib/shoal/agent-v2");
  EXPECT_EQ(c.service_account, "trainer");
  EXPECT_EQ(c.node_selector.at("disk"), "ssd");
  ASSERT_EQ(c.tolerations.size(), 2u);
  EXPECT_EQ(c.tolerations[0].op, "Exists");
  EXPECT_EQ(c.tolerations[1].op, "Equal");
  EXPECT_EQ(c.tolerations[1].value, "yes");
  EXPECT_EQ(c.tolerations[1].toleration_seconds, 30);
  EXPECT_EQ(c.priority_class, "batch-low");
  EXPECT_EQ(c.labels.at("team"), "vision");
  EXPECT_EQ(c.annotations.at("example.com/owner"), "Ada Lovelace");
  EXPECT_TRUE(c.host_network);
  ASSERT_EQ(c.volumes.size(), 4u);
  EXPECT_EQ(c.volumes[0].source, KubeVolume::Source::kHostPath);
  EXPECT_TRUE(c.volumes[0].read_only);
  EXPECT_EQ(c.volumes[1].source_name, "ckpt-claim");
  EXPECT_EQ(c.volumes[2].source, KubeVolume::Source::kConfigMap);
  EXPECT_EQ(c.volumes[3].empty_dir_medium, "Memory");
  EXPECT_EQ(c.volumes[3].size_limit, 1ull << 30);
  ASSERT_EQ(c.roles.count("ps"), 1u);
  EXPECT_EQ(c.roles.at("ps").image, "cpu-image:1");
  EXPECT_EQ(c.roles.at("ps").node_selector.at("pool"), "cpu");
  EXPECT_EQ(c.roles.at("ps").volumes.at(0).name, "ps-cache");
}

TEST(KubernetesSection, AbsentGivesTheDefaults) {
  absl::StatusOr<spec::JobSpec> job = Parse("");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(KubernetesConfigOf(*job).image, "");
  EXPECT_EQ(KubernetesConfigOf(*job).agent_host_path, "");
  EXPECT_FALSE(KubernetesConfigOf(*job).host_network);
}

TEST(KubernetesSection, EachMistakeIsNamedWithItsLine) {
  struct Case {
    std::string section;
    std::string message;
  };
  const Case cases[] = {
      {"kubernetes: gpu\n", "job.yaml:5: kubernetes: must be a map with"},
      {"kubernetes: {namespce: ml}\n", "job.yaml:5: kubernetes.namespce: unknown key"},
      {"kubernetes: {namespace: ML_team}\n",
       "job.yaml:5: kubernetes.namespace: must be a Kubernetes namespace"},
      {"kubernetes: {image: 'train 1'}\n",
       "job.yaml:5: kubernetes.image: must be a container image reference"},
      {"kubernetes: {image_pull_policy: always}\n",
       "job.yaml:5: kubernetes.image_pull_policy: must be one of Always, IfNotPresent, Never"},
      {"kubernetes: {agent_host_path: var/lib/shoal}\n",
       "job.yaml:5: kubernetes.agent_host_path: must be an absolute path on the nodes"},
      {"kubernetes:\n  agent_host_path: /var/lib/../shoal\n",
       "job.yaml:6: kubernetes.agent_host_path: must be an absolute path on the nodes"},
      {"kubernetes: {service_account: Trainer}\n",
       "job.yaml:5: kubernetes.service_account: must be a Kubernetes object name"},
      {"kubernetes: {host_network: yes-please}\n",
       "job.yaml:5: kubernetes.host_network: must be true or false"},
      {"kubernetes:\n  labels: {shoal.io/job: x}\n",
       "job.yaml:6: kubernetes.labels.shoal.io/job: keys under shoal.io/ are Shoal's own"},
      {"kubernetes:\n  labels: {team: 'a b'}\n",
       "job.yaml:6: kubernetes.labels.team: must be a label value"},
      {"kubernetes:\n  node_selector: [ssd]\n",
       "job.yaml:6: kubernetes.node_selector: must be a map with keys and text values"},
      {"kubernetes:\n  tolerations: {key: gpu}\n",
       "job.yaml:6: kubernetes.tolerations: must be a list of tolerations"},
      {"kubernetes:\n  tolerations:\n    - {key: gpu, operator: Maybe}\n",
       "job.yaml:7: kubernetes.tolerations[0].operator: must be Equal or Exists"},
      {"kubernetes:\n  tolerations:\n    - {operator: Exists, value: x}\n",
       "job.yaml:7: kubernetes.tolerations[0].value: must not be given with operator Exists"},
      {"kubernetes:\n  tolerations:\n    - {key: a, effect: NoSchedule, toleration_seconds: 5}\n",
       "job.yaml:7: kubernetes.tolerations[0].toleration_seconds: only applies with effect: "
       "NoExecute"},
      {"kubernetes:\n  volumes:\n    - {name: data, mount_path: /data}\n",
       "job.yaml:7: kubernetes.volumes[0].name: needs one source"},
      {"kubernetes:\n  volumes:\n    - {name: d, host_path: /a, config_map: c, mount_path: /d}\n",
       "job.yaml:7: kubernetes.volumes[0].config_map: has more than one source (host_path, "
       "config_map)"},
      {"kubernetes:\n  volumes:\n    - {name: d, host_path: data, mount_path: /d}\n",
       "job.yaml:7: kubernetes.volumes[0].host_path: must be an absolute path on the node"},
      {"kubernetes:\n  volumes:\n    - {name: d, host_path: /d}\n",
       "job.yaml:7: kubernetes.volumes[0].mount_path: required"},
      {"kubernetes:\n  volumes:\n    - {name: d, host_path: /d, mount_path: /opt/shoal/x}\n",
       "job.yaml:7: kubernetes.volumes[0].mount_path: /opt/shoal is where Shoal mounts its agent"},
      {"kubernetes:\n  volumes:\n"
       "    - {name: d, host_path: /d, mount_path: /d}\n"
       "    - {name: d, host_path: /e, mount_path: /e}\n",
       "job.yaml:8: kubernetes.volumes[1].name: volume 'd' is defined twice"},
      {"kubernetes:\n  volumes:\n"
       "    - {name: d, host_path: /d, mount_path: /d}\n"
       "    - {name: e, host_path: /e, mount_path: /d}\n",
       "job.yaml:8: kubernetes.volumes[1].mount_path: two volumes are mounted at /d"},
      {"kubernetes:\n  volumes:\n    - {name: d, empty_dir: {medium: Disk}, mount_path: /d}\n",
       "job.yaml:7: kubernetes.volumes[0].empty_dir.medium: must be Memory"},
      {"kubernetes:\n  volumes:\n    - {name: d, host_path: /d, mount_path: /d, read_only: 1}\n",
       "job.yaml:7: kubernetes.volumes[0].read_only: must be true or false"},
      {"kubernetes:\n  roles:\n    evaluator: {image: x}\n",
       "job.yaml:7: kubernetes.roles.evaluator: no such role in roles; the job's roles are "
       "worker, ps"},
      {"kubernetes:\n  roles:\n    worker: {imgae: x}\n",
       "job.yaml:7: kubernetes.roles.worker.imgae: unknown key"},
      {"kubernetes:\n  volumes: [{name: d, host_path: /d, mount_path: /d}]\n"
       "  roles:\n    worker:\n      volumes: [{name: d, empty_dir: {}, mount_path: /w}]\n",
       "kubernetes.roles.worker.volumes: volume 'd' at /w clashes with kubernetes.volumes' 'd'"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Refusal(c.section), HasSubstr(c.message)) << c.section;
  }
}

TEST(KubernetesSection, NameRules) {
  EXPECT_TRUE(IsDnsLabel("ml-team"));
  EXPECT_FALSE(IsDnsLabel("-ml"));
  EXPECT_FALSE(IsDnsLabel(std::string(64, 'a')));
  EXPECT_TRUE(IsDnsSubdomain("a.b-c"));
  EXPECT_FALSE(IsDnsSubdomain("a..b"));
  EXPECT_TRUE(IsQualifiedName("example.com/team"));
  EXPECT_FALSE(IsQualifiedName("Example.com/team"));
  EXPECT_TRUE(IsLabelValue(""));
  EXPECT_FALSE(IsLabelValue("a b"));
  EXPECT_TRUE(IsAgentHostPath("/var/lib/shoal/agent"));
  EXPECT_TRUE(IsAgentHostPath("/a"));
  EXPECT_FALSE(IsAgentHostPath("/"));
  EXPECT_FALSE(IsAgentHostPath("/var/lib/"));
  EXPECT_FALSE(IsAgentHostPath("/var//lib"));
  EXPECT_FALSE(IsAgentHostPath("/var/./lib"));
  EXPECT_FALSE(IsAgentHostPath("relative/dir"));
}

}  // namespace
}  // namespace shoal::backends
