#include "backends/yarn/yarn_request.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

std::vector<NodeGrant> YarnPlaces(const spec::JobSpec& job) {
  std::vector<NodeGrant> places;
  for (const auto& role : job.roles) {
    for (uint32_t i = 0; i < role.instances; ++i) {
      NodeGrant g;
      g.name = absl::StrCat(role.name, ".", i);
      g.for_task = absl::StrCat(role.name, ":", i);
      g.cpus = YarnContainerVcores(role.resources);
      g.memory_bytes = role.resources.memory_bytes;
      // YARN's GPU plugin (where a cluster has one) sets CUDA_VISIBLE_DEVICES in the container;
      // the agent reports what it sees there.
      g.gpus_from_agent = role.resources.gpus > 0;
      g.gpu_count = role.resources.gpus;
      places.push_back(std::move(g));
    }
  }
  return places;
}

uint64_t YarnContainerMemoryMb(const spec::Resources& resources) {
  uint64_t task_mb = resources.memory_bytes == 0
                         ? kDefaultTaskMemoryMb
                         : (resources.memory_bytes + (1ull << 20) - 1) >> 20;
  return task_mb + kAgentHeadroomMb;
}

uint32_t YarnContainerVcores(const spec::Resources& resources) {
  return static_cast<uint32_t>(std::max(1.0, std::ceil(resources.cpus)));
}

std::string YarnShellCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& word : argv) {
    if (!out.empty()) out += ' ';
    if (absl::StrContains(word, "{{")) {
      out += '"';
      for (char c : word) {
        if (c == '"' || c == '\\' || c == '`') out += '\\';
        out += c;
      }
      out += '"';
      continue;
    }
    out += '\'';
    for (char c : word) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

std::string YarnAmConfigJson(const std::vector<YarnAmPlace>& places, uint64_t idle_timeout_ms) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : places) {
    list.push_back({{"name", p.name},
                    {"memory_mb", p.memory_mb},
                    {"vcores", p.vcores},
                    {"gpus", p.gpus},
                    {"node_label", p.node_label},
                    {"command", p.command}});
  }
  return nlohmann::json{{"places", list}, {"idle_timeout_ms", idle_timeout_ms}}.dump();
}

std::string YarnSubmissionJson(const YarnSubmission& s) {
  nlohmann::json body = {
      {"application-id", s.application_id},
      {"application-name", s.name},
      {"application-type", "SHOAL"},
      // One attempt: a second AM would start a second gang next to the agents of the first;
      // a lost AM is a lost job, which the master handles (docs/backends/yarn.md).
      {"max-app-attempts", 1},
      {"keep-containers-across-application-attempts", false},
      {"unmanaged-AM", false},
      {"resource", {{"memory", s.am_memory_mb}, {"vCores", s.am_vcores}}},
      {"am-container-spec",
       {{"commands", {{"command", s.am_command}}},
        {"environment",
         {{"entry", nlohmann::json::array({{{"key", "SHOAL_AM_KEY"}, {"value", s.am_key}}})}}}}},
  };
  if (!s.queue.empty()) body["queue"] = s.queue;
  if (!s.node_label.empty()) {
    body["app-node-label-expression"] = s.node_label;
    body["am-container-node-label-expression"] = s.node_label;
  }
  return body.dump();
}

std::string DefaultYarnAmClasspath(const std::string& conf_dir) {
  std::string cp = conf_dir.empty() ? "{{HADOOP_CONF_DIR}}" : conf_dir;
  for (const char* dir : {"{{HADOOP_COMMON_HOME}}/share/hadoop/common",
                          "{{HADOOP_HDFS_HOME}}/share/hadoop/hdfs",
                          "{{HADOOP_YARN_HOME}}/share/hadoop/yarn"}) {
    absl::StrAppend(&cp, ":", dir, "/*:", dir, "/lib/*");
  }
  return cp;
}

absl::StatusOr<std::string> NormalizeRmWebAddress(const std::string& address) {
  absl::string_view rest = address;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ResourceManager's web address must be http://HOST:PORT, got '", address, "'"));
  }
  while (absl::ConsumeSuffix(&rest, "/")) {
  }
  size_t colon = rest.rfind(':');
  uint32_t port = 0;
  if (rest.empty() || colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(rest.substr(colon + 1), &port) || port == 0 || port > 65535 ||
      absl::StrContains(rest, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ResourceManager's web address must be http://HOST:PORT, got '", address, "'"));
  }
  return absl::StrCat("http://", rest);
}

}  // namespace shoal::backends
