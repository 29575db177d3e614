#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serve/repository/model_config.h"
#include "serve/repository/model_repository.h"
#include "serve/repository/served_version.h"

namespace shoal::serve {

class ModelBackend;

// What a model's metadata and statistics endpoints show.
struct ModelView {
  std::string name;
  std::vector<std::shared_ptr<ServedVersion>> versions;  // ready versions, ascending
};

// What the readiness endpoints (REST's /ready, gRPC's ModelReady) answer for a model or one
// of its versions that the server knows.
struct Readiness {
  bool ready = false;
  std::string why_not;  // when not ready: loading, refused and why, not served by the policy
};

// One row of POST /v2/repository/index: a version that serves or was refused, or a model
// without any (version empty).
struct RepositoryIndexEntry {
  std::string name;
  std::string version;  // empty for a model row
  std::string state;    // READY, LOADING, UNAVAILABLE (Triton's names)
  std::string reason;   // why UNAVAILABLE
};

// Every model of the repository and its loaded versions. Models load in the background
// (LoadRepository) while the server already answers; later the repository watcher
// (ApplyScan) and the load/unload endpoints change them. Lookups are thread-safe and hand out
// shared versions that stay valid for as long as a request holds them: a version replaced or
// unloaded finishes the requests that hold it, and is destroyed (its instances stopped, its
// memory freed) when the last of them lets go.
//
// Which versions serve follows each model's version_policy (model_config.h): `latest` serves
// the highest numbered version that loads and keeps serving it when a newer one fails to load;
// `all` serves every version that loads. A version refused is not tried again until its files
// change (its fingerprint) or a load request asks for it.
class ModelManager {
 public:
  // `backend` and `clock` must outlive the manager. `cpus` is the CPU count intra-op threads
  // are budgeted from (the server's affinity mask). `repository_dir` is what LoadModel scans.
  ModelManager(ModelBackend* backend, const Clock* clock, int cpus, std::string repository_dir)
      : backend_(backend), clock_(clock), cpus_(cpus), repository_dir_(std::move(repository_dir)) {}

  // Parses every model's config, then loads and warms up the versions its policy serves,
  // model by model. A model whose config is invalid, or with no version that loads, is
  // refused with the reason (logged on stderr); the others serve. Stops early when Cancel()
  // is called. Returns once done; IsLoaded() turns true then.
  void LoadRepository(const RepositoryScan& scan);
  // Brings every model of `scan` (the settled versions only: VersionSettleFilter) to what its
  // policy wants: new models are loaded, a new version is loaded and warmed up, then takes the
  // traffic, then the one it replaces is let go. Models unloaded by UnloadModel are left alone;
  // models no longer on disk, and a model none of whose versions is left on disk, keep serving
  // what they serve. Called by the watcher's thread; blocks while loading.
  void ApplyScan(const RepositoryScan& scan);
  void Cancel();

  // POST /v2/repository/models/{m}/load: scans the repository for `model` and loads what its
  // policy serves, retrying versions refused before; a model unloaded serves again.
  // NotFound when the repository has no such model directory; InvalidArgument naming every
  // version refused in this attempt (what served before keeps serving).
  absl::Status LoadModel(const std::string& model);
  // POST /v2/repository/models/{m}/unload: the model stops taking requests (NotFound for it
  // until loaded again, on REST and gRPC alike; the watcher leaves it alone); requests already
  // running finish. NotFound when the server knows no such model.
  absl::Status UnloadModel(const std::string& model);
  // POST /v2/repository/index: every model known, by name, each version in ascending order.
  std::vector<RepositoryIndexEntry> Index() const;

  bool IsLoaded() const;

  // Every version serving now, by model name then version (GET /metrics).
  std::vector<std::shared_ptr<ServedVersion>> ServingVersions() const;

  // The version to run for `model` and `version_text` (the URL's, nullopt for the newest
  // ready version). NotFound says which part is unknown or why it is not available;
  // Unavailable while the model is still loading.
  absl::StatusOr<std::shared_ptr<ServedVersion>> FindVersion(
      const std::string& model, const std::optional<std::string>& version_text) const;

