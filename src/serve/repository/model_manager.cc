#include "serve/repository/model_manager.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "serve/runtime/model_backend.h"

namespace shoal::serve {
namespace {

// One line on stderr per event a person running the server wants to see.
void Log(const std::string& line) { std::cerr << "shoal serve: " << line << std::endl; }

// How many versions of a model its policy serves at once, for the CPU budget.
int ServedVersionCount(const ModelConfig& config, const ModelEntry& model) {
  if (config.ensemble) return 0;  // runs on its members' instances
  if (config.version_policy == VersionPolicy::kAll) return static_cast<int>(model.versions.size());
  return model.versions.empty() ? 0 : 1;
}

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

const absl::StatusOr<ModelConfig>& ModelManager::ReadConfig(const ModelEntry& model) {
  std::optional<std::string> text;
  if (model.config_path) {
    absl::StatusOr<std::string> read = ReadFile(*model.config_path);
    // An unreadable file keys the cache by its error, so that it is read again once readable.
    text = read.ok() ? *read : absl::StrCat("\x01unreadable: ", read.status().message());
  }
  auto cached = configs_.find(model.name);
  if (cached != configs_.end() && cached->second.text == text) return cached->second.config;
  absl::StatusOr<ModelConfig> config = ModelConfig{};
  if (model.config_path) {
    config = text->rfind("\x01", 0) == 0 ? ReadModelConfigFile(*model.config_path)
                                         : ParseModelConfig(*text, *model.config_path);
  }
  if (!config.ok()) {
    bool serving;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = models_.find(model.name);
      serving = it != models_.end() && !it->second.versions.empty();
    }
    Log(serving ? absl::StrCat("model '", model.name,
                               "': its config is now invalid, so no new version of it loads (the "
                               "loaded ones keep serving):\n",
                               config.status().message())
                : absl::StrCat("model '", model.name, "' refused: invalid config:\n",
                               config.status().message()));
  }
  ConfigCache& entry = configs_[model.name];
  entry.text = std::move(text);
  entry.config = std::move(config);
  return entry.config;
}

absl::StatusOr<std::shared_ptr<ServedVersion>> ModelManager::LoadVersion(
    const ModelEntry& model, const VersionEntry& entry, const ModelConfig& config) {
  int threads = config.threads_per_instance.value_or(automatic_threads_);
  VersionLoadOptions options;
  options.model_name = model.name;
  options.version = entry.version;
  options.model_path = entry.model_path;
  options.config = config;
  options.threads_per_instance = threads;
  absl::StatusOr<std::unique_ptr<ServedVersion>> version =
      ServedVersion::Load(options, backend_, clock_);
  if (!version.ok()) {
    Log(absl::StrCat("model '", model.name, "' version ", entry.version, " refused: ",
                     version.status().message()));
    return version.status();
  }
  Log(absl::StrCat("model '", model.name, "' version ", entry.version, " ready (",
                   config.instances, " instance(s) x ", threads, " thread(s)",
                   config.max_batch_size > 0
                       ? absl::StrCat(", batches up to ", config.max_batch_size)
                       : "",
                   ")"));
  return std::shared_ptr<ServedVersion>(std::move(*version));
}

std::vector<std::string> ModelManager::SyncModel(const ModelEntry& model, bool retry_failed) {
  std::vector<std::string> refusals;
  const absl::StatusOr<ModelConfig>& config = ReadConfig(model);
  std::map<int64_t, std::shared_ptr<ServedVersion>> current;
  std::map<int64_t, FailedVersion> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ModelState& state = models_[model.name];
    current = state.versions;
    failed = state.failed_versions;
  }
  if (config.ok() && config->ensemble) return SyncEnsemble(model, *config);
  std::string refusal;
  std::map<int64_t, std::shared_ptr<ServedVersion>> chosen;
  if (!config.ok()) {
    refusal = absl::StrCat("invalid config:\n", config.status().message());
  } else if (model.versions.empty()) {
    refusal = absl::StrCat("no version to serve: expected ", model.dir, "/<version>/",
                           kModelFileName, " with <version> an integer >= 1");
  } else {
    // The version, loaded now unless it already serves; null when refused (now or before,
    // with the same files).
    auto serve = [&](const VersionEntry& entry) -> std::shared_ptr<ServedVersion> {
      if (auto it = current.find(entry.version); it != current.end()) return it->second;
      auto before = failed.find(entry.version);
      if (!retry_failed && before != failed.end() &&
          before->second.fingerprint == entry.fingerprint) {
        return nullptr;
      }
      if (Cancelled()) return nullptr;
      absl::StatusOr<std::shared_ptr<ServedVersion>> loaded = LoadVersion(model, entry, *config);
      if (!loaded.ok()) {
        failed[entry.version] = {std::string(loaded.status().message()), entry.fingerprint};
        refusals.push_back(
            absl::StrCat("version ", entry.version, ": ", loaded.status().message()));
        return nullptr;
      }
      failed.erase(entry.version);
      return *std::move(loaded);
    };
    if (config->version_policy == VersionPolicy::kLatest) {
      for (auto it = model.versions.rbegin(); it != model.versions.rend(); ++it) {
        if (auto version = serve(*it)) {
          chosen[it->version] = std::move(version);
          break;
        }
      }
    } else {
      for (const VersionEntry& entry : model.versions) {
        if (auto version = serve(entry)) chosen[entry.version] = std::move(version);
      }
    }
    // Refusals of versions no longer on disk are forgotten.
    for (auto it = failed.begin(); it != failed.end();) {
      bool on_disk = std::any_of(model.versions.begin(), model.versions.end(),
                                 [&](const VersionEntry& e) { return e.version == it->first; });
      it = on_disk ? std::next(it) : failed.erase(it);
    }
    std::vector<std::string> reasons;
    for (const auto& [v, why] : failed) reasons.push_back(why.why);
    if (chosen.empty()) refusal = absl::StrCat("no version loaded: ", absl::StrJoin(reasons, "; "));
  }

