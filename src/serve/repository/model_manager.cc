#include "serve/repository/model_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <iterator>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "nlohmann/json.hpp"
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

// The decisions that outlive the server: DIR/<model>/<this>. Hidden, so the scanner and
// publishers leave it alone (docs/design/0017-serve-canary.md says why it lives there).
constexpr char kRolloutStateFile[] = ".shoal-serve-rollout.json";

std::string Join(const std::set<int64_t>& numbers) {
  std::vector<std::string> parts;
  for (int64_t n : numbers) parts.push_back(absl::StrCat(n));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

std::string ShareText(double share) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g%%", share * 100);
  return text;
}

}  // namespace

ModelManager::~ModelManager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    rollout_stopping_ = true;
    for (auto& [name, state] : models_) {
      if (state.canary) retired_.push_back(std::move(state.canary));
    }
  }
  rollout_wake_.notify_all();
  if (rollout_thread_.joinable()) rollout_thread_.join();
  // Copies still running call back into their rollout: wait for them (the front ends have
  // stopped; what is queued runs within the versions' shutdown anyway).
  std::vector<std::shared_ptr<CanaryRollout>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    retired = std::move(retired_);
  }
  for (const auto& rollout : retired) {
    for (int i = 0; rollout->pending() > 0 && i < 1000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

std::string ModelManager::ModelDir(const std::string& model) const {
  return absl::StrCat(repository_dir_, "/", model);
}

ModelManager::PersistedRollout ModelManager::ReadRollout(const std::string& model_dir) {
  PersistedRollout rollout;
  std::string path = absl::StrCat(model_dir, "/", kRolloutStateFile);
  if (access(path.c_str(), F_OK) != 0) return rollout;
  absl::StatusOr<std::string> text = ReadFile(path);
  std::string error;
  if (!text.ok()) {
    error = std::string(text.status().message());
  } else {
    nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.is_object()) {
      error = "not a JSON object";
    } else {
      if (json.contains("pinned") && json["pinned"].is_number_integer()) {
        rollout.pinned = json["pinned"].get<int64_t>();
      }
      if (json.contains("rolled_back") && json["rolled_back"].is_object()) {
        for (const auto& [key, why] : json["rolled_back"].items()) {
          int64_t version = 0;
          if (absl::SimpleAtoi(key, &version) && why.is_string()) {
            rollout.rolled_back[version] = why.get<std::string>();
          }
        }
      }
    }
  }
  std::string& last = rollout_read_errors_[model_dir];
  if (error != last && !error.empty()) {
    Log(absl::StrCat("warning: ", path, ": ", error, "; the model's pin and rolled-back versions "
                     "there are ignored until it is fixed"));
  }
  last = error;
  return rollout;
}

void ModelManager::WriteRollout(const std::string& model_dir, const std::string& model,
                                const PersistedRollout& rollout) {
  std::string path = absl::StrCat(model_dir, "/", kRolloutStateFile);
  if (!rollout.pinned && rollout.rolled_back.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      Log(absl::StrCat("warning: model '", model, "': cannot remove ", path, ": ",
                       std::strerror(errno)));
    }
    return;
  }
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (rollout.pinned) json["pinned"] = *rollout.pinned;
  nlohmann::ordered_json rolled_back = nlohmann::ordered_json::object();
  for (const auto& [version, why] : rollout.rolled_back) rolled_back[absl::StrCat(version)] = why;
  json["rolled_back"] = rolled_back;
  absl::Status written = WriteFileAtomically(path, json.dump(2) + "\n");
  if (!written.ok()) {
    Log(absl::StrCat("warning: model '", model, "': cannot record its pin and rolled-back "
                     "versions: ", written.message(),
                     "; they hold until the server restarts"));
  }
}

void ModelManager::RetireLocked(ModelState& state, std::shared_ptr<CanaryRollout> rollout) {
  if (!rollout) return;
  rollout->Stop();
  state.routed_current += rollout->routed_to_current();
  state.routed_canary += rollout->routed_to_canary();
  state.fallbacks += rollout->Snapshot().fallbacks;
  retired_.push_back(std::move(rollout));
}