  // Whether `model`, or its version `version_text` (nullopt: the model as a whole), serves
  // requests now; when not, why: still loading, refused (an invalid config, a version that
  // failed to load, with the reason), unloaded, or a version on disk that the version policy
  // does not serve. NotFound only for what does not exist: an unknown model, or a version that
  // is neither on disk (settled) nor serving nor refused.
  absl::StatusOr<Readiness> CheckReadiness(const std::string& model,
                                           const std::optional<std::string>& version_text) const;

  // NotFound when the repository has no such model.
  absl::StatusOr<ModelView> FindModel(const std::string& model) const;

  // The threads_per_instance a model without that key gets: the CPUs divided among all
  // instances of every version of every model that leaves it out, after the CPUs the models
  // that set it claim (at least 1). Exposed for tests and the log.
  static int AutomaticThreads(int cpus, const std::vector<std::pair<ModelConfig, int>>& models);

 private:
  struct FailedVersion {
    std::string why;
    std::string fingerprint;  // of the files that failed; other files are tried again
  };
  struct ModelState {
    bool loading = true;
    bool unloaded = false;  // by UnloadModel, until LoadModel
    std::string refusal;    // non-empty: refused, with why
    std::map<int64_t, std::shared_ptr<ServedVersion>> versions;
    std::map<int64_t, FailedVersion> failed_versions;
    // The version directories found on disk (settled) at the last sync, served or not.
    std::set<int64_t> on_disk;
    std::string ensemble_key;  // the serving ensemble's members and combiner; empty if none
  };
  // The config of a model as last read, so that an unchanged file is parsed and logged once.
  struct ConfigCache {
    std::optional<std::string> text;  // nullopt: no config file
    absl::StatusOr<ModelConfig> config;
  };

  // The model's config, re-read from disk; logs a refusal when it changed to an invalid one.
  // REQUIRES: update_mu_ held.
  const absl::StatusOr<ModelConfig>& ReadConfig(const ModelEntry& model);
  // Loads what `model`'s policy serves and switches to it. `retry_failed` tries versions
  // refused before with unchanged files. Returns the refusals of this call, one per version.
  // REQUIRES: update_mu_ held.
  std::vector<std::string> SyncModel(const ModelEntry& model, bool retry_failed);
  // SyncModel for an ensemble: builds it over its members' serving versions, unless the one
  // serving has the same config. Returns the refusal, if any. REQUIRES: update_mu_ held, and
  // the members synced first (SyncAll's order).
  std::vector<std::string> SyncEnsemble(const ModelEntry& model, const ModelConfig& config);
  // The cycle `model` is on through ensemble members ("a -> b -> a"), from the configs read;
  // nullopt when none. REQUIRES: update_mu_ held.
  std::optional<std::string> EnsembleCycle(const std::string& model) const;
  // SyncModel for every model of `models`: plain models first, then ensembles, members before
  // the ensembles that use them. REQUIRES: update_mu_ held.
  void SyncAll(const std::vector<const ModelEntry*>& models);
  absl::StatusOr<std::shared_ptr<ServedVersion>> LoadVersion(const ModelEntry& model,
                                                             const VersionEntry& entry,
                                                             const ModelConfig& config);
  // NotFound naming the models there are.
  absl::Status UnknownModel(const std::string& model) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Cancelled() const;

  ModelBackend* const backend_;
  const Clock* const clock_;
  const int cpus_;
  const std::string repository_dir_;

  // Held by whoever changes which versions load (startup, watcher, load/unload endpoints),
  // for the whole load: they take turns. Never held by lookups, which take only mu_.
  std::mutex update_mu_;
  std::map<std::string, ConfigCache> configs_ ABSL_GUARDED_BY(update_mu_);
  int automatic_threads_ ABSL_GUARDED_BY(update_mu_) = 1;

  mutable std::mutex mu_;
  std::map<std::string, ModelState> models_ ABSL_GUARDED_BY(mu_);
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::serve
