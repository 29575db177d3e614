#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serve/repository/canary_rollout.h"
#include "serve/repository/model_config.h"
#include "serve/repository/model_repository.h"
#include "serve/repository/served_version.h"

namespace shoal::serve {

class ModelBackend;

// A canary decision, or a pin or rollback by request, as metadata and the log show it.
struct RolloutEvent {
  int64_t version = 0;
  std::string decision;  // promoted, rolled_back, pinned, unpinned, superseded
  std::string reason;
  int64_t unix_ms = 0;
};

// A model's rollout as its metadata shows it (docs/serving.md, "Canary rollout and rollback").
struct RolloutView {
  bool has_policy = false;  // its config has rollout.canary
  int64_t serving = 0;      // the version unversioned requests go to (0: none)
  std::optional<int64_t> canary;
  double canary_share = 0;
  bool mirror = false;
  std::optional<CanarySnapshot> canary_figures;
  std::optional<int64_t> pinned;
  std::map<int64_t, std::string> rolled_back;  // version -> why
  std::optional<RolloutEvent> last;
};

// What a model's metadata and statistics endpoints show.
struct ModelView {
  std::string name;
  std::vector<std::shared_ptr<ServedVersion>> versions;  // ready versions (canary too), ascending
  // Set for a model with a rollout policy, a pin, a rolled-back version or a past decision.
  std::optional<RolloutView> rollout;
};

// How an unversioned inference request of a model runs: on `version`, or, while the model has
// a canary, through `rollout`, which picks the version. Versioned requests never go through a
// rollout.
struct InferenceRoute {
  std::shared_ptr<ServedVersion> version;
  std::shared_ptr<CanaryRollout> rollout;
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
  // Models with a rollout (ModelView::rollout): serving, canary or rolled_back, and for the
  // version of the model's last decision, that decision and why.
  std::string rollout_state;
  std::string decision;
  std::string decision_reason;
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
      : backend_(backend), clock_(clock), cpus_(cpus),
        compute_slots_(std::make_shared<ComputeSlots>(cpus)),
        repository_dir_(std::move(repository_dir)) {}
  // Stops the rollout thread; rollouts still holding copies in flight are waited for.
  ~ModelManager();

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
  // POST /v2/repository/models/{m}/pin {"version": N}: N serves every unversioned request at
  // once (loaded first if need be; a canary is ended) and newer versions are ignored until
  // Unpin. A rolled-back N is forgiven. Remembered across restarts (the model's rollout state
  // file). NotFound for an unknown model or a version not on disk; InvalidArgument when N
  // fails to load; FailedPrecondition for an ensemble, version_policy all or an unloaded
  // model. Nothing changes on an error.
  absl::Status Pin(const std::string& model, int64_t version);
  // POST /v2/repository/models/{m}/unpin: the newest version serves again (through a canary
  // when the config has one). NotFound for an unknown model; FailedPrecondition when not pinned.
  absl::Status Unpin(const std::string& model);
  // POST /v2/repository/models/{m}/rollback: a canary running is rolled back; otherwise the
  // serving version is, and the highest earlier version on disk that loads serves instead.
  // The version rolled back is not loaded again (across restarts too) until pinned.
  // NotFound for an unknown model; FailedPrecondition when there is no earlier version that
  // loads (nothing changes) or the version_policy is all.
  absl::Status RollBack(const std::string& model);
  // Promotes or rolls back every canary whose figures decide it (DecideCanary), and frees the
  // rollouts ended. The rollout thread calls it every 50 ms while a canary runs; tests call it
  // after moving their clock.
  void DecideCanaries();
  // The canary figures of every model with a rollout, by name (GET /metrics).
  std::vector<RolloutMetrics> RolloutMetricsNow() const;

  // The route of an inference request: FindVersion's version, or the model's canary rollout
  // for an unversioned request while it has one.
  absl::StatusOr<InferenceRoute> RouteInference(
      const std::string& model, const std::optional<std::string>& version_text) const;

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
    // Rollout (canary_rollout.h). `canary` is set while a canary runs beside versions.
    std::shared_ptr<CanaryRollout> canary;
    std::optional<CanaryConfig> canary_config;  // the config's rollout.canary, as last read
    std::optional<int64_t> pinned;                // as persisted
    std::map<int64_t, std::string> rolled_back;   // as persisted: version -> why
    std::optional<RolloutEvent> last_event;
    uint64_t promoted = 0, rolled_back_count = 0;  // decisions so far
    // Routed by the rollouts that ended, so that the counters only grow.
    uint64_t routed_current = 0, routed_canary = 0, fallbacks = 0;
  };
  // What DIR/<model>/.shoal-serve-rollout.json holds: the decisions that outlive the process.
  struct PersistedRollout {
    std::optional<int64_t> pinned;
    std::map<int64_t, std::string> rolled_back;
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

  // The model's persisted rollout state; empty when there is none (or it is unreadable, which
  // is logged once per change).
  PersistedRollout ReadRollout(const std::string& model_dir);
  // Writes it atomically; a failure is logged (the decision then holds until a restart).
  void WriteRollout(const std::string& model_dir, const std::string& model,
                    const PersistedRollout& rollout);
  std::string ModelDir(const std::string& model) const;
  // Retires `rollout` (freed by the rollout thread once no copy of it is pending).
  // REQUIRES: mu_ held.
  void RetireLocked(ModelState& state, std::shared_ptr<CanaryRollout> rollout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Promotes or rolls back `rollout`'s canary, if it is still `model`'s. REQUIRES: update_mu_.
  void ApplyDecision(const std::string& model, const std::shared_ptr<CanaryRollout>& rollout,
                     const CanaryDecision& decision, const std::string& by);
  // The rollout thread: decides the canaries, frees retired rollouts.
  void RolloutLoop();
  void StartRolloutThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current scan entry of `model`, rescanned; NotFound when not on disk.
  absl::StatusOr<ModelEntry> ScanModel(const std::string& model) const;

  ModelBackend* const backend_;
  const Clock* const clock_;
  const int cpus_;
  // Every version's instances take turns on the cpus_ CPUs (compute_slots.h).
  const std::shared_ptr<ComputeSlots> compute_slots_;
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
  std::vector<std::shared_ptr<CanaryRollout>> retired_ ABSL_GUARDED_BY(mu_);
  bool rollout_stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::condition_variable rollout_wake_;
  std::map<std::string, std::string> rollout_read_errors_ ABSL_GUARDED_BY(update_mu_);
  std::thread rollout_thread_;  // started with the first canary
};

}  // namespace shoal::serve