void ModelManager::StartRolloutThreadLocked() {
  if (!rollout_thread_.joinable() && !rollout_stopping_) {
    rollout_thread_ = std::thread([this] { RolloutLoop(); });
  }
  rollout_wake_.notify_all();
}

void ModelManager::DecideCanaries() {
  std::vector<std::pair<std::string, std::shared_ptr<CanaryRollout>>> canaries;
  std::vector<std::shared_ptr<CanaryRollout>> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, state] : models_) {
      if (state.canary) canaries.emplace_back(name, state.canary);
    }
    auto done = std::stable_partition(retired_.begin(), retired_.end(),
                                      [](const auto& r) { return r->pending() > 0; });
    freed.assign(std::make_move_iterator(done), std::make_move_iterator(retired_.end()));
    retired_.erase(done, retired_.end());
  }
  freed.clear();  // here, not on a model's instance thread
  for (const auto& [name, rollout] : canaries) {
    std::optional<CanaryDecision> decision = rollout->Evaluate();
    if (!decision) continue;
    // Traffic leaves a failing canary now, even while a load holds update_mu_.
    if (decision->verdict == CanaryVerdict::kRollBack) rollout->Stop();
    std::lock_guard<std::mutex> update(update_mu_);
    ApplyDecision(name, rollout, *decision, "");
  }
}

void ModelManager::RolloutLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!rollout_stopping_) {
    bool busy = !retired_.empty() ||
                std::any_of(models_.begin(), models_.end(),
                            [](const auto& m) { return m.second.canary != nullptr; });
    if (busy) {
      rollout_wake_.wait_for(lock, std::chrono::milliseconds(50));
    } else {
      rollout_wake_.wait(lock);
    }
    if (rollout_stopping_) break;
    lock.unlock();
    DecideCanaries();
    lock.lock();
  }
}