  // Switch: from here on lookups get the chosen versions. The versions let go are destroyed
  // below, or by the last request still running on them.
  std::vector<std::shared_ptr<ServedVersion>> released;
  std::string log_refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model.name];
    state.loading = false;
    state.failed_versions = std::move(failed);
    state.on_disk.clear();
    for (const VersionEntry& entry : model.versions) state.on_disk.insert(entry.version);
    // A model none of whose versions loads now keeps serving what it served.
    if (!chosen.empty() || state.versions.empty()) {
      for (auto& [v, version] : state.versions) {
        if (!chosen.count(v)) released.push_back(version);
      }
      state.versions = std::move(chosen);
    }
    std::string new_refusal = state.versions.empty() ? refusal : "";
    // A config refusal is logged by ReadConfig; version refusals by LoadVersion.
    if (new_refusal != state.refusal && !new_refusal.empty() && config.ok() &&
        model.versions.empty()) {
      log_refusal = new_refusal;
    }
    state.refusal = std::move(new_refusal);
  }
  if (!log_refusal.empty()) Log(absl::StrCat("model '", model.name, "' refused: ", log_refusal));
  for (const auto& version : released) {
    Log(absl::StrCat("model '", model.name, "' version ", version->version(),
                     " unloaded (requests running on it finish first)"));
  }
  return refusals;
}

std::optional<std::string> ModelManager::EnsembleCycle(const std::string& model) const {
  std::vector<std::string> path;
  std::function<std::optional<std::string>(const std::string&)> visit =
      [&](const std::string& name) -> std::optional<std::string> {
    auto on_path = std::find(path.begin(), path.end(), name);
    if (on_path != path.end()) {
      if (on_path != path.begin()) return std::nullopt;  // a cycle not through `model`
      std::vector<std::string> cycle(path.begin(), path.end());
      cycle.push_back(name);
      return absl::StrJoin(cycle, " -> ");
    }
    auto cached = configs_.find(name);
    if (cached == configs_.end() || !cached->second.config.ok() ||
        !cached->second.config->ensemble) {
      return std::nullopt;
    }
    path.push_back(name);
    for (const std::string& member : cached->second.config->ensemble->models) {
      if (auto cycle = visit(member)) return cycle;
    }
    path.pop_back();
    return std::nullopt;
  };
  return visit(model);
}

