#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/clock.h"
#include "serve/repository/version_settle_filter.h"

namespace shoal::serve {

class ModelManager;

struct RepositoryWatcherOptions {
  std::string repository_dir;
  std::chrono::milliseconds poll_interval{1000};  // between the end of a pass and the next scan
  std::chrono::milliseconds settle_time{2000};    // VersionSettleFilter
  bool use_inotify = true;  // false: polling only (tests of the poll)
};

// Rescans the model repository on a thread of its own and hands the settled versions to
// ModelManager::ApplyScan, which loads and switches in the background of the requests being
// served. It rescans every poll interval, and at once when inotify reports an entry created,
// renamed or removed in the repository or a model directory: a version renamed in with
// kVersionCompleteMarker is then loaded without waiting for the poll (publication to first
// answer well under a second), while the poll still covers file systems without inotify
// (NFS) and versions waiting for their settle time. A repository that cannot be read is
// logged (once per new error) and scanned again at the next poll.
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
  // Waits up to the poll interval (not at all when `at_once`) for a stop, or for a change
  // inotify reports; false: stop.
  bool WaitForChange(bool at_once);
  // Watches the repository and each model directory of `scan` (gone ones dropped); true when
  // a directory was newly watched. No-op without inotify.
  bool WatchDirectories(const RepositoryScan& scan);

  const RepositoryWatcherOptions options_;
  ModelManager* const models_;
  VersionSettleFilter filter_;  // only Run's thread uses it after construction
  const int stop_fd_;           // an eventfd the destructor signals
  int inotify_fd_ = -1;         // -1: polling only
  std::map<std::string, int> watched_;  // directory -> watch descriptor; Run's thread only
  std::thread thread_;  // last: starts after everything it uses
};

}  // namespace shoal::serve