void ModelManager::ApplyDecision(const std::string& model,
                                 const std::shared_ptr<CanaryRollout>& rollout,
                                 const CanaryDecision& decision, const std::string& by) {
  const bool promote = decision.verdict == CanaryVerdict::kPromote;
  const int64_t canary = rollout->canary()->version();
  const int64_t current = rollout->current()->version();
  std::string reason = by.empty() ? decision.reason : by;
  std::vector<std::shared_ptr<ServedVersion>> released;
  PersistedRollout persisted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(model);
    if (it == models_.end() || it->second.canary != rollout) return;  // changed meanwhile
    ModelState& state = it->second;
    if (promote) {
      for (auto& [v, version] : state.versions) released.push_back(std::move(version));
      state.versions = {{canary, rollout->canary()}};
      state.promoted += 1;
    } else {
      state.rolled_back[canary] = reason;
      state.rolled_back_count += 1;
    }
    RetireLocked(state, std::move(state.canary));
    state.canary = nullptr;
    state.last_event = RolloutEvent{canary, promote ? "promoted" : "rolled_back", reason,
                                    clock_->UnixMillis()};
    persisted.pinned = state.pinned;
    persisted.rolled_back = state.rolled_back;
  }
  if (!promote) WriteRollout(ModelDir(model), model, persisted);
  Log(promote ? absl::StrCat("model '", model, "' version ", canary,
                             " promoted (was a canary beside version ", current,
                             "; it now serves every unversioned request): ", reason)
              : absl::StrCat("model '", model, "' version ", canary,
                             " rolled back (was a canary beside version ", current,
                             ", which keeps serving; not loaded again until pinned): ", reason));
  for (const auto& version : released) {
    Log(absl::StrCat("model '", model, "' version ", version->version(),
                     " unloaded (requests running on it finish first)"));
  }
}

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
  options.compute_slots = compute_slots_;
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
  std::shared_ptr<CanaryRollout> running_canary;
  PersistedRollout persisted = ReadRollout(model.dir);
  bool state_file = access(absl::StrCat(model.dir, "/", kRolloutStateFile).c_str(), F_OK) == 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ModelState& state = models_[model.name];
    current = state.versions;
    failed = state.failed_versions;
    running_canary = state.canary;
    // What this server decided holds even where the file could not be written.
    for (const auto& [v, why] : state.rolled_back) persisted.rolled_back.emplace(v, why);
    if (!state_file) persisted.pinned = state.pinned;
  }
  if (config.ok() && config->ensemble) return SyncEnsemble(model, *config);
  std::optional<CanaryConfig> canary_config;
  if (config.ok()) canary_config = config->rollout.canary;
  std::shared_ptr<ServedVersion> canary_version;  // to run as a canary beside `current`
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
      if (running_canary && running_canary->canary()->version() == entry.version) {
        return running_canary->canary();
      }
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
        if (persisted.rolled_back.count(it->version)) continue;
        if (persisted.pinned && it->version != *persisted.pinned) continue;
        if (auto version = serve(*it)) {
          chosen[it->version] = std::move(version);
          break;
        }
      }
      // A newer version than the one serving runs as a canary first, when the config asks.
      if (canary_config && !persisted.pinned && chosen.size() == 1 && current.size() == 1 &&
          chosen.begin()->first > current.begin()->first &&
          !persisted.rolled_back.count(current.begin()->first)) {
        canary_version = chosen.begin()->second;
        chosen = current;
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
  std::vector<std::string> rollout_log;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model.name];
    state.canary_config = canary_config;
    state.pinned = persisted.pinned;
    state.rolled_back = persisted.rolled_back;
    std::shared_ptr<ServedVersion> serving_next =
        chosen.empty() ? nullptr : chosen.rbegin()->second;
    bool same_canary = state.canary && canary_version &&
                       state.canary->canary() == canary_version &&
                       state.canary->current() == serving_next;
    if (!same_canary && state.canary) {
      int64_t ended = state.canary->canary()->version();
      std::string why;
      if (persisted.rolled_back.count(ended)) {
        why = absl::StrCat("rolled back (recorded in ", kRolloutStateFile,
                           ", e.g. by another server sharing the repository): ",
                           persisted.rolled_back.at(ended));
        state.rolled_back_count += 1;
        state.last_event =
            RolloutEvent{ended, "rolled_back", persisted.rolled_back.at(ended), clock_->UnixMillis()};
      } else if (persisted.pinned) {
        why = absl::StrCat("canary ended: the model is pinned to version ", *persisted.pinned);
      } else if (canary_version) {
        why = absl::StrCat("canary superseded by version ", canary_version->version());
        state.last_event = RolloutEvent{ended, "superseded", why, clock_->UnixMillis()};
      } else {
        why = "canary ended (its version left the repository, or the config has no canary now)";
      }
      rollout_log.push_back(absl::StrCat("model '", model.name, "' version ", ended, ": ", why));
      RetireLocked(state, std::move(state.canary));
      state.canary = nullptr;
    }
    if (!same_canary && canary_version && serving_next) {
      state.canary = std::make_shared<CanaryRollout>(*canary_config, serving_next, canary_version,
                                                     clock_);
      StartRolloutThreadLocked();
      const CanaryConfig& c = *canary_config;
      rollout_log.push_back(absl::StrCat(
          "model '", model.name, "' version ", canary_version->version(),
          " is a canary beside version ", serving_next->version(), ": ", ShareText(c.share),
          " of the unversioned requests", c.mirror ? " mirrored to it (replies from the current)" : "",
          ", promoted after at least ", c.duration_s, " s and ", c.min_requests,
          " canary requests unless it fails more than ", ShareText(c.max_error_rate),
          c.max_p99_ratio > 0 ? absl::StrCat(", its p99 exceeds x", c.max_p99_ratio) : "",
          c.max_output_drift ? absl::StrCat(", or its output drift exceeds ", *c.max_output_drift)
                             : ""));
    }
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
  for (const std::string& line : rollout_log) Log(line);
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
    RetireLocked(state, std::move(state.canary));
    state.canary = nullptr;
    state.refusal = absl::StrCat("unloaded (POST /v2/repository/models/", model,
                                 "/load serves it again)");
  }
  Log(absl::StrCat("model '", model, "' unloaded on request (", released.size(),
                   " version(s); requests running on them finish first)"));
  return absl::OkStatus();
}