std::vector<std::string> ModelManager::SyncEnsemble(const ModelEntry& model,
                                                    const ModelConfig& config) {
  const EnsembleConfig& ensemble = *config.ensemble;
  std::string key = absl::StrCat(absl::StrJoin(ensemble.models, ","), "|",
                                 CombinerName(ensemble.combine));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model.name];
    if (state.ensemble_key == key && !state.versions.empty()) return {};
  }
  std::string refusal;
  std::vector<std::shared_ptr<ServedVersion>> members;
  if (std::optional<std::string> cycle = EnsembleCycle(model.name)) {
    refusal = absl::StrCat("its members form a cycle: ", *cycle);
  } else {
    for (const std::string& member : ensemble.models) {
      absl::StatusOr<std::shared_ptr<ServedVersion>> version = FindVersion(member, std::nullopt);
      if (!version.ok()) {
        bool unknown;
        {
          std::lock_guard<std::mutex> lock(mu_);
          unknown = models_.find(member) == models_.end();
        }
        refusal = unknown ? absl::StrCat("unknown member '", member, "': ",
                                         version.status().message())
                          : absl::StrCat("member '", member, "' is not available: ",
                                         version.status().message());
        break;
      }
      members.push_back(*std::move(version));
    }
  }
  std::shared_ptr<ServedVersion> built;
  if (refusal.empty()) {
    EnsembleOptions options;
    options.model_name = model.name;
    options.config = ensemble;
    options.members = std::move(members);
    options.lookup = [this](const std::string& member) {
      return FindVersion(member, std::nullopt);
    };
    absl::StatusOr<std::unique_ptr<ServedVersion>> created =
        ServedVersion::CreateEnsemble(options, clock_);
    if (created.ok()) {
      built = std::shared_ptr<ServedVersion>(*std::move(created));
    } else {
      refusal = std::string(created.status().message());
    }
  }
  std::vector<std::shared_ptr<ServedVersion>> released;
  bool log_refusal = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model.name];
    state.loading = false;
    state.failed_versions.clear();
    state.on_disk = {1};  // an ensemble is its config: version 1
    if (built) {
      for (auto& [v, version] : state.versions) released.push_back(std::move(version));
      state.versions = {{1, built}};
      state.ensemble_key = key;
      state.refusal.clear();
    } else {
      // An ensemble serving keeps serving when its new config is refused; the refusal shows
      // only once nothing serves, and is logged once per change.
      std::string full = absl::StrCat("ensemble refused: ", refusal);
      log_refusal = full != state.refusal;
      state.refusal = full;
    }
  }
  if (built) {
    Log(absl::StrCat("model '", model.name, "' ready: an ensemble of ",
                     absl::StrJoin(ensemble.models, ", "), " (", CombinerName(ensemble.combine),
                     ")"));
    return {};
  }
  if (log_refusal) {
    Log(absl::StrCat("model '", model.name, "' refused: ensemble refused: ", refusal));
  }
  return {absl::StrCat("ensemble refused: ", refusal)};
}

void ModelManager::SyncAll(const std::vector<const ModelEntry*>& models) {
  std::vector<const ModelEntry*> ensembles;
  std::map<std::string, const ModelEntry*> by_name;
  for (const ModelEntry* model : models) {
    if (Cancelled()) return;
    const absl::StatusOr<ModelConfig>& config = ReadConfig(*model);
    if (config.ok() && config->ensemble) {
      ensembles.push_back(model);
      by_name[model->name] = model;
      continue;
    }
    SyncModel(*model, /*retry_failed=*/false);
  }
  // Members first: depth-first, each ensemble after the ensembles among its members. A cycle
  // is cut where it closes; SyncEnsemble refuses its ensembles.
  std::set<std::string> done, visiting;
  std::function<void(const ModelEntry*)> visit = [&](const ModelEntry* model) {
    if (done.count(model->name) || visiting.count(model->name)) return;
    visiting.insert(model->name);
    for (const std::string& member : ReadConfig(*model)->ensemble->models) {
      if (auto it = by_name.find(member); it != by_name.end()) visit(it->second);
    }
    visiting.erase(model->name);
    done.insert(model->name);
    if (!Cancelled()) SyncModel(*model, /*retry_failed=*/false);
  };
  for (const ModelEntry* model : ensembles) visit(model);
}

