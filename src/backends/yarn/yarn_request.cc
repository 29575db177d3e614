#include "backends/yarn/yarn_request.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
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

namespace {

nlohmann::json LocalResourcesJson(const std::vector<YarnLocalResource>& resources) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& r : resources) {
    list.push_back({{"name", r.name}, {"url", r.url}, {"size", r.size},
                    {"timestamp", r.timestamp}});
  }
  return list;
}

}  // namespace

std::string YarnAmConfigJson(const std::vector<YarnAmPlace>& places, uint64_t idle_timeout_ms,
                             const std::vector<YarnLocalResource>& agent_resources,
                             const std::string& staging_dir) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : places) {
    list.push_back({{"name", p.name},
                    {"memory_mb", p.memory_mb},
                    {"vcores", p.vcores},
                    {"gpus", p.gpus},
                    {"node_label", p.node_label},
                    {"command", p.command}});
  }
  return nlohmann::json{{"places", list},
                        {"idle_timeout_ms", idle_timeout_ms},
                        {"agent_resources", LocalResourcesJson(agent_resources)},
                        {"staging_dir", staging_dir}}
      .dump();
}

std::string YarnSubmissionJson(const YarnSubmission& s) {
  nlohmann::json environment =
      nlohmann::json::array({{{"key", "SHOAL_AM_KEY"}, {"value", s.am_key}}});
  if (!s.am_classpath.empty()) {
    environment.push_back({{"key", "CLASSPATH"}, {"value", s.am_classpath}});
  }
  // The REST API's LocalResourceInfo: the NodeManager checks size and timestamp.
  nlohmann::json resources = nlohmann::json::array();
  for (const auto& r : s.local_resources) {
    resources.push_back({{"key", r.name},
                         {"value",
                          {{"resource", r.url},
                           {"type", "FILE"},
                           {"visibility", "APPLICATION"},
                           {"size", r.size},
                           {"timestamp", r.timestamp}}}});
  }
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
        {"environment", {{"entry", environment}}},
        {"local-resources", {{"entry", resources}}}}},
  };
  if (!s.queue.empty()) body["queue"] = s.queue;
  if (!s.node_label.empty()) {
    body["app-node-label-expression"] = s.node_label;
    body["am-container-node-label-expression"] = s.node_label;
  }
  return body.dump();
}

std::string DefaultYarnAmClasspath() {
  std::string cp = "{{HADOOP_CONF_DIR}}";
  for (const char* dir : {"{{HADOOP_COMMON_HOME}}/share/hadoop/common",
                          "{{HADOOP_HDFS_HOME}}/share/hadoop/hdfs",
                          "{{HADOOP_YARN_HOME}}/share/hadoop/yarn"}) {
    absl::StrAppend(&cp, ":", dir, "/*:", dir, "/lib/*");
  }
  return cp;
}

std::string YarnClasspathFromConfig(const std::string& value) {
  std::vector<std::string> entries;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!entry.empty()) entries.emplace_back(entry);
  }
  return absl::StrJoin(entries, ":");
}

std::optional<std::string> AmMissingClass(const std::string& text) {
  absl::string_view diagnostics = text;
  for (absl::string_view marker : {"NoClassDefFoundError: ", "ClassNotFoundException: "}) {
    size_t at = diagnostics.find(marker);
    if (at == absl::string_view::npos) continue;
    size_t begin = at + marker.size();
    size_t end = begin;
    while (end < diagnostics.size() && !absl::ascii_isspace(diagnostics[end])) ++end;
    std::string name(diagnostics.substr(begin, end - begin));
    absl::StrReplaceAll({{"/", "."}}, &name);
    if (!name.empty()) return name;
  }
  // The AM jar itself missing from the classpath.
  constexpr absl::string_view kNoMain = "Could not find or load main class ";
  if (size_t at = diagnostics.find(kNoMain); at != absl::string_view::npos) {
    size_t begin = at + kNoMain.size();
    size_t end = begin;
    while (end < diagnostics.size() && !absl::ascii_isspace(diagnostics[end])) ++end;
    return std::string(diagnostics.substr(begin, end - begin));
  }
  return std::nullopt;
}

std::string AmClasspathFailureMessage(const std::string& missing_class,
                                      const std::string& classpath, const std::string& source) {
  return absl::StrCat(
      "the YARN application master could not start: Java found no class ", missing_class,
      " on its classpath, ", classpath.empty() ? "(empty)" : classpath, " (from ", source,
      "). It needs the cluster's Hadoop jars and configuration directory as the NodeManagers "
      "have them: set SHOAL_YARN_AM_CLASSPATH to what `yarn classpath` prints on a "
      "NodeManager (':'-separated; {{VAR}} and $VAR are expanded there), or unset it and have "
      "the cluster's yarn-site.xml set yarn.application.classpath. The AM's own output is "
      "am.stderr in its container's log directory (docs/backends/yarn.md)");
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