absl::StatusOr<ModelEntry> ModelManager::ScanModel(const std::string& model) const {
  absl::StatusOr<RepositoryScan> scan = ScanModelRepository(repository_dir_);
  if (!scan.ok()) return absl::UnavailableError(scan.status().message());
  for (ModelEntry& entry : scan->models) {
    if (entry.name == model) return std::move(entry);
  }
  return absl::NotFoundError(absl::StrCat("no model '", model, "' in the repository ",
                                          repository_dir_, ": expected a directory ",
                                          repository_dir_, "/", model));
}

absl::Status ModelManager::Pin(const std::string& model, int64_t version) {
  std::lock_guard<std::mutex> update(update_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!models_.count(model)) return UnknownModel(model);
  }
  absl::StatusOr<ModelEntry> entry = ScanModel(model);
  if (!entry.ok()) return entry.status();
  const absl::StatusOr<ModelConfig>& config = ReadConfig(*entry);
  if (config.ok() && config->ensemble) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", model, "' is an ensemble: it has no versions to pin"));
  }
  if (config.ok() && config->version_policy == VersionPolicy::kAll) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model, "' has version_policy all: every version serves already; name the "
        "version in the request instead of pinning"));
  }
  std::set<int64_t> on_disk;
  for (const VersionEntry& v : entry->versions) on_disk.insert(v.version);
  if (!on_disk.count(version)) {
    return absl::NotFoundError(absl::StrCat("model '", model, "' has no version ", version,
                                            " on disk; its versions: ", Join(on_disk)));
  }
  PersistedRollout before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model];
    if (state.unloaded) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", model, "' is unloaded; load it first (POST /v2/repository/models/", model,
          "/load)"));
    }
    before = {state.pinned, state.rolled_back};
    state.pinned = version;
    state.rolled_back.erase(version);
  }
  PersistedRollout after = before;
  after.pinned = version;
  after.rolled_back.erase(version);
  WriteRollout(entry->dir, model, after);
  SyncModel(*entry, /*retry_failed=*/true);
  std::string why_not;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model];
    if (!state.versions.count(version)) {
      auto failed = state.failed_versions.find(version);
      why_not = failed != state.failed_versions.end() ? failed->second.why : "it did not load";
      state.pinned = before.pinned;
      state.rolled_back = before.rolled_back;
    } else {
      state.last_event = RolloutEvent{version, "pinned", "pinned by request", clock_->UnixMillis()};
    }
  }
  if (!why_not.empty()) {
    WriteRollout(entry->dir, model, before);
    SyncModel(*entry, /*retry_failed=*/false);
    return absl::InvalidArgumentError(absl::StrCat("model '", model, "' version ", version,
                                                   " cannot be pinned: ", why_not,
                                                   " (nothing changed)"));
  }
  Log(absl::StrCat("model '", model, "' pinned to version ", version,
                   " by request: it serves every unversioned request, newer versions are "
                   "ignored until POST /v2/repository/models/",
                   model, "/unpin"));
  return absl::OkStatus();
}

absl::Status ModelManager::Unpin(const std::string& model) {
  std::lock_guard<std::mutex> update(update_mu_);
  PersistedRollout after;
  int64_t was = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(model);
    if (it == models_.end()) return UnknownModel(model);
    if (!it->second.pinned) {
      return absl::FailedPreconditionError(absl::StrCat("model '", model, "' is not pinned"));
    }
    was = *it->second.pinned;
  }
  absl::StatusOr<ModelEntry> entry = ScanModel(model);
  if (!entry.ok()) return entry.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model];
    state.pinned.reset();
    state.last_event = RolloutEvent{was, "unpinned", "unpinned by request", clock_->UnixMillis()};
    after.rolled_back = state.rolled_back;
  }
  WriteRollout(entry->dir, model, after);
  Log(absl::StrCat("model '", model, "' unpinned by request: its newest version serves again"));
  SyncModel(*entry, /*retry_failed=*/false);
  return absl::OkStatus();
}