void ModelManager::LoadRepository(const RepositoryScan& scan) {
  for (const std::string& note : scan.ignored) Log(absl::StrCat("ignored ", note));
  std::lock_guard<std::mutex> update(update_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ModelEntry& model : scan.models) models_[model.name];  // all known, loading
  }
  // Configs first: the CPU split needs every model's instance count.
  std::vector<std::pair<ModelConfig, int>> budget;
  for (const ModelEntry& model : scan.models) {
    for (const std::string& skipped : model.skipped_versions) {
      Log(absl::StrCat("skipped ", skipped));
    }
    const absl::StatusOr<ModelConfig>& config = ReadConfig(model);
    if (config.ok()) budget.emplace_back(*config, ServedVersionCount(*config, model));
  }
  automatic_threads_ = AutomaticThreads(cpus_, budget);
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
                   automatic_threads_, " (", cpus_, " CPUs shared by every version's instances)"));

  std::vector<const ModelEntry*> all;
  for (const ModelEntry& model : scan.models) all.push_back(&model);
  SyncAll(all);
  if (Cancelled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  loaded_ = true;
}

void ModelManager::ApplyScan(const RepositoryScan& scan) {
  std::lock_guard<std::mutex> update(update_mu_);
  std::vector<const ModelEntry*> to_sync;
  for (const ModelEntry& model : scan.models) {
    if (Cancelled()) return;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = models_.find(model.name);
      if (it != models_.end() && it->second.unloaded) continue;
      if (it == models_.end()) {
        models_[model.name];
        found = true;
      }
    }
    if (found) {
      Log(absl::StrCat("model '", model.name, "' appeared in the repository"));
      for (const std::string& skipped : model.skipped_versions) {
        Log(absl::StrCat("skipped ", skipped));
      }
    }
    to_sync.push_back(&model);
  }
  SyncAll(to_sync);
}

