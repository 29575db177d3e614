#include "backends/spark/spark_on_yarn.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"

namespace shoal::backends {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;
// Spark's own executor memory overhead: max(384 MiB, 10 % of the heap). It covers the JVM's
// off-heap needs and the Python workers; the places' processes come on top.
constexpr uint64_t kSparkMinOverheadMiB = 384;
// The executor's JVM holds nothing of the job (a barrier task is a Python worker that waits on
// its agent): Spark's default heap of 1g would only take room the places' processes need.
constexpr char kDefaultExecutorMemory[] = "512m";
constexpr char kDefaultResourceManagerPort[] = "8032";

// A Spark memory size (checked by IsSparkMemory: digits, then k, m, g or t, b optional) in MiB;
// a bare number is MiB, as Spark reads spark.executor.memory.
uint64_t SparkMemoryMiB(absl::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(text.substr(0, digits), &n)) return 0;
  char unit = digits < text.size() ? absl::ascii_tolower(text[digits]) : 'm';
  switch (unit) {
    case 'k': return (n + 1023) / 1024;
    case 'g': return n * 1024;
    case 't': return n * 1024 * 1024;
    default: return n;
  }
}

std::string Unescape(absl::string_view text) {
  std::string out(absl::StripAsciiWhitespace(text));
  for (auto [from, to] : {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""},
                          {"&apos;", "'"}, {"&amp;", "&"}}) {
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + 1)) {
      out.replace(at, std::string_view(from).size(), to);
    }
  }
  return out;
}

// The raw value of `name`, without expanding references.
std::string RawProperty(absl::string_view xml, absl::string_view name) {
  std::string want = absl::StrCat("<name>", name, "</name>");
  for (size_t at = xml.find(want); at != absl::string_view::npos;
       at = xml.find(want, at + want.size())) {
    size_t end = xml.find("</property>", at);
    absl::string_view property = xml.substr(at, end == absl::string_view::npos ? xml.npos
                                                                                : end - at);
    size_t open = property.find("<value>");
    size_t close = property.find("</value>");
    if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
      continue;
    }
    return Unescape(property.substr(open + 7, close - open - 7));
  }
  return "";
}

}  // namespace

std::map<std::string, std::string> ContainerExecutorProperties(
    const spec::JobSpec& job, uint32_t executor_cores, const std::string& executor_memory) {
  std::map<std::string, std::string> conf;
  uint32_t places = 0;
  double task_cpus = 1;
  uint64_t task_memory = 0;
  for (const auto& role : job.roles) {
    places += role.instances;
    task_cpus = std::max(task_cpus, role.resources.cpus);
    task_memory = std::max(task_memory, role.resources.memory_bytes);
  }
  uint32_t cpus = static_cast<uint32_t>(std::ceil(task_cpus));
  uint32_t cores = executor_cores > 0 ? executor_cores : cpus;
  uint32_t per_executor = std::max(1u, cores / cpus);
  conf["spark.executor.cores"] = std::to_string(cores);
  conf["spark.executor.instances"] = std::to_string((places + per_executor - 1) / per_executor);
  std::string heap = executor_memory.empty() ? kDefaultExecutorMemory : executor_memory;
  conf["spark.executor.memory"] = heap;
  uint64_t overhead = std::max(kSparkMinOverheadMiB, SparkMemoryMiB(heap) / 10);
  overhead += per_executor * ((task_memory + kMiB - 1) / kMiB);
  conf["spark.executor.memoryOverhead"] = absl::StrCat(overhead, "m");
  return conf;
}

std::map<std::string, std::string> SparkOnYarnProperties(const spec::JobSpec& job,
                                                         uint32_t executor_cores,
                                                         const std::string& executor_memory,
                                                         const std::string& spark_home) {
  std::map<std::string, std::string> conf =
      ContainerExecutorProperties(job, executor_cores, executor_memory);
  if (!spark_home.empty()) conf["spark.yarn.jars"] = absl::StrCat("local:", spark_home, "/jars/*");
  // No driver UI: in client mode the application master's registration adds YARN's proxy
  // filter to the UI's handlers while SparkContext() starts them; in about one application in
  // a dozen on the test cluster that failed the context (ConcurrentModificationException in
  // Jetty's ServletHandler.initialize). Shoal's status and UI cover the job; spark.conf may
  // turn it back on.
  conf["spark.ui.enabled"] = "false";
  return conf;
}

std::string HadoopProperty(absl::string_view xml, absl::string_view name) {
  std::string value = RawProperty(xml, name);
  // ${name} references, as Hadoop's Configuration expands them (a few levels deep at most).
  for (int depth = 0; depth < 8; ++depth) {
    size_t open = value.find("${");
    if (open == std::string::npos) break;
    size_t close = value.find('}', open);
    if (close == std::string::npos) break;
    std::string ref = value.substr(open + 2, close - open - 2);
    value.replace(open, close - open + 1, RawProperty(xml, ref));
  }
  return value;
}

absl::StatusOr<std::string> YarnConfDir() {
  std::string dir;
  std::string from;
  for (const char* name : {"HADOOP_CONF_DIR", "YARN_CONF_DIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      dir = value;
      from = name;
      break;
    }
  }
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "--backend spark with master yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR: the "
        "directory with the cluster's yarn-site.xml, where Spark finds the ResourceManager");
  }
  std::string site = dir + "/yarn-site.xml";
  if (auto text = ReadFile(site); !text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend spark with master yarn: ", from, "=", dir, " has no readable yarn-site.xml (",
        text.status().message(), ")"));
  }
  return dir;
}

absl::StatusOr<std::pair<std::string, std::string>> YarnResourceManagerAddress(
    const std::string& conf_dir) {
  std::string site = conf_dir + "/yarn-site.xml";
  absl::StatusOr<std::string> xml = ReadFile(site);
  if (!xml.ok()) return xml.status();
  std::string suffix;
  if (absl::AsciiStrToLower(HadoopProperty(*xml, "yarn.resourcemanager.ha.enabled")) == "true") {
    std::vector<std::string> ids =
        absl::StrSplit(HadoopProperty(*xml, "yarn.resourcemanager.ha.rm-ids"), ',',
                       absl::SkipWhitespace());
    if (!ids.empty()) suffix = "." + std::string(absl::StripAsciiWhitespace(ids.front()));
  }
  std::string address = HadoopProperty(*xml, "yarn.resourcemanager.address" + suffix);
  if (address.empty()) {
    std::string host = HadoopProperty(*xml, "yarn.resourcemanager.hostname" + suffix);
    if (host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          site, " sets neither yarn.resourcemanager.address nor yarn.resourcemanager.hostname"));
    }
    address = absl::StrCat(host, ":", kDefaultResourceManagerPort);
  }
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        site, ": the ResourceManager's address must be HOST:PORT, got '", address, "'"));
  }
  return std::pair{address.substr(0, colon), address.substr(colon + 1)};
}

}  // namespace shoal::backends
