// Whether a gang fits the cluster's free room: the check behind Shoal's gang admission.
#include "backends/kubernetes/gang_fit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shoal::backends {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

nlohmann::json Node(const std::string& name, const std::string& cpu, const std::string& memory,
                    int gpus = 0, nlohmann::json labels = nlohmann::json::object(),
                    nlohmann::json taints = nlohmann::json::array()) {
  nlohmann::json allocatable = {{"cpu", cpu}, {"memory", memory}, {"pods", "110"}};
  if (gpus > 0) allocatable["nvidia.com/gpu"] = std::to_string(gpus);
  return {{"metadata", {{"name", name}, {"labels", labels}}},
          {"spec", {{"taints", taints}}},
          {"status", {{"allocatable", allocatable}}}};
}

nlohmann::json Pod(const std::string& cpu, const std::string& memory, int gpus = 0,
                   const std::string& node = "") {
  nlohmann::json limits = {{"cpu", cpu}, {"memory", memory}};
  if (gpus > 0) limits["nvidia.com/gpu"] = gpus;
  nlohmann::json spec = {
      {"containers", {{{"name", "task"}, {"resources", {{"requests", {{"cpu", cpu}, {"memory", memory}}}, {"limits", limits}}}}}},
      {"initContainers",
       {{{"name", "shoal-agent"}, {"resources", {{"requests", {{"cpu", "10m"}, {"memory", "32Mi"}}}}}}}}};
  if (!node.empty()) spec["nodeName"] = node;
  return {{"spec", spec}};
}

TEST(GangFit, Quantities) {
  EXPECT_EQ(ParseQuantity("1500m", 1000), 1500);
  EXPECT_EQ(ParseQuantity("2", 1000), 2000);
  EXPECT_EQ(ParseQuantity("0.5", 1000), 500);
  EXPECT_EQ(ParseQuantity("2Gi"), 2147483648);
  EXPECT_EQ(ParseQuantity("24581384Ki"), 24581384LL * 1024);
  EXPECT_EQ(ParseQuantity("512M"), 512000000);
  EXPECT_EQ(ParseQuantity("1e3"), 1000);
  EXPECT_EQ(ParseQuantity("lots"), std::nullopt);
  EXPECT_EQ(ParseQuantity("-1"), std::nullopt);
}

TEST(GangFit, APodRequestsTheLargerOfItsContainersAndItsInitContainers) {
  PodRequest r = RequestOf(Pod("1500m", "2Gi", 1));
  EXPECT_EQ(r, (PodRequest{1500, 2147483648, 1}));
}

TEST(GangFit, AGangFitsWhatIsFreeAfterTheBoundPods) {
  std::vector<nlohmann::json> nodes = {Node("a", "2", "8Gi"), Node("b", "2", "8Gi")};
  std::vector<nlohmann::json> bound = {Pod("1500m", "1Gi", 0, "a")};
  // 3 x 1 cpu: one fits on a's remaining 0.5? no; b takes two, a none: 2 of 3.
  GangFit three = FitGang(nodes, bound, {Pod("1", "1Gi"), Pod("1", "1Gi"), Pod("1", "1Gi")});
  EXPECT_FALSE(three.fits);
  EXPECT_THAT(three.reason, HasSubstr("0/2 nodes are available: 2 Insufficient cpu. The gang of "
                                      "3 pods (3.00 cpus, 3.0 GiB in all) does not fit now: 2 of "
                                      "them would; free: a 0.50 cpus"));
  GangFit two = FitGang(nodes, bound, {Pod("1", "1Gi"), Pod("1", "1Gi")});
  EXPECT_TRUE(two.fits);
  EXPECT_THAT(two.nodes, ElementsAre("b", "b"));
}

TEST(GangFit, PodsOfLowerPriorityAreRoomTheSchedulerWillPreempt) {
  std::vector<nlohmann::json> nodes = {Node("a", "2", "8Gi")};
  nlohmann::json low = Pod("1500m", "1Gi", 0, "a");
  low["spec"]["priority"] = 100;
  nlohmann::json gang_pod = Pod("1", "1Gi");
  gang_pod["spec"]["priority"] = 100;
  EXPECT_FALSE(FitGang(nodes, {low}, {gang_pod}).fits);  // equal priority: no preemption
  gang_pod["spec"]["priority"] = 1000;
  EXPECT_TRUE(FitGang(nodes, {low}, {gang_pod}).fits);
}

TEST(GangFit, LargestPodsGoFirst) {
  // First fit in the given order would put the small pod on a and leave no room for the big one.
  std::vector<nlohmann::json> nodes = {Node("a", "4", "8Gi"), Node("b", "1", "8Gi")};
  GangFit fit = FitGang(nodes, {}, {Pod("1", "1Gi"), Pod("4", "1Gi")});
  EXPECT_TRUE(fit.fits);
  EXPECT_THAT(fit.nodes, ElementsAre("b", "a"));
}

TEST(GangFit, GpusSelectorsTaintsAndCordons) {
  nlohmann::json gpu_node = Node("gpu", "8", "64Gi", 2, {{"accelerator", "gpu"}},
                                 {{{"key", "nvidia.com/gpu"}, {"effect", "NoSchedule"}}});
  nlohmann::json cordoned = Node("off", "64", "256Gi");
  cordoned["spec"]["unschedulable"] = true;
  std::vector<nlohmann::json> nodes = {gpu_node, cordoned, Node("cpu", "8", "64Gi")};
  nlohmann::json gpu_pod = Pod("1", "1Gi", 1);
  // The taint keeps it off without a toleration.
  EXPECT_FALSE(FitGang(nodes, {}, {gpu_pod}).fits);
  gpu_pod["spec"]["tolerations"] = {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}}};
  EXPECT_TRUE(FitGang(nodes, {}, {gpu_pod, gpu_pod}).fits);
  EXPECT_FALSE(FitGang(nodes, {}, {gpu_pod, gpu_pod, gpu_pod}).fits);  // 2 GPUs only
  nlohmann::json picky = Pod("1", "1Gi");
  picky["spec"]["nodeSelector"] = {{"accelerator", "tpu"}};
  GangFit none = FitGang(nodes, {}, {picky});
  EXPECT_FALSE(none.fits);
  EXPECT_THAT(none.reason, HasSubstr("0/2 nodes are available: 2 node(s) didn't match Pod's node "
                                     "affinity/selector."));
  // The cordoned node is not counted as free room.
  EXPECT_THAT(none.reason, Not(HasSubstr("off ")));
}

}  // namespace
}  // namespace shoal::backends
