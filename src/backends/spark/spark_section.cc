#include "backends/spark/spark_section.h"

#include <memory>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shoal::backends {
namespace {

constexpr absl::string_view kSparkKeys[] = {"master",         "deploy_mode", "executor_memory",
                                            "executor_cores", "agent_image", "conf"};
constexpr uint32_t kMaxExecutorCores = 1024;

std::shared_ptr<const spec::SectionValue> ParseSparkSection(spec::SectionReader& section) {
  auto out = std::make_shared<SparkConfig>();
  if (!section.ExpectMap("master, deploy_mode, executor_memory, executor_cores, agent_image "
                         "and/or conf, "
                         "e.g. {master: \"spark://host:7077\", executor_memory: 1g}")) {
    return out;
  }
  section.AcceptKeys(kSparkKeys);
  if (auto master = section.Text("master", "a Spark master URL, e.g. spark://host:7077")) {
    if (IsSparkMaster(*master)) {
      out->master = *master;
    } else {
      section.Error("master",
                    absl::StrCat("must be ", kSparkMasterForm, ", got ", section.Describe("master")));
    }
  }
  if (auto mode = section.Text("deploy_mode", "client")) {
    if (*mode == "client") {
      out->deploy_mode = *mode;
    } else {
      section.Error("deploy_mode",
                    absl::StrCat("must be client (the Shoal master runs beside the Spark driver, "
                                 "on the machine that runs `shoal run`), got ",
                                 section.Describe("deploy_mode")));
    }
  }
  if (auto memory = section.Text("executor_memory", kSparkMemoryForm)) {
    if (IsSparkMemory(*memory)) {
      out->executor_memory = *memory;
    } else {
      section.Error("executor_memory", absl::StrCat("must be ", kSparkMemoryForm, ", got ",
                                                    section.Describe("executor_memory")));
    }
  }
  if (auto cores = section.Text("executor_cores", "a whole number of cores, e.g. 2")) {
    uint32_t n = 0;
    if (absl::SimpleAtoi(*cores, &n) && n >= 1 && n <= kMaxExecutorCores) {
      out->executor_cores = n;
    } else {
      section.Error("executor_cores",
                    absl::StrCat("must be a whole number of cores from 1 to ", kMaxExecutorCores,
                                 ", got ", section.Describe("executor_cores")));
    }
  }
  if (auto image = section.Text("agent_image", "an image reference, e.g. "
                                                "registry.example/shoal-agent:1.0")) {
    if (!image->empty() && image->find_first_of(" \t\n") == std::string::npos) {
      out->agent_image = *image;
    } else {
      section.Error("agent_image", absl::StrCat("must be an image reference, e.g. "
                                                "registry.example/shoal-agent:1.0, got ",
                                                section.Describe("agent_image")));
    }
  }
  if (std::unique_ptr<spec::SectionReader> conf = section.Nested("conf")) {
    if (conf->ExpectMap("Spark properties and their values, e.g. "
                        "{spark.executor.memoryOverhead: 512m}")) {
      for (const std::string& key : conf->Keys()) {
        std::optional<std::string> value = conf->Text(key, "a Spark property's value");
        if (!value) continue;
        if (std::string problem = SparkConfKeyProblem(key, *value); !problem.empty()) {
          conf->Error(key, problem);
          continue;
        }
        out->conf[key] = *value;
      }
    }
  }
  return out;
}

bool IsHostPort(absl::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  uint32_t port = 0;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &port) || port == 0 || port > 65535) return false;
  for (char c : text.substr(0, colon)) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("-._[]:").find(c) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IsSparkMaster(absl::string_view text) {
  if (text == "yarn") return true;
  if (absl::StartsWith(text, "spark://")) {
    absl::string_view rest = text.substr(8);
    if (rest.empty()) return false;
    for (absl::string_view hp : absl::StrSplit(rest, ',')) {
      if (!IsHostPort(hp)) return false;
    }
    return true;
  }
  if (absl::StartsWith(text, "k8s://")) {
    absl::string_view rest = text.substr(6);
    absl::ConsumePrefix(&rest, "https://") || absl::ConsumePrefix(&rest, "http://");
    return !rest.empty() && rest.find_first_of(" \t\n") == absl::string_view::npos;
  }
  // local-cluster[WORKERS,CORES,MEMORY_MB]: three positive numbers, spaces after commas.
  if (!absl::ConsumePrefix(&text, "local-cluster[") || !absl::ConsumeSuffix(&text, "]")) {
    return false;
  }
  std::vector<absl::string_view> numbers = absl::StrSplit(text, ',');
  if (numbers.size() != 3) return false;
  for (absl::string_view n : numbers) {
    n = absl::StripLeadingAsciiWhitespace(n);
    uint32_t value = 0;
    if (n.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(n[0])) ||
        !absl::SimpleAtoi(n, &value) || value == 0) {
      return false;
    }
  }
  return true;
}

// Hand-written rather than std::regex: libstdc++'s matcher recurses once per character, and a
// job file's value may be long.
bool IsSparkMemory(absl::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0 || text[0] == '0' || digits > 12) return false;
  absl::string_view unit = text.substr(digits);
  if (unit.empty()) return true;
  if (std::string_view("kKmMgGtT").find(unit[0]) == std::string_view::npos) return false;
  return unit.size() == 1 || (unit.size() == 2 && (unit[1] == 'b' || unit[1] == 'B'));
}

std::string SparkConfKeyProblem(absl::string_view key, absl::string_view value) {
  if (!absl::StartsWith(key, "spark.")) {
    return absl::StrCat("must name a Spark property (spark.*), got '", key, "'");
  }
  if (key == "spark.master") return "is the section's own `master` (or --spark-master)";
  if (key == "spark.submit.deployMode") return "is the section's own `deploy_mode`";
  if (key == "spark.executor.memory") return "is the section's own `executor_memory`";
  if (key == "spark.executor.cores") return "is the section's own `executor_cores`";
  if (key == "spark.app.name") return "is set by Shoal: shoal-<job id>";
  if (key == "spark.dynamicAllocation.enabled" && absl::AsciiStrToLower(value) == "true") {
    return "cannot be true: Spark runs no barrier stage with dynamic allocation, and the job's "
           "gang is one barrier stage";
  }
  return "";
}

std::vector<std::pair<std::string, std::string>> SparkStandaloneAddresses(
    absl::string_view master) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!absl::ConsumePrefix(&master, "spark://")) return out;
  for (absl::string_view hp : absl::StrSplit(master, ',')) {
    size_t colon = hp.rfind(':');
    if (colon == absl::string_view::npos) continue;
    std::string host(hp.substr(0, colon));
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    out.emplace_back(host, std::string(hp.substr(colon + 1)));
  }
  return out;
}

spec::JobSection SparkJobSection() { return {"spark", ParseSparkSection}; }

const SparkConfig& SparkConfigOf(const spec::JobSpec& job) {
  static const SparkConfig kDefaults;
  const SparkConfig* written = job.Section<SparkConfig>("spark");
  return written != nullptr ? *written : kDefaults;
}

}  // namespace shoal::backends
