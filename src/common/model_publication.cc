#include "common/model_publication.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal {
namespace {

// The SDK's rule for model names (they appear in the server's URLs and are directory names).
bool IsModelName(const std::string& name) {
  if (name.empty() || name.size() > ModelPublication::kMaxModelNameBytes || name[0] == '.') {
    return false;
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string Shown(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

}  // namespace

absl::StatusOr<ModelPublication> ParseModelPublication(const nlohmann::json& request) {
  if (!request.is_object()) return absl::InvalidArgumentError("the report is not a JSON object");
  ModelPublication p;
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = request.find(key);
    return it == request.end() ? nullptr : &*it;
  };
  const nlohmann::json* model = field("model");
  if (model == nullptr || !model->is_string() || !IsModelName(model->get<std::string>())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model must be a model name (letters, digits, '_', '-', '.', not starting with '.', at "
        "most ", ModelPublication::kMaxModelNameBytes, " bytes), got ",
        model ? Shown(*model) : "nothing"));
  }
  p.model = model->get<std::string>();
  const nlohmann::json* version = field("version");
  if (version == nullptr || !version->is_number_unsigned() || version->get<uint64_t>() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("version must be an integer >= 1, got ",
                                                   version ? Shown(*version) : "nothing"));
  }
  p.version = version->get<uint64_t>();
  const nlohmann::json* repository = field("repository");
  if (repository == nullptr || !repository->is_string() ||
      repository->get_ref<const std::string&>().empty() ||
      repository->get_ref<const std::string&>().size() > ModelPublication::kMaxRepositoryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("repository must be a non-empty string of at most ",
                     ModelPublication::kMaxRepositoryBytes, " bytes, got ",
                     repository ? Shown(*repository) : "nothing"));
  }
  p.repository = repository->get<std::string>();
  if (const nlohmann::json* step = field("step"); step != nullptr && !step->is_null()) {
    if (!step->is_number_integer() || (step->is_number_unsigned()
                                           ? step->get<uint64_t>() > INT64_MAX
                                           : step->get<int64_t>() < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step must be an integer >= 0, got ", Shown(*step)));
    }
    p.step = step->get<int64_t>();
  }
  if (const nlohmann::json* metrics = field("metrics"); metrics != nullptr && !metrics->is_null()) {
    if (!metrics->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics must be an object of name -> number, got ", Shown(*metrics)));
    }
    if (metrics->size() > ModelPublication::kMaxMetrics) {
      return absl::InvalidArgumentError(absl::StrCat("metrics has ", metrics->size(),
                                                     " entries; at most ",
                                                     ModelPublication::kMaxMetrics, " are taken"));
    }
    for (auto it = metrics->begin(); it != metrics->end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& value = it.value();
      if (name.empty() || name.size() > ModelPublication::kMaxMetricNameBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("metric name '", name.substr(0, 40), "' must be 1 to ",
                         ModelPublication::kMaxMetricNameBytes, " bytes"));
      }
      if (!value.is_number() || !std::isfinite(value.get<double>())) {
        return absl::InvalidArgumentError(
            absl::StrCat("metric '", name, "' must be a finite number, got ", Shown(value)));
      }
      p.metrics[name] = value.get<double>();
    }
  }
  return p;
}

}  // namespace shoal
