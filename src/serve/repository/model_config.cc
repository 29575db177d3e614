#include "serve/repository/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace shoal::serve {
namespace {

constexpr absl::string_view kTopKeys[] = {"inputs",    "outputs",   "max_batch_size",
                                          "batch_delay_us", "instances", "threads_per_instance",
                                          "warmup", "version_policy", "ensemble",
                                          "rollout"};
constexpr absl::string_view kRolloutKeys[] = {"canary"};
constexpr absl::string_view kCanaryKeys[] = {"share",          "duration_s",    "min_requests",
                                             "max_error_rate", "max_p99_ratio", "max_output_drift",
                                             "mirror"};
constexpr char kRolloutForm[] =
    "a map such as {canary: {share: 0.05, duration_s: 30, min_requests: 200}}";
constexpr int64_t kMaxCanaryDurationS = 7 * 24 * 3600;
constexpr int64_t kMaxCanaryRequests = int64_t{1} << 40;
constexpr absl::string_view kEnsembleKeys[] = {"models", "combine"};
constexpr char kEnsembleForm[] = "a map such as {models: [a, b], combine: mean}";
constexpr absl::string_view kTensorKeys[] = {"name", "datatype", "dims"};
constexpr absl::string_view kWarmupKeys[] = {"count", "inputs"};
constexpr absl::string_view kWarmupInputKeys[] = {"dims", "fill"};
constexpr absl::string_view kFillNames[] = {"zero", "one", "random"};

// Bounds far above any real use that keep arithmetic on them safe.
constexpr int64_t kMaxBatchSize = 1 << 20;
constexpr int64_t kMaxBatchDelayUs = 10'000'000;  // 10 s
constexpr int64_t kMaxInstances = 256;
constexpr int64_t kMaxThreadsPerInstance = 1024;
constexpr int64_t kMaxWarmupCount = 1000;
constexpr int64_t kMaxDim = int64_t{1} << 31;
// A warmup input is allocated in full on every instance: keep it below 1 GiB of FP64.
constexpr int64_t kMaxWarmupElements = int64_t{1} << 27;

constexpr char kDimsForm[] = "a list of integers >= 1, or -1 for any size, e.g. [-1, 16]";
constexpr char kTensorForm[] =
    "a list of maps with name, datatype and dims, e.g. [{name: x, datatype: FP32, dims: [16]}]";
constexpr char kWarmupForm[] =
    "a list of maps such as {count: 2, inputs: {x: {dims: [1, 16], fill: random}}}";

int LineOf(const YAML::Node& node, int fallback) {
  if (!node.IsDefined() || node.IsNull()) return fallback;
  YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark.line + 1;
}

// How a value reads in "got ..." messages.
std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  std::string text = node.Scalar();
  int64_t number;
  if (node.Tag() == "?" && absl::SimpleAtoi(text, &number)) return text;
  if (text.size() > 60) text = absl::StrCat(text.substr(0, 57), "...");
  return absl::StrCat("'", text, "'");
}

struct Entry {
  std::string key;
  YAML::Node value;
  int line;
};

class ConfigParser {
 public:
  explicit ConfigParser(std::string source) : source_(std::move(source)) {}

