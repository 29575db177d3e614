#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serve/model_repository.h"
#include "serve/served_version.h"

namespace shoal::serve {

class ModelBackend;

// What a model's metadata and readiness endpoints show.
struct ModelView {
  std::string name;
  bool ready = false;
  std::string not_ready_reason;  // when not ready: loading, or why it was refused
  std::vector<std::shared_ptr<ServedVersion>> versions;  // ready versions, ascending
};

// Every model of the repository and its loaded versions. Models load in the background
// (LoadRepository) while the server already answers; lookups are thread-safe and hand out
// shared versions that stay valid for as long as a request holds them.
class ModelManager {
 public:
  // `backend` and `clock` must outlive the manager. `cpus` is the CPU count intra-op threads
  // are budgeted from (the server's affinity mask).
  ModelManager(ModelBackend* backend, const Clock* clock, int cpus)
      : backend_(backend), clock_(clock), cpus_(cpus) {}

  // Parses every model's config, then loads and warms up every version, model by model.
  // A model whose config is invalid, or with no version that loads, is refused with the
  // reason (logged on stderr); the others serve. Stops early when Cancel() is called.
  // Returns once done; IsLoaded() turns true then.
  void LoadRepository(const RepositoryScan& scan);
  void Cancel();

  bool IsLoaded() const;

  // The version to run for `model` and `version_text` (the URL's, nullopt for the newest
  // ready version). NotFound says which part is unknown or why it is not available;
  // Unavailable while the model is still loading.
  absl::StatusOr<std::shared_ptr<ServedVersion>> FindVersion(
      const std::string& model, const std::optional<std::string>& version_text) const;

  // NotFound when the repository has no such model.
  absl::StatusOr<ModelView> FindModel(const std::string& model) const;

  // The threads_per_instance a model without that key gets: the CPUs divided among all
  // instances of every version of every model that leaves it out, after the CPUs the models
  // that set it claim (at least 1). Exposed for tests and the log.
  static int AutomaticThreads(int cpus, const std::vector<std::pair<ModelConfig, int>>& models);

 private:
  struct ModelState {
    bool loading = true;
    std::string refusal;  // non-empty: refused, with why
    std::map<int64_t, std::shared_ptr<ServedVersion>> versions;
    std::map<int64_t, std::string> failed_versions;  // version -> why
  };

  // NotFound naming the models there are.
  absl::Status UnknownModel(const std::string& model) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ModelBackend* const backend_;
  const Clock* const clock_;
  const int cpus_;

  mutable std::mutex mu_;
  std::map<std::string, ModelState> models_ ABSL_GUARDED_BY(mu_);
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::serve
