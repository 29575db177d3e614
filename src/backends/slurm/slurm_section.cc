#include "backends/slurm/slurm_section.h"

#include <memory>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace shoal::backends {
namespace {

constexpr absl::string_view kSlurmKeys[] = {"partition", "account", "time_limit", "constraint"};

std::shared_ptr<const spec::SectionValue> ParseSlurmSection(spec::SectionReader& section) {
  auto out = std::make_shared<SlurmConfig>();
  if (!section.ExpectMap("partition, account, time_limit and/or constraint, e.g. {partition: "
                         "gpu, time_limit: 2h}")) {
    return out;
  }
  section.AcceptKeys(kSlurmKeys);
  auto name = [&](const char* key, std::string& into, absl::string_view extra) {
    std::optional<std::string> text = section.Text(key, "a Slurm name, e.g. gpu");
    if (!text) return;
    if (!IsSlurmName(*text, extra)) {
      section.Error(key, absl::StrCat(kSlurmNameRule, ", got ", section.Describe(key)));
      return;
    }
    into = *text;
  };
  name("partition", out->partition, "");
  name("account", out->account, "");
  name("constraint", out->constraint, kSlurmConstraintExtra);
  if (auto d = section.Duration("time_limit")) {
    if (*d < kMinSlurmTimeLimit) {
      section.Error("time_limit",
                    absl::StrCat(kSlurmTimeLimitRule, ", got ", section.Describe("time_limit")));
    } else {
      out->time_limit = *d;
    }
  }
  return out;
}

}  // namespace

bool IsSlurmName(absl::string_view text, absl::string_view extra) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("-_.,:=").find(c) == std::string_view::npos &&
        extra.find(c) == absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

spec::JobSection SlurmJobSection() { return {"slurm", ParseSlurmSection}; }

const SlurmConfig& SlurmConfigOf(const spec::JobSpec& job) {
  static const SlurmConfig kDefaults;
  const SlurmConfig* written = job.Section<SlurmConfig>("slurm");
  return written != nullptr ? *written : kDefaults;
}

}  // namespace shoal::backends
