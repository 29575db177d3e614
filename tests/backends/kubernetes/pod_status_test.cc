// What a pod's status means for Shoal, on objects shaped as the API server sends them.
#include "backends/kubernetes/pod_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shoal::backends {
namespace {

using ::testing::HasSubstr;
using State = PodObservation::State;

nlohmann::json Pod(nlohmann::json status, nlohmann::json spec = nlohmann::json::object()) {
  return {{"metadata",
           {{"name", "shoal-j-worker-1-2"},
            {"annotations", {{"shoal.io/place", "worker.1"}, {"shoal.io/attempt", "2"}}}}},
          {"spec", spec},
          {"status", status}};
}

TEST(PodStatus, NamesThePlaceAndAttempt) {
  PodObservation seen = ObservePod(Pod({{"phase", "Pending"}}));
  EXPECT_EQ(seen.name, "shoal-j-worker-1-2");
  EXPECT_EQ(seen.place, "worker.1");
  EXPECT_EQ(seen.attempt, 2u);
  EXPECT_EQ(seen.state, State::kWaiting);
  EXPECT_EQ(seen.reason, "");
}

TEST(PodStatus, UnschedulableCarriesTheSchedulersWords) {
  PodObservation seen = ObservePod(Pod(
      {{"phase", "Pending"},
       {"conditions",
        {{{"type", "PodScheduled"},
          {"status", "False"},
          {"reason", "Unschedulable"},
          {"message", "0/1 nodes are available: 1 Insufficient cpu."}}}}}));
  EXPECT_EQ(seen.state, State::kWaiting);
  EXPECT_EQ(seen.reason, "0/1 nodes are available: 1 Insufficient cpu.");
}

TEST(PodStatus, BoundToANodeIsScheduled) {
  PodObservation seen =
      ObservePod(Pod({{"phase", "Pending"}}, {{"nodeName", "localhost"}}));
  EXPECT_EQ(seen.state, State::kScheduled);
  EXPECT_EQ(seen.node, "localhost");
}

TEST(PodStatus, AnImageThatCannotBePulledCannotStart) {
  PodObservation seen = ObservePod(Pod(
      {{"phase", "Pending"},
       {"containerStatuses",
        {{{"name", "task"},
          {"image", "localhost/nope:1"},
          {"state",
           {{"waiting",
             {{"reason", "ErrImageNeverPull"},
              {"message", "Container image \"localhost/nope:1\" is not present with pull "
                          "policy of Never"}}}}}}}}},
      {{"nodeName", "localhost"}}));
  EXPECT_EQ(seen.state, State::kCannotStart);
  EXPECT_THAT(seen.reason, HasSubstr("the task container (image localhost/nope:1) cannot "
                                     "start: ErrImageNeverPull: Container image"));
}

TEST(PodStatus, AFailedAgentInstallCannotStart) {
  PodObservation seen = ObservePod(Pod(
      {{"phase", "Pending"},
       {"initContainerStatuses",
        {{{"name", "shoal-agent"},
          {"image", "localhost/shoal-agent:latest"},
          {"state", {{"terminated", {{"exitCode", 1}, {"reason", "Error"}}}}}}}}},
      {{"nodeName", "localhost"}}));
  EXPECT_EQ(seen.state, State::kCannotStart);
  EXPECT_THAT(seen.reason,
              HasSubstr("installing Shoal's agent from localhost/shoal-agent:latest failed: "
                        "exit code 1"));
}

TEST(PodStatus, AnOomKilledAgentContainerEnded) {
  PodObservation seen = ObservePod(Pod(
      {{"phase", "Failed"},
       {"containerStatuses",
        {{{"name", "task"},
          {"state", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}},
      {{"nodeName", "localhost"}}));
  EXPECT_EQ(seen.state, State::kEnded);
  EXPECT_TRUE(seen.agent_exited);
  EXPECT_FALSE(seen.preempted);
  EXPECT_THAT(seen.reason, HasSubstr("agent container ended: OOMKilled (exit code 137)"));
}

TEST(PodStatus, AnEvictedPodWasTakenAway) {
  PodObservation seen = ObservePod(Pod(
      {{"phase", "Failed"},
       {"reason", "Evicted"},
       {"message", "The node was low on resource: memory."}},
      {{"nodeName", "localhost"}}));
  EXPECT_EQ(seen.state, State::kEnded);
  EXPECT_TRUE(seen.preempted);
  EXPECT_THAT(seen.reason, HasSubstr("failed: Evicted: The node was low on resource: memory."));
}

TEST(PodStatus, APreemptedPodSaysByWhom) {
  nlohmann::json pod = Pod(
      {{"phase", "Running"},
       {"conditions",
        {{{"type", "DisruptionTarget"},
          {"status", "True"},
          {"reason", "PreemptionByScheduler"},
          {"message", "default-scheduler: preempting to accommodate a higher priority pod"}}}}},
      {{"nodeName", "localhost"}});
  pod["metadata"]["deletionTimestamp"] = "2026-12-05T12:00:00Z";
  // Its agent is still stopping its task; the place is lost once the pod is gone.
  PodObservation seen = ObservePod(pod);
  EXPECT_EQ(seen.state, State::kEnding);
  EXPECT_TRUE(seen.preempted);
  EXPECT_THAT(seen.reason, HasSubstr("was taken away (PreemptionByScheduler: default-scheduler: "
                                     "preempting to accommodate a higher priority pod)"));
  PodObservation gone = ObservePod(pod, /*deleted=*/true);
  EXPECT_EQ(gone.state, State::kEnded);
  EXPECT_EQ(gone.reason, seen.reason);
}

TEST(PodStatus, ADeletedPodEnded) {
  PodObservation deleting = ObservePod(
      [] {
        nlohmann::json pod = Pod({{"phase", "Running"}}, {{"nodeName", "localhost"}});
        pod["metadata"]["deletionTimestamp"] = "2026-12-05T12:00:00Z";
        return pod;
      }());
  EXPECT_EQ(deleting.state, State::kEnding);
  EXPECT_THAT(deleting.reason, HasSubstr("is being deleted"));
  PodObservation gone =
      ObservePod(Pod({{"phase", "Running"}}, {{"nodeName", "localhost"}}), /*deleted=*/true);
  EXPECT_EQ(gone.state, State::kEnded);
  EXPECT_THAT(gone.reason, HasSubstr("was deleted"));
}

TEST(PodStatus, AnotherPodIsNotShoals) {
  PodObservation seen = ObservePod({{"metadata", {{"name", "web"}}}, {"status", {}}});
  EXPECT_EQ(seen.place, "");
}

}  // namespace
}  // namespace shoal::backends

namespace shoal::backends {
namespace {

nlohmann::json MountEvent(const std::string& message, int count) {
  return {{"reason", "FailedMount"},
          {"count", count},
          {"message", message},
          {"involvedObject", {{"kind", "Pod"}, {"name", "shoal-j-worker-0-0"}}}};
}

TEST(MountFailure, AMissingHostPathIsPermanentAtOnce) {
  auto failure = ObserveMountFailure(MountEvent(
      "MountVolume.SetUp failed for volume \"shoal-agent\" : hostPath type check failed: "
      "/var/lib/shoal/agent is not a directory", 1));
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->pod, "shoal-j-worker-0-0");
  EXPECT_EQ(failure->reason,
            "pod shoal-j-worker-0-0 cannot mount its volumes: MountVolume.SetUp failed for "
            "volume \"shoal-agent\" : hostPath type check failed: /var/lib/shoal/agent is not a "
            "directory");
}

TEST(MountFailure, AFirstOtherFailureIsTransientUntilRetriedFourTimes) {
  const std::string message =
      "MountVolume.SetUp failed for volume \"kube-api-access-x\" : object \"ns\"/"
      "\"kube-root-ca.crt\" not registered";
  EXPECT_FALSE(ObserveMountFailure(MountEvent(message, 1)).has_value());
  EXPECT_FALSE(ObserveMountFailure(MountEvent(message, 3)).has_value());
  EXPECT_TRUE(ObserveMountFailure(MountEvent(message, 4)).has_value());
  nlohmann::json series = MountEvent(message, 1);
  series["series"] = {{"count", 5}};
  EXPECT_TRUE(ObserveMountFailure(series).has_value());
}

TEST(MountFailure, OtherEventsAreNotMountFailures) {
  nlohmann::json scheduling = MountEvent("hostPath type check failed", 1);
  scheduling["reason"] = "FailedScheduling";
  EXPECT_FALSE(ObserveMountFailure(scheduling).has_value());
  nlohmann::json node = MountEvent("hostPath type check failed", 1);
  node["involvedObject"]["kind"] = "Node";
  EXPECT_FALSE(ObserveMountFailure(node).has_value());
  EXPECT_FALSE(ObserveMountFailure(nlohmann::json::array()).has_value());
}

}  // namespace
}  // namespace shoal::backends
