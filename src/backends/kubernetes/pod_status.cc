#include "backends/kubernetes/pod_status.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shoal::backends {
namespace {

// Waiting reasons after which a container does not start without someone changing something.
const std::set<std::string>& CannotStartReasons() {
  static const std::set<std::string> reasons = {
      "ErrImagePull",          "ImagePullBackOff",   "ErrImageNeverPull", "InvalidImageName",
      "ImageInspectError",     "CreateContainerConfigError", "CreateContainerError",
      "RunContainerError",     "PreCreateHookError", "PostStartHookError"};
  return reasons;
}

std::string Str(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const nlohmann::json& Field(const nlohmann::json& object, const char* key) {
  static const nlohmann::json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

// "OOMKilled (exit code 137)", "exit code 3", "killed by signal 9".
std::string Termination(const nlohmann::json& terminated) {
  std::string reason = Str(terminated, "reason");
  int exit_code = Field(terminated, "exitCode").is_number() ? Field(terminated, "exitCode").get<int>() : 0;
  int signal = Field(terminated, "signal").is_number() ? Field(terminated, "signal").get<int>() : 0;
  std::string how = signal != 0 ? absl::StrCat("killed by signal ", signal)
                                : absl::StrCat("exit code ", exit_code);
  std::string message = Str(terminated, "message");
  std::string out = reason.empty() || reason == "Error" || reason == "Completed"
                        ? how
                        : absl::StrCat(reason, " (", how, ")");
  if (!message.empty()) absl::StrAppend(&out, ": ", message);
  return out;
}

}  // namespace

PodObservation ObservePod(const nlohmann::json& pod, bool deleted) {
  PodObservation out;
  const nlohmann::json& meta = Field(pod, "metadata");
  const nlohmann::json& spec = Field(pod, "spec");
  const nlohmann::json& status = Field(pod, "status");
  out.name = Str(meta, "name");
  const nlohmann::json& annotations = Field(meta, "annotations");
  out.place = Str(annotations, "shoal.io/place");
  (void)absl::SimpleAtoi(Str(annotations, "shoal.io/attempt"), &out.attempt);
  out.node = Str(spec, "nodeName");

  std::string disruption;  // why the pod is being taken away, when Kubernetes says
  std::string scheduler_message;
  bool unschedulable = false;
  for (const nlohmann::json& c : Field(status, "conditions").is_array()
                                      ? Field(status, "conditions")
                                      : nlohmann::json::array()) {
    std::string type = Str(c, "type");
    if (type == "DisruptionTarget" && Str(c, "status") == "True") {
      disruption = Str(c, "reason");
      std::string message = Str(c, "message");
      if (!message.empty()) absl::StrAppend(&disruption, ": ", message);
      out.preempted = true;
    } else if (type == "PodScheduled" && Str(c, "status") == "False") {
      unschedulable = Str(c, "reason") == "Unschedulable";
      scheduler_message = Str(c, "message");
    }
  }

  const std::string phase = Str(status, "phase");
  const bool deleting = deleted || Field(meta, "deletionTimestamp").is_string();
  if (phase == "Failed" || phase == "Succeeded" || deleting) {
    out.state = PodObservation::State::kEnded;
    std::string pod_reason = Str(status, "reason");  // Evicted, NodeLost, Preempting, ...
    std::string pod_message = Str(status, "message");
    std::string container;
    for (const nlohmann::json& cs : Field(status, "containerStatuses").is_array()
                                        ? Field(status, "containerStatuses")
                                        : nlohmann::json::array()) {
      const nlohmann::json& terminated = Field(Field(cs, "state"), "terminated");
      if (terminated.is_object()) container = Termination(terminated);
    }
    if (!disruption.empty()) {
      out.reason = absl::StrCat("pod ", out.name, " was taken away (", disruption, ")");
    } else if (!pod_reason.empty()) {
      out.preempted = pod_reason == "Evicted" || pod_reason == "Preempting";
      out.reason = absl::StrCat("pod ", out.name, " ", phase == "Failed" ? "failed" : "ended",
                                ": ", pod_reason, pod_message.empty() ? "" : ": ", pod_message);
    } else if (!container.empty()) {
      out.agent_exited = true;
      out.reason = absl::StrCat("pod ", out.name, "'s agent container ended: ", container);
    } else if (deleting) {
      out.reason = absl::StrCat("pod ", out.name, " was deleted");
    } else {
      out.reason = absl::StrCat("pod ", out.name, " ended (", phase, ")");
    }
    if (deleting && !deleted && phase != "Failed" && phase != "Succeeded") {
      // Its agent got SIGTERM and is stopping its task: the place is lost once the agent is
      // gone, not before (a new pod's agent would find the old one still registered).
      out.state = PodObservation::State::kEnding;
      if (disruption.empty() && pod_reason.empty()) {
        out.reason = absl::StrCat("pod ", out.name, " is being deleted");
      }
    }
    return out;
  }

  // Started or not: an init container (the agent's install) or the task container that will
  // not start by itself.
  auto cannot_start = [&](const char* list, const char* what) -> bool {
    const nlohmann::json& statuses = Field(status, list);
    if (!statuses.is_array()) return false;
    for (const nlohmann::json& cs : statuses) {
      const nlohmann::json& state = Field(cs, "state");
      const nlohmann::json& waiting = Field(state, "waiting");
      std::string image = Str(cs, "image");
      if (waiting.is_object() && CannotStartReasons().count(Str(waiting, "reason")) > 0) {
        out.state = PodObservation::State::kCannotStart;
        out.reason = absl::StrCat("pod ", out.name, ": the ", what, " (image ", image,
                                  ") cannot start: ", Str(waiting, "reason"));
        std::string message = Str(waiting, "message");
        if (!message.empty()) absl::StrAppend(&out.reason, ": ", message);
        return true;
      }
      const nlohmann::json& terminated = Field(state, "terminated");
      if (std::string(list) == "initContainerStatuses" && terminated.is_object() &&
          Field(terminated, "exitCode").is_number() && Field(terminated, "exitCode").get<int>() != 0) {
        out.state = PodObservation::State::kCannotStart;
        out.reason = absl::StrCat("pod ", out.name, ": installing Shoal's agent from ", image,
                                  " failed: ", Termination(terminated));
        return true;
      }
    }
    return false;
  };
  if (cannot_start("initContainerStatuses", "agent's init container") ||
      cannot_start("containerStatuses", "task container")) {
    return out;
  }
  if (!out.node.empty()) {
    out.state = PodObservation::State::kScheduled;
    out.running = phase == "Running";
    return out;
  }
  out.state = PodObservation::State::kWaiting;
  if (unschedulable) out.reason = scheduler_message;
  return out;
}

std::optional<MountFailure> ObserveMountFailure(const nlohmann::json& event) {
  if (!event.is_object() || Str(event, "reason") != "FailedMount") return std::nullopt;
  const nlohmann::json& object = Field(event, "involvedObject");
  if (Str(object, "kind") != "Pod" || Str(object, "name").empty()) return std::nullopt;
  std::string message = Str(event, "message");
  int64_t count = 1;
  if (Field(event, "count").is_number_integer()) count = Field(event, "count").get<int64_t>();
  const nlohmann::json& series = Field(event, "series");
  if (Field(series, "count").is_number_integer()) {
    count = std::max(count, Field(series, "count").get<int64_t>());
  }
  bool permanent = absl::StrContains(message, "type check failed") || count >= 4;
  if (!permanent) return std::nullopt;
  return MountFailure{Str(object, "name"),
                      absl::StrCat("pod ", Str(object, "name"), " cannot mount its volumes: ",
                                   message)};
}

}  // namespace shoal::backends
