#include "backends/yarn/yarn_section.h"

#include <memory>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace shoal::backends {
namespace {

constexpr absl::string_view kYarnKeys[] = {"queue", "node_label"};

bool IsYarnName(absl::string_view text, absl::string_view extra) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("-_.").find(c) == std::string_view::npos &&
        extra.find(c) == absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

std::shared_ptr<const spec::SectionValue> ParseYarnSection(spec::SectionReader& section) {
  auto out = std::make_shared<YarnConfig>();
  if (!section.ExpectMap("queue and/or node_label, e.g. {queue: ml, node_label: gpu}")) {
    return out;
  }
  section.AcceptKeys(kYarnKeys);
  auto name = [&](const char* key, std::string& into, bool (*valid)(absl::string_view),
                  const char* form) {
    std::optional<std::string> text = section.Text(key, form);
    if (!text) return;
    if (!valid(*text)) {
      section.Error(key, absl::StrCat("must be ", form, ", got ", section.Describe(key)));
      return;
    }
    into = *text;
  };
  name("queue", out->queue, IsYarnQueue, kYarnQueueForm);
  name("node_label", out->node_label, IsYarnNodeLabel, kYarnNodeLabelForm);
  return out;
}

}  // namespace

bool IsYarnQueue(absl::string_view text) { return IsYarnName(text, ""); }
bool IsYarnNodeLabel(absl::string_view text) { return IsYarnName(text, "&|!() "); }

spec::JobSection YarnJobSection() { return {"yarn", ParseYarnSection}; }

const YarnConfig& YarnConfigOf(const spec::JobSpec& job) {
  static const YarnConfig kDefaults;
  const YarnConfig* written = job.Section<YarnConfig>("yarn");
  return written != nullptr ? *written : kDefaults;
}

}  // namespace shoal::backends