  absl::StatusOr<ModelConfig> Parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ":", e.mark.line + 1, ":",
                                                     e.mark.column + 1, ": invalid YAML: ", e.msg));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": invalid YAML: ", e.msg));
    }
    ModelConfig config;
    try {
      if (!root.IsDefined() || root.IsNull()) return config;  // an empty file: all defaults
      if (!root.IsMap()) {
        Error(LineOf(root, 1), "",
              absl::StrCat("a model config must be a map of ", absl::StrJoin(kTopKeys, ", "),
                           "; got ", Describe(root)));
      } else {
        ParseTop(root, config);
      }
    } catch (const YAML::Exception& e) {
      // Not expected: the traversal only asks nodes for what their type offers.
      return absl::InternalError(absl::StrCat(source_, ": reading the model config: ", e.what()));
    }
    if (!problems_.empty()) {
      std::stable_sort(problems_.begin(), problems_.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<std::string> lines;
      for (const auto& p : problems_) lines.push_back(p.second);
      return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
    }
    return config;
  }

 private:
  void Error(int line, absl::string_view key, absl::string_view message) {
    std::string where = absl::StrCat(source_, ":", line, ": ");
    problems_.emplace_back(line, key.empty() ? absl::StrCat(where, message)
                                             : absl::StrCat(where, key, ": ", message));
  }

  // The pairs of `map` in file order; reports non-scalar and repeated keys.
  std::vector<Entry> Entries(const YAML::Node& map, absl::string_view path, int map_line) {
    std::vector<Entry> entries;
    std::map<std::string, int> first_line;
    for (auto it = map.begin(); it != map.end(); ++it) {
      int line = LineOf(it->first, map_line);
      if (!it->first.IsScalar()) {
        Error(line, path, absl::StrCat("keys must be plain names, got ", Describe(it->first)));
        continue;
      }
      std::string key = it->first.Scalar();
      auto [seen, inserted] = first_line.emplace(key, line);
      if (!inserted) {
        Error(line, Join(path, key),
              absl::StrCat("given twice, at lines ", seen->second, " and ", line, "; keep one"));
        continue;
      }
      entries.push_back({key, it->second, line});
    }
    return entries;
  }

  void CheckKnownKeys(const std::vector<Entry>& entries, absl::string_view path,
                      absl::Span<const absl::string_view> accepted) {
    for (const Entry& e : entries) {
      if (std::find(accepted.begin(), accepted.end(), e.key) != accepted.end()) continue;
      Error(e.line, Join(path, e.key),
            absl::StrCat("unknown key; accepted keys: ", absl::StrJoin(accepted, ", ")));
    }
  }

  static const Entry* Find(const std::vector<Entry>& entries, absl::string_view key) {
    for (const Entry& e : entries) {
      if (e.key == key) return &e;
    }
    return nullptr;
  }

  static std::string Join(absl::string_view path, absl::string_view key) {
    return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
  }

  std::optional<int64_t> Integer(const Entry& e, const std::string& key, int64_t min,
                                 int64_t max) {
    int64_t n = 0;
    bool is_int = e.value.IsScalar() && e.value.Tag() == "?" && absl::SimpleAtoi(e.value.Scalar(), &n);
    if (!is_int || n < min) {
      Error(e.line, key, absl::StrCat("must be an integer >= ", min, ", got ", Describe(e.value)));
      return std::nullopt;
    }
    if (n > max) {
      Error(e.line, key, absl::StrCat("must be at most ", max, ", got ", n));
      return std::nullopt;
    }
    return n;
  }

  // A list of dims; -1 allowed where `allow_any`.
  std::optional<std::vector<int64_t>> Dims(const Entry& e, const std::string& key,
                                           bool allow_any) {
    const char* form = allow_any ? kDimsForm : "a list of integers >= 1, e.g. [1, 16]";
    if (!e.value.IsSequence()) {
      Error(e.line, key, absl::StrCat("must be ", form, ", got ", Describe(e.value)));
      return std::nullopt;
    }
    std::vector<int64_t> dims;
    bool ok = true;
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node& d = e.value[i];
      int64_t n = 0;
      bool is_int = d.IsScalar() && d.Tag() == "?" && absl::SimpleAtoi(d.Scalar(), &n);
      if (!is_int || (n < 1 && !(allow_any && n == -1)) || n > kMaxDim) {
        Error(LineOf(d, e.line), absl::StrCat(key, "[", i, "]"),
              absl::StrCat("must be ", allow_any ? "an integer >= 1 or -1" : "an integer >= 1",
                           n > kMaxDim ? absl::StrCat(" and at most ", kMaxDim) : "", ", got ",
                           Describe(d)));
        ok = false;
        continue;
      }
      dims.push_back(n);
    }
    if (!ok) return std::nullopt;
    return dims;
  }

  // inputs: or outputs:, a list of {name, datatype, dims}.
  std::optional<std::vector<TensorConfig>> Tensors(const Entry& e) {
    if (!e.value.IsSequence()) {
      Error(e.line, e.key, absl::StrCat("must be ", kTensorForm, ", got ", Describe(e.value)));
      return std::nullopt;
    }
    std::vector<TensorConfig> tensors;
    std::map<std::string, int> first_line;
    bool ok = true;
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node& node = e.value[i];
      std::string path = absl::StrCat(e.key, "[", i, "]");
      int line = LineOf(node, e.line);
      if (!node.IsMap()) {
        Error(line, path,
              absl::StrCat("must be a map with name, datatype and dims, got ", Describe(node)));
        ok = false;
        continue;
      }
      std::vector<Entry> entries = Entries(node, path, line);
      CheckKnownKeys(entries, path, kTensorKeys);
      TensorConfig tensor;
      bool complete = true;
      if (const Entry* name = Find(entries, "name")) {
        if (!name->value.IsScalar() || name->value.Scalar().empty()) {
          Error(name->line, Join(path, "name"),
                absl::StrCat("must be a non-empty name, got ", Describe(name->value)));
          complete = false;
        } else {
          tensor.name = name->value.Scalar();
          auto [seen, inserted] = first_line.emplace(tensor.name, name->line);
          if (!inserted) {
            Error(name->line, Join(path, "name"),
                  absl::StrCat("'", tensor.name, "' is declared twice, at lines ", seen->second,
                               " and ", name->line, "; names must be unique"));
            complete = false;
          }
        }
      } else {
        Error(line, Join(path, "name"), "required; expected the tensor's name, e.g. x");
        complete = false;
      }
      if (const Entry* type = Find(entries, "datatype")) {
        std::optional<DataType> parsed =
            type->value.IsScalar() ? ParseDataType(type->value.Scalar()) : std::nullopt;
        if (!parsed) {
          Error(type->line, Join(path, "datatype"),
                absl::StrCat("must be one of ", DataTypeNames(), ", got ", Describe(type->value)));
          complete = false;
        } else {
          tensor.datatype = *parsed;
        }
      } else {
        Error(line, Join(path, "datatype"),
              absl::StrCat("required; expected one of ", DataTypeNames()));
        complete = false;
      }
      if (const Entry* dims = Find(entries, "dims")) {
        auto parsed = Dims(*dims, Join(path, "dims"), /*allow_any=*/true);
        if (!parsed) {
          complete = false;
        } else {
          tensor.dims = *std::move(parsed);
        }
      } else {
        Error(line, Join(path, "dims"), absl::StrCat("required; expected ", kDimsForm));
        complete = false;
      }
      if (!complete) {
        ok = false;
        continue;
      }
      tensors.push_back(std::move(tensor));
    }
    if (!ok) return std::nullopt;
    return tensors;
  }

  void ParseTop(const YAML::Node& root, ModelConfig& config) {
    std::vector<Entry> entries = Entries(root, "", LineOf(root, 1));
    CheckKnownKeys(entries, "", kTopKeys);
    bool inputs_ok = true;
    if (const Entry* e = Find(entries, "inputs")) {
      auto inputs = Tensors(*e);
      if (inputs) config.inputs = *std::move(inputs);
      inputs_ok = inputs.has_value();
    }
    if (const Entry* e = Find(entries, "outputs")) {
      if (auto outputs = Tensors(*e)) config.outputs = *std::move(outputs);
    }
    const Entry* max_batch = Find(entries, "max_batch_size");
    bool batching_known = true;
    if (max_batch) {
      auto n = Integer(*max_batch, "max_batch_size", 0, kMaxBatchSize);
      if (n) config.max_batch_size = *n;
      batching_known = n.has_value();
    }
    if (const Entry* e = Find(entries, "batch_delay_us")) {
      if (auto n = Integer(*e, "batch_delay_us", 0, kMaxBatchDelayUs)) {
        config.batch_delay_us = *n;
        if (*n > 0 && batching_known && config.max_batch_size == 0) {
          Error(e->line, "batch_delay_us",
                "only applies to a batching model; set max_batch_size >= 1 as well, or remove "
                "batch_delay_us");
        }
      }
    }
    if (const Entry* e = Find(entries, "instances")) {
      if (auto n = Integer(*e, "instances", 1, kMaxInstances)) config.instances = int(*n);
    }
    if (const Entry* e = Find(entries, "threads_per_instance")) {
      if (auto n = Integer(*e, "threads_per_instance", 1, kMaxThreadsPerInstance)) {
        config.threads_per_instance = int(*n);
      }
    }
    if (const Entry* e = Find(entries, "version_policy")) {
      std::string value = e->value.IsScalar() ? e->value.Scalar() : "";
      if (value == "latest") {
        config.version_policy = VersionPolicy::kLatest;
      } else if (value == "all") {
        config.version_policy = VersionPolicy::kAll;
      } else {
        Error(e->line, "version_policy",
              absl::StrCat("must be latest or all, got ", Describe(e->value)));
      }
    }
    if (const Entry* e = Find(entries, "ensemble")) {
      ParseEnsemble(*e, config);
      for (const Entry& other : entries) {
        if (other.key == "ensemble" || !std::count(std::begin(kTopKeys), std::end(kTopKeys),
                                                   other.key)) {
          continue;
        }
        Error(other.line, other.key,
              "not allowed in an ensemble's config: its inputs, outputs and batching are its "
              "members'; keep only 'ensemble'");
      }
      return;
    }
    if (const Entry* e = Find(entries, "rollout")) {
      ParseRollout(*e, config);
      if (config.rollout.canary && config.version_policy != VersionPolicy::kLatest) {
        Error(e->line, "rollout",
              "a canary needs version_policy latest (with 'all' every version serves already)");
      }
    }
    if (const Entry* e = Find(entries, "warmup")) {
      if (!Find(entries, "inputs")) {
        Error(e->line, "warmup",
              "needs the model's inputs declared (the 'inputs' key), which give each warmup "
              "input its datatype");
      } else if (inputs_ok && batching_known) {
        ParseWarmup(*e, config);
      }
    }
  }

  // A number (integer or decimal) in [min, max]; `above_min` excludes min itself.
  std::optional<double> Number(const Entry& e, const std::string& key, double min, double max,
                               bool above_min = false) {
    double n = 0;
    bool is_number = e.value.IsScalar() && e.value.Tag() == "?" &&
                     absl::SimpleAtod(e.value.Scalar(), &n) && std::isfinite(n);
    if (!is_number || n < min || n > max || (above_min && n == min)) {
      Error(e.line, key,
            absl::StrCat("must be a number ", above_min ? "> " : ">= ", min, " and <= ", max,
                         ", got ", Describe(e.value)));
      return std::nullopt;
    }
    return n;
  }

  void ParseRollout(const Entry& e, ModelConfig& config) {
    if (!e.value.IsMap()) {
      Error(e.line, "rollout", absl::StrCat("must be ", kRolloutForm, ", got ", Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e.value, "rollout", e.line);
    CheckKnownKeys(entries, "rollout", kRolloutKeys);
    const Entry* canary = Find(entries, "canary");
    if (!canary) return;
    if (!canary->value.IsMap()) {
      Error(canary->line, "rollout.canary",
            absl::StrCat("must be a map of ", absl::StrJoin(kCanaryKeys, ", "), ", got ",
                         Describe(canary->value)));
      return;
    }
    std::vector<Entry> keys = Entries(canary->value, "rollout.canary", canary->line);
    CheckKnownKeys(keys, "rollout.canary", kCanaryKeys);
    CanaryConfig c;
    size_t before = problems_.size();
    if (const Entry* k = Find(keys, "share")) {
      if (auto n = Number(*k, "rollout.canary.share", 0, 1, /*above_min=*/true)) c.share = *n;
    }
    if (const Entry* k = Find(keys, "duration_s")) {
      if (auto n = Number(*k, "rollout.canary.duration_s", 0, kMaxCanaryDurationS)) {
        c.duration_s = *n;
      }
    }
    if (const Entry* k = Find(keys, "min_requests")) {
      if (auto n = Integer(*k, "rollout.canary.min_requests", 1, kMaxCanaryRequests)) {
        c.min_requests = *n;
      }
    }
    if (const Entry* k = Find(keys, "max_error_rate")) {
      if (auto n = Number(*k, "rollout.canary.max_error_rate", 0, 1)) c.max_error_rate = *n;
    }
    if (const Entry* k = Find(keys, "max_p99_ratio")) {
      if (auto n = Number(*k, "rollout.canary.max_p99_ratio", 0, 1e6)) {
        if (*n != 0 && *n < 1) {
          Error(k->line, "rollout.canary.max_p99_ratio",
                absl::StrCat("must be >= 1 (the canary's p99 over the current version's), or 0 "
                             "to leave latency out, got ",
                             Describe(k->value)));
        } else {
          c.max_p99_ratio = *n;
        }
      }
    }
    if (const Entry* k = Find(keys, "max_output_drift")) {
      if (auto n = Number(*k, "rollout.canary.max_output_drift", 0, 1e6)) c.max_output_drift = *n;
    }
    if (const Entry* k = Find(keys, "mirror")) {
      std::string text = k->value.IsScalar() ? k->value.Scalar() : "";
      if (text == "true") {
        c.mirror = true;
      } else if (text == "false") {
        c.mirror = false;
      } else {
        Error(k->line, "rollout.canary.mirror",
              absl::StrCat("must be true or false, got ", Describe(k->value)));
      }
    }
    if (problems_.size() == before) config.rollout.canary = c;
  }

  void ParseEnsemble(const Entry& e, ModelConfig& config) {
    if (!e.value.IsMap()) {
      Error(e.line, "ensemble",
            absl::StrCat("must be ", kEnsembleForm, ", got ", Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e.value, "ensemble", e.line);
    CheckKnownKeys(entries, "ensemble", kEnsembleKeys);
    EnsembleConfig ensemble;
    bool ok = true;
    const Entry* models = Find(entries, "models");
    if (!models) {
      Error(e.line, "ensemble", "needs 'models', the list of member models");
      ok = false;
    } else if (!models->value.IsSequence() || models->value.size() < 2) {
      Error(models->line, "ensemble.models",
            absl::StrCat("must be a list of at least 2 model names, got ",
                         models->value.IsSequence() ? absl::StrCat(models->value.size(), " name(s)")
                                                    : Describe(models->value)));
      ok = false;
    } else {
      for (size_t i = 0; i < models->value.size(); ++i) {
        const YAML::Node& member = models->value[i];
        std::string path = absl::StrCat("ensemble.models[", i, "]");
        if (!member.IsScalar() || member.Scalar().empty()) {
          Error(LineOf(member, models->line), path,
                absl::StrCat("must be a model name, got ", Describe(member)));
          ok = false;
          continue;
        }
        if (std::count(ensemble.models.begin(), ensemble.models.end(), member.Scalar())) {
          Error(LineOf(member, models->line), path,
                absl::StrCat("'", member.Scalar(), "' is listed twice"));
          ok = false;
          continue;
        }
        ensemble.models.push_back(member.Scalar());
      }
    }
    const Entry* combine = Find(entries, "combine");
    if (!combine) {
      Error(e.line, "ensemble", absl::StrCat("needs 'combine', one of ", CombinerNames()));
      ok = false;
    } else {
      std::optional<Combiner> combiner;
      if (combine->value.IsScalar()) combiner = ParseCombiner(combine->value.Scalar());
      if (!combiner) {
        Error(combine->line, "ensemble.combine",
              absl::StrCat("must be one of ", CombinerNames(), ", got ", Describe(combine->value)));
        ok = false;
      } else {
        ensemble.combine = *combiner;
      }
    }
    if (ok) config.ensemble = std::move(ensemble);
  }

  void ParseWarmup(const Entry& e, ModelConfig& config) {
    if (!e.value.IsSequence()) {
      Error(e.line, "warmup", absl::StrCat("must be ", kWarmupForm, ", got ", Describe(e.value)));
      return;
    }
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node& node = e.value[i];
      std::string path = absl::StrCat("warmup[", i, "]");
      int line = LineOf(node, e.line);
      if (!node.IsMap()) {
        Error(line, path, absl::StrCat("must be a map such as {count: 2, inputs: {...}}, got ",
                                       Describe(node)));
        continue;
      }
      std::vector<Entry> entries = Entries(node, path, line);
      CheckKnownKeys(entries, path, kWarmupKeys);
      WarmupSample sample;
      if (const Entry* count = Find(entries, "count")) {
        if (auto n = Integer(*count, Join(path, "count"), 1, kMaxWarmupCount)) {
          sample.count = int(*n);
        }
      }
      const Entry* inputs = Find(entries, "inputs");
      if (!inputs) {
        Error(line, Join(path, "inputs"),
              "required; expected a map from each declared input to {dims: [...], fill: "
              "zero|one|random}");
        continue;
      }
      std::string inputs_path = Join(path, "inputs");
      if (!inputs->value.IsMap()) {
        Error(inputs->line, inputs_path,
              absl::StrCat("must be a map from input name to {dims: [...], fill: "
                           "zero|one|random}, got ",
                           Describe(inputs->value)));
        continue;
      }
      std::vector<Entry> named = Entries(inputs->value, inputs_path, inputs->line);
      for (const Entry& n : named) {
        bool declared = std::any_of(config.inputs.begin(), config.inputs.end(),
                                    [&](const TensorConfig& t) { return t.name == n.key; });
        if (!declared) {
          std::vector<std::string> names;
          for (const TensorConfig& t : config.inputs) names.push_back(t.name);
          Error(n.line, Join(inputs_path, n.key),
                absl::StrCat("not a declared input; the inputs are: ", absl::StrJoin(names, ", ")));
        }
      }
      bool complete = true;
      for (const TensorConfig& declared : config.inputs) {
        const Entry* n = Find(named, declared.name);
        if (!n) {
          Error(inputs->line, Join(inputs_path, declared.name),
                "required; a warmup request gives every declared input");
          complete = false;
          continue;
        }
        auto input = WarmupInputOf(*n, Join(inputs_path, declared.name), declared,
                                   config.max_batch_size);
        if (!input) {
          complete = false;
          continue;
        }
        sample.inputs.push_back(*std::move(input));
      }
      if (complete) config.warmup.push_back(std::move(sample));
    }
  }

  std::optional<WarmupInput> WarmupInputOf(const Entry& e, const std::string& path,
                                           const TensorConfig& declared, int64_t max_batch_size) {
    if (!e.value.IsMap()) {
      Error(e.line, path,
            absl::StrCat("must be a map {dims: [...], fill: zero|one|random}, got ",
                         Describe(e.value)));
      return std::nullopt;
    }
    std::vector<Entry> entries = Entries(e.value, path, e.line);
    CheckKnownKeys(entries, path, kWarmupInputKeys);
    WarmupInput input;
    input.name = declared.name;
    bool ok = true;
    if (const Entry* fill = Find(entries, "fill")) {
      std::string text = fill->value.IsScalar() ? fill->value.Scalar() : "";
      if (text == "zero") {
        input.fill = WarmupFill::kZero;
      } else if (text == "one") {
        input.fill = WarmupFill::kOne;
      } else if (text == "random") {
        input.fill = WarmupFill::kRandom;
      } else {
        Error(fill->line, Join(path, "fill"),
              absl::StrCat("must be one of ", absl::StrJoin(kFillNames, ", "), ", got ",
                           Describe(fill->value)));
        ok = false;
      }
    }
    const Entry* dims = Find(entries, "dims");
    if (!dims) {
      Error(e.line, Join(path, "dims"),
            "required; expected the full shape the model receives, e.g. [1, 16]");
      return std::nullopt;
    }
    auto shape = Dims(*dims, Join(path, "dims"), /*allow_any=*/false);
    if (!shape) return std::nullopt;
    // The shape must be one a request could have: the declared dims, after the batch
    // dimension when the model batches.
    std::vector<int64_t> expected;
    if (max_batch_size > 0) expected.push_back(-1);
    expected.insert(expected.end(), declared.dims.begin(), declared.dims.end());
    bool matches = shape->size() == expected.size();
    for (size_t i = 0; matches && i < expected.size(); ++i) {
      matches = expected[i] == -1 || expected[i] == (*shape)[i];
    }
    std::string expected_text = ShapeString(expected);
    if (!matches) {
      Error(dims->line, Join(path, "dims"),
            absl::StrCat("must match the input's shape ", expected_text,
                         max_batch_size > 0 ? " (batch dimension first)" : "", ", got ",
                         ShapeString(*shape)));
      return std::nullopt;
    }
    if (max_batch_size > 0 && (*shape)[0] > max_batch_size) {
      Error(dims->line, Join(path, "dims"),
            absl::StrCat("the batch dimension must be at most max_batch_size (", max_batch_size,
                         "), got ", (*shape)[0]));
      return std::nullopt;
    }
    std::optional<int64_t> elements = ElementCount(*shape);
    if (!elements || *elements > kMaxWarmupElements) {
      Error(dims->line, Join(path, "dims"),
            absl::StrCat("must hold at most ", kMaxWarmupElements, " elements, got ",
                         ShapeString(*shape)));
      return std::nullopt;
    }
    input.shape = *std::move(shape);
    if (!ok) return std::nullopt;
    return input;
  }

  std::string source_;
  std::vector<std::pair<int, std::string>> problems_;
};

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& yaml_text,
                                             const std::string& source_name) {
  return ConfigParser(source_name).Parse(yaml_text);
}

absl::StatusOr<ModelConfig> ReadModelConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the model config"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the model config"));
  }
  return ParseModelConfig(text.str(), path);
}

}  // namespace shoal::serve