absl::Status ModelManager::RollBack(const std::string& model) {
  std::lock_guard<std::mutex> update(update_mu_);
  std::shared_ptr<CanaryRollout> rollout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(model);
    if (it == models_.end()) return UnknownModel(model);
    rollout = it->second.canary;
  }
  if (rollout) {
    rollout->Stop();
    ApplyDecision(model, rollout, CanaryDecision{CanaryVerdict::kRollBack, ""},
                  "rolled back by request");
    return absl::OkStatus();
  }
  absl::StatusOr<ModelEntry> entry = ScanModel(model);
  if (!entry.ok()) return entry.status();
  const absl::StatusOr<ModelConfig>& config = ReadConfig(*entry);
  if (config.ok() && (config->ensemble || config->version_policy == VersionPolicy::kAll)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model, "': rolling back needs a model with version_policy latest (not an "
        "ensemble)"));
  }
  PersistedRollout before;
  int64_t serving = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model];
    if (state.versions.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("model '", model, "' serves no version to roll back"));
    }
    serving = state.versions.rbegin()->first;
    before = {state.pinned, state.rolled_back};
    state.rolled_back[serving] = "rolled back by request";
    if (state.pinned == serving) state.pinned.reset();
  }
  PersistedRollout after = before;
  after.rolled_back[serving] = "rolled back by request";
  if (after.pinned == serving) after.pinned.reset();
  WriteRollout(entry->dir, model, after);
  SyncModel(*entry, /*retry_failed=*/false);
  int64_t now_serving = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ModelState& state = models_[model];
    if (!state.versions.empty()) now_serving = state.versions.rbegin()->first;
    if (now_serving == serving || now_serving == 0) {
      state.pinned = before.pinned;
      state.rolled_back = before.rolled_back;
    } else {
      state.rolled_back_count += 1;
      state.last_event = RolloutEvent{
          serving, "rolled_back", absl::StrCat("rolled back by request; version ", now_serving,
                                               " serves instead"),
          clock_->UnixMillis()};
    }
  }
  if (now_serving == serving || now_serving == 0) {
    WriteRollout(entry->dir, model, before);
    SyncModel(*entry, /*retry_failed=*/false);
    std::set<int64_t> on_disk;
    for (const VersionEntry& v : entry->versions) on_disk.insert(v.version);
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model, "' has no other version that loads to roll back to (on disk: ",
        Join(on_disk), "); version ", serving, " keeps serving"));
  }
  Log(absl::StrCat("model '", model, "' version ", serving, " rolled back by request: version ",
                   now_serving, " serves instead; ", serving, " is not loaded again until pinned"));
  return absl::OkStatus();
}

std::vector<RolloutMetrics> ModelManager::RolloutMetricsNow() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RolloutMetrics> metrics;
  for (const auto& [name, state] : models_) {
    if (!state.canary_config && !state.pinned && state.rolled_back.empty() && !state.last_event) {
      continue;
    }
    RolloutMetrics& m = metrics.emplace_back();
    m.model = name;
    m.promoted = state.promoted;
    m.rolled_back = state.rolled_back_count;
    m.routed_current = state.routed_current;
    m.routed_canary = state.routed_canary;
    m.fallbacks = state.fallbacks;
    if (state.canary) {
      m.canary_share = state.canary->stopped() ? 0 : state.canary->config().share;
      m.routed_current += state.canary->routed_to_current();
      m.routed_canary += state.canary->routed_to_canary();
      m.fallbacks += state.canary->Snapshot().fallbacks;
    }
  }
  return metrics;
}

