#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/clock.h"
#include "serve/repository/version_settle_filter.h"

namespace shoal::serve {

class ModelManager;

struct RepositoryWatcherOptions {
  std::string repository_dir;
  std::chrono::milliseconds poll_interval{1000};  // between the end of a pass and the next scan
  std::chrono::milliseconds settle_time{2000};    // VersionSettleFilter
};

// Rescans the model repository every poll interval on a thread of its own and hands the
// settled versions to ModelManager::ApplyScan, which loads and switches in the background of
// the requests being served. A repository that cannot be read is logged (once per new error)
// and scanned again at the next poll.
class RepositoryWatcher {
 public:
  // `models` and `clock` must outlive the watcher. `startup_scan` is what the manager loaded
  // at start: those versions are not waited for again.
  RepositoryWatcher(const RepositoryWatcherOptions& options, ModelManager* models,
                    const Clock* clock, const RepositoryScan& startup_scan);
  // Stops; a load in progress finishes first (ModelManager::Cancel shortens it).
  ~RepositoryWatcher();

 private:
  void Run();

  const RepositoryWatcherOptions options_;
  ModelManager* const models_;
  VersionSettleFilter filter_;  // only Run's thread uses it after construction
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after everything it uses
};

}  // namespace shoal::serve