absl::Status ModelManager::LoadModel(const std::string& model) {
  absl::StatusOr<RepositoryScan> scan = ScanModelRepository(repository_dir_);
  if (!scan.ok()) return absl::UnavailableError(scan.status().message());
  auto entry = std::find_if(scan->models.begin(), scan->models.end(),
                            [&](const ModelEntry& m) { return m.name == model; });
  if (entry == scan->models.end()) {
    return absl::NotFoundError(absl::StrCat("no model '", model, "' in the repository ",
                                            repository_dir_, ": expected a directory ",
                                            repository_dir_, "/", model));
  }
  std::lock_guard<std::mutex> update(update_mu_);
  if (Cancelled()) return absl::UnavailableError("the server is shutting down");
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model];
    state.unloaded = false;
    if (state.versions.empty()) state.loading = true;
  }
  for (const std::string& skipped : entry->skipped_versions) Log(absl::StrCat("skipped ", skipped));
  std::vector<std::string> refusals = SyncModel(*entry, /*retry_failed=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  const ModelState& state = models_[model];
  if (state.versions.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model, "' failed to load: ", state.refusal));
  }
  std::vector<std::string> serving;
  for (const auto& [v, version] : state.versions) serving.push_back(absl::StrCat(v));
  if (!refusals.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", model, "': ", absl::StrJoin(refusals, "; "), " (refused; serving version(s) ",
        absl::StrJoin(serving, ", "), ")"));
  }
  Log(absl::StrCat("model '", model, "' loaded on request: serving version(s) ",
                   absl::StrJoin(serving, ", ")));
  return absl::OkStatus();
}

absl::Status ModelManager::UnloadModel(const std::string& model) {
  std::lock_guard<std::mutex> update(update_mu_);
  std::vector<std::shared_ptr<ServedVersion>> released;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(model);
    if (it == models_.end()) return UnknownModel(model);
    ModelState& state = it->second;
    state.unloaded = true;
    state.loading = false;
    for (auto& [v, version] : state.versions) released.push_back(std::move(version));
    state.versions.clear();
    state.failed_versions.clear();
    state.refusal = absl::StrCat("unloaded (POST /v2/repository/models/", model,
                                 "/load serves it again)");
  }
  Log(absl::StrCat("model '", model, "' unloaded on request (", released.size(),
                   " version(s); requests running on them finish first)"));
  return absl::OkStatus();
}

std::vector<RepositoryIndexEntry> ModelManager::Index() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RepositoryIndexEntry> index;
  for (const auto& [name, state] : models_) {
    if (state.versions.empty() && state.failed_versions.empty()) {
      index.push_back({name, "", state.loading ? "LOADING" : "UNAVAILABLE", state.refusal});
      continue;
    }
    std::map<int64_t, RepositoryIndexEntry> rows;
    for (const auto& [v, why] : state.failed_versions) {
      rows[v] = {name, absl::StrCat(v), "UNAVAILABLE", why.why};
    }
    for (const auto& [v, version] : state.versions) rows[v] = {name, absl::StrCat(v), "READY", ""};
    for (auto& [v, row] : rows) index.push_back(std::move(row));
  }
  return index;
}

void ModelManager::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool ModelManager::Cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

absl::Status ModelManager::UnknownModel(const std::string& model) const {
  std::vector<std::string> names;
  for (const auto& [name, state] : models_) names.push_back(name);
  return absl::NotFoundError(absl::StrCat("unknown model '", model, "'; the repository has: ",
                                          names.empty() ? "no models" : absl::StrJoin(names, ", ")));
}

std::vector<std::shared_ptr<ServedVersion>> ModelManager::ServingVersions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ServedVersion>> serving;
  for (const auto& [name, state] : models_) {
    for (const auto& [v, version] : state.versions) serving.push_back(version);
  }
  return serving;
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
                                              " is not available: ", f->second.why));
    }
  }
  return absl::NotFoundError(absl::StrCat("model '", model, "' has no version '", *version_text,
                                          "'; ready versions: ", absl::StrJoin(ready, ", ")));
}

absl::StatusOr<Readiness> ModelManager::CheckReadiness(
    const std::string& model, const std::optional<std::string>& version_text) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return UnknownModel(model);
  const ModelState& state = it->second;
  std::vector<std::string> ready;
  for (const auto& [v, version] : state.versions) ready.push_back(absl::StrCat(v));
  auto not_ready = [](std::string why) { return Readiness{false, std::move(why)}; };
  auto model_not_ready = [&] {
    return not_ready(state.loading
                         ? absl::StrCat("model '", model, "' is still loading")
                         : absl::StrCat("model '", model, "' is not available: ", state.refusal));
  };
  if (!version_text) {
    if (state.loading || state.versions.empty()) return model_not_ready();
    return Readiness{true, ""};
  }
  int64_t number = 0;
  // "01" or "+1" name no version directory (model_repository.h), so they are not found.
  bool numeral = absl::SimpleAtoi(*version_text, &number) && number >= 1 &&
                 absl::StrCat(number) == *version_text;
  if (numeral && state.versions.count(number)) return Readiness{true, ""};
  if (numeral && state.failed_versions.count(number)) {
    return not_ready(absl::StrCat("model '", model, "' version ", number, " is not available: ",
                                  state.failed_versions.at(number).why));
  }
  // Before its first load the server does not know the versions yet.
  if (state.loading) return model_not_ready();
  if (numeral && state.on_disk.count(number)) {
    if (state.versions.empty()) return model_not_ready();
    return not_ready(absl::StrCat("model '", model, "' version ", number,
                                  " is not served: its version_policy serves version(s) ",
                                  absl::StrJoin(ready, ", ")));
  }
  return absl::NotFoundError(absl::StrCat("model '", model, "' has no version '", *version_text,
                                          "'; ready versions: ",
                                          ready.empty() ? "none" : absl::StrJoin(ready, ", ")));
}

absl::StatusOr<ModelView> ModelManager::FindModel(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return UnknownModel(model);
  ModelView view;
  view.name = model;
  const ModelState& state = it->second;
  for (const auto& [v, version] : state.versions) view.versions.push_back(version);
  return view;
}

}  // namespace shoal::serve