std::vector<RepositoryIndexEntry> ModelManager::Index() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RepositoryIndexEntry> index;
  for (const auto& [name, state] : models_) {
    if (state.versions.empty() && state.failed_versions.empty()) {
      index.push_back({name, "", state.loading ? "LOADING" : "UNAVAILABLE", state.refusal});
      continue;
    }
    bool rollout = state.canary_config || state.pinned || !state.rolled_back.empty() ||
                   state.last_event;
    std::map<int64_t, RepositoryIndexEntry> rows;
    if (rollout) {
      for (const auto& [v, why] : state.rolled_back) {
        if (!state.on_disk.count(v)) continue;
        rows[v] = {name, absl::StrCat(v), "UNAVAILABLE", absl::StrCat("rolled back: ", why),
                   "rolled_back"};
      }
    }
    for (const auto& [v, why] : state.failed_versions) {
      rows[v] = {name, absl::StrCat(v), "UNAVAILABLE", why.why};
    }
    for (const auto& [v, version] : state.versions) {
      rows[v] = {name, absl::StrCat(v), "READY", ""};
      if (rollout) rows[v].rollout_state = "serving";
    }
    if (state.canary) {
      int64_t v = state.canary->canary()->version();
      rows[v] = {name, absl::StrCat(v), "READY", "", "canary"};
    }
    if (state.last_event && rows.count(state.last_event->version)) {
      rows[state.last_event->version].decision = state.last_event->decision;
      rows[state.last_event->version].decision_reason = state.last_event->reason;
    }
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
    if (state.canary) serving.push_back(state.canary->canary());
  }
  return serving;
}

bool ModelManager::IsLoaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_;
}

absl::StatusOr<std::shared_ptr<ServedVersion>> ModelManager::FindVersion(
    const std::string& model, const std::optional<std::string>& version_text) const {
  absl::StatusOr<InferenceRoute> route = RouteInference(model, version_text);
  if (!route.ok()) return route.status();
  return std::move(route->version);
}

absl::StatusOr<InferenceRoute> ModelManager::RouteInference(
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
  if (!version_text) return InferenceRoute{state.versions.rbegin()->second, state.canary};
  std::vector<std::string> ready;
  for (const auto& [v, version] : state.versions) ready.push_back(absl::StrCat(v));
  int64_t number = 0;
  if (absl::SimpleAtoi(*version_text, &number)) {
    if (auto v = state.versions.find(number); v != state.versions.end()) {
      return InferenceRoute{v->second, nullptr};
    }
    if (state.canary && state.canary->canary()->version() == number) {
      return InferenceRoute{state.canary->canary(), nullptr};
    }
    if (auto r = state.rolled_back.find(number); r != state.rolled_back.end()) {
      return absl::NotFoundError(absl::StrCat("model '", model, "' version ", number,
                                              " was rolled back: ", r->second));
    }
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
  if (numeral && state.canary && state.canary->canary()->version() == number) {
    return Readiness{true, ""};
  }
  if (numeral && state.rolled_back.count(number) && state.on_disk.count(number)) {
    return not_ready(absl::StrCat("model '", model, "' version ", number, " was rolled back: ",
                                  state.rolled_back.at(number)));
  }
  if (numeral && state.failed_versions.count(number)) {
    return not_ready(absl::StrCat("model '", model, "' version ", number, " is not available: ",
                                  state.failed_versions.at(number).why));
  }
  // Before its first load the server does not know the versions yet.
  if (state.loading) return model_not_ready();
  if (numeral && state.on_disk.count(number)) {
    if (state.versions.empty()) return model_not_ready();
    if (state.pinned) {
      return not_ready(absl::StrCat("model '", model, "' version ", number,
                                    " is not served: the model is pinned to version ",
                                    *state.pinned));
    }
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
  if (state.canary) {
    view.versions.push_back(state.canary->canary());
    std::sort(view.versions.begin(), view.versions.end(),
              [](const auto& a, const auto& b) { return a->version() < b->version(); });
  }
  if (state.canary_config || state.pinned || !state.rolled_back.empty() || state.last_event) {
    RolloutView& rollout = view.rollout.emplace();
    rollout.has_policy = state.canary_config.has_value();
    if (!state.versions.empty()) rollout.serving = state.versions.rbegin()->first;
    if (state.canary) {
      rollout.canary = state.canary->canary()->version();
      rollout.canary_share = state.canary->stopped() ? 0 : state.canary->config().share;
      rollout.mirror = state.canary->config().mirror;
      rollout.canary_figures = state.canary->Snapshot();
    }
    rollout.pinned = state.pinned;
    rollout.rolled_back = state.rolled_back;
    rollout.last = state.last_event;
  }
  return view;
}

}  // namespace shoal::serve
