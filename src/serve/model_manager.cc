#include "serve/model_manager.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serve/model_backend.h"

namespace shoal::serve {
namespace {

// One line on stderr per event a person running the server wants to see.
void Log(const std::string& line) { std::cerr << "shoal serve: " << line << std::endl; }

}  // namespace

int ModelManager::AutomaticThreads(int cpus,
                                   const std::vector<std::pair<ModelConfig, int>>& models) {
  int64_t claimed = 0, automatic_instances = 0;
  for (const auto& [config, versions] : models) {
    int64_t instances = int64_t{config.instances} * versions;
    if (config.threads_per_instance) {
      claimed += instances * *config.threads_per_instance;
    } else {
      automatic_instances += instances;
    }
  }
  if (automatic_instances == 0) return 1;
  int64_t left = cpus - claimed;
  return static_cast<int>(std::max<int64_t>(1, left / automatic_instances));
}

void ModelManager::LoadRepository(const RepositoryScan& scan) {
  for (const std::string& note : scan.ignored) Log(absl::StrCat("ignored ", note));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ModelEntry& model : scan.models) models_[model.name];  // all known, loading
  }
  // Configs first: the CPU split needs every model's instance count.
  std::map<std::string, ModelConfig> configs;
  std::vector<std::pair<ModelConfig, int>> budget;
  for (const ModelEntry& model : scan.models) {
    for (const std::string& skipped : model.skipped_versions) Log(absl::StrCat("skipped ", skipped));
    std::string refusal;
    ModelConfig config;
    if (model.config_path) {
      absl::StatusOr<ModelConfig> parsed = ReadModelConfigFile(*model.config_path);
      if (parsed.ok()) {
        config = *std::move(parsed);
      } else {
        refusal = absl::StrCat("invalid config:\n", parsed.status().message());
      }
    }
    if (refusal.empty() && model.versions.empty()) {
      refusal = absl::StrCat("no version to serve: expected ", model.dir, "/<version>/",
                             kModelFileName, " with <version> an integer >= 1");
    }
    if (!refusal.empty()) {
      Log(absl::StrCat("model '", model.name, "' refused: ", refusal));
      std::lock_guard<std::mutex> lock(mu_);
      ModelState& state = models_[model.name];
      state.loading = false;
      state.refusal = refusal;
      continue;
    }
    budget.emplace_back(config, static_cast<int>(model.versions.size()));
    configs.emplace(model.name, std::move(config));
  }
  int automatic = AutomaticThreads(cpus_, budget);
  // Instances past the CPU count are fine while they idle; threads that configs ask for
  // beyond it slow every busy model down, which the person configuring should hear about.
  int64_t claimed = 0;
  for (const auto& [config, versions] : budget) {
    if (config.threads_per_instance) {
      claimed += int64_t{config.instances} * versions * *config.threads_per_instance;
    }
  }
  if (claimed > cpus_) {
    Log(absl::StrCat("warning: the configs ask for ", claimed,
                     " intra-op threads in all (instances x threads_per_instance, every "
                     "version) for ", cpus_, " CPUs; busy models will slow each other down"));
  }
  Log(absl::StrCat("intra-op threads per instance where threads_per_instance is not set: ",
                   automatic, " (", cpus_, " CPUs shared by every version's instances)"));

  for (const ModelEntry& model : scan.models) {
    auto config = configs.find(model.name);
    if (config == configs.end()) continue;  // refused above
    int threads = config->second.threads_per_instance.value_or(automatic);
    std::map<int64_t, std::shared_ptr<ServedVersion>> loaded;
    std::map<int64_t, std::string> failed;
    for (const VersionEntry& entry : model.versions) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (cancelled_) return;
      }
      VersionLoadOptions options;
      options.model_name = model.name;
      options.version = entry.version;
      options.model_path = entry.model_path;
      options.config = config->second;
      options.threads_per_instance = threads;
      absl::StatusOr<std::unique_ptr<ServedVersion>> version =
          ServedVersion::Load(options, backend_, clock_);
      if (!version.ok()) {
        Log(absl::StrCat("model '", model.name, "' version ", entry.version, " refused: ",
                         version.status().message()));
        failed[entry.version] = std::string(version.status().message());
        continue;
      }
      Log(absl::StrCat("model '", model.name, "' version ", entry.version, " ready (",
                       config->second.instances, " instance(s) x ", threads, " thread(s)",
                       config->second.max_batch_size > 0
                           ? absl::StrCat(", batches up to ", config->second.max_batch_size)
                           : "",
                       ")"));
      loaded[entry.version] = std::shared_ptr<ServedVersion>(std::move(*version));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model.name];
    state.loading = false;
    state.versions = std::move(loaded);
    state.failed_versions = std::move(failed);
    if (state.versions.empty()) {
      std::vector<std::string> reasons;
      for (const auto& [v, why] : state.failed_versions) reasons.push_back(why);
      state.refusal = absl::StrCat("no version loaded: ", absl::StrJoin(reasons, "; "));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  loaded_ = true;
}

void ModelManager::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

absl::Status ModelManager::UnknownModel(const std::string& model) const {
  std::vector<std::string> names;
  for (const auto& [name, state] : models_) names.push_back(name);
  return absl::NotFoundError(absl::StrCat("unknown model '", model, "'; the repository has: ",
                                          names.empty() ? "no models" : absl::StrJoin(names, ", ")));
}

bool ModelManager::IsLoaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_;
}

absl::StatusOr<std::shared_ptr<ServedVersion>> ModelManager::FindVersion(
    const std::string& model, const std::optional<std::string>& version_text) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return UnknownModel(model);
  const ModelState& state = it->second;
  if (state.loading) {
    return absl::UnavailableError(absl::StrCat("model '", model, "' is still loading"));
  }
  if (state.versions.empty()) {
    return absl::NotFoundError(
        absl::StrCat("model '", model, "' is not available: ", state.refusal));
  }
  if (!version_text) return state.versions.rbegin()->second;
  std::vector<std::string> ready;
  for (const auto& [v, version] : state.versions) ready.push_back(absl::StrCat(v));
  int64_t number = 0;
  if (absl::SimpleAtoi(*version_text, &number)) {
    if (auto v = state.versions.find(number); v != state.versions.end()) return v->second;
    if (auto f = state.failed_versions.find(number); f != state.failed_versions.end()) {
      return absl::NotFoundError(absl::StrCat("model '", model, "' version ", number,
                                              " is not available: ", f->second));
    }
  }
  return absl::NotFoundError(absl::StrCat("model '", model, "' has no version '", *version_text,
                                          "'; ready versions: ", absl::StrJoin(ready, ", ")));
}

absl::StatusOr<ModelView> ModelManager::FindModel(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return UnknownModel(model);
  ModelView view;
  view.name = model;
  const ModelState& state = it->second;
  for (const auto& [v, version] : state.versions) view.versions.push_back(version);
  view.ready = !state.loading && !view.versions.empty();
  if (state.loading) {
    view.not_ready_reason = "still loading";
  } else if (view.versions.empty()) {
    view.not_ready_reason = state.refusal;
  }
  return view;
}

}  // namespace shoal::serve
