#include "serve/repository/repository_watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

#include "serve/repository/model_manager.h"

namespace shoal::serve {
namespace {

// Entries appearing, disappearing or renamed, and a config.yaml rewritten in place; not
// every write inside a version being copied (the settle filter's poll handles those).
constexpr uint32_t kWatchedEvents = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM |
                                    IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

}  // namespace

RepositoryWatcher::RepositoryWatcher(const RepositoryWatcherOptions& options, ModelManager* models,
                                     const Clock* clock, const RepositoryScan& startup_scan)
    : options_(options),
      models_(models),
      filter_(clock, options.settle_time),
      stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (stop_fd_ < 0) {
    // Without it the watcher could never be stopped; only fd exhaustion at start gets here.
    std::cerr << "shoal serve: eventfd: " << std::strerror(errno) << std::endl;
    std::abort();
  }
  filter_.AcceptAll(startup_scan);
  if (options_.use_inotify) {
    inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ < 0) {
      std::cerr << "shoal serve: cannot watch the repository with inotify (" << std::strerror(errno)
                << "); polling it every " << options_.poll_interval.count() << " ms" << std::endl;
    } else {
      WatchDirectories(startup_scan);
    }
  }
  thread_ = std::thread([this] { Run(); });
}

RepositoryWatcher::~RepositoryWatcher() {
  uint64_t one = 1;
  ssize_t written = write(stop_fd_, &one, sizeof(one));
  (void)written;  // an eventfd write of 1 cannot fail short of overflow
  thread_.join();
  if (inotify_fd_ >= 0) close(inotify_fd_);
  close(stop_fd_);
}

bool RepositoryWatcher::WatchDirectories(const RepositoryScan& scan) {
  if (inotify_fd_ < 0) return false;
  bool added = false;
  std::set<std::string> wanted{options_.repository_dir};
  for (const ModelEntry& model : scan.models) wanted.insert(model.dir);
  for (auto it = watched_.begin(); it != watched_.end();) {
    if (wanted.count(it->first)) {
      ++it;
    } else {
      inotify_rm_watch(inotify_fd_, it->second);  // EINVAL when the directory went: fine
      it = watched_.erase(it);
    }
  }
  for (const std::string& dir : wanted) {
    if (watched_.count(dir)) continue;
    int wd = inotify_add_watch(inotify_fd_, dir.c_str(), kWatchedEvents);
    // A directory that cannot be watched (gone, or the watch limit reached) is still polled.
    if (wd >= 0) {
      watched_[dir] = wd;
      added = true;
    }
  }
  return added;
}

bool RepositoryWatcher::WaitForChange(bool at_once) {
  pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
  const nfds_t count = inotify_fd_ >= 0 ? 2 : 1;
  int timeout_ms = at_once ? 0 : static_cast<int>(options_.poll_interval.count());
  int ready;
  do {
    ready = poll(fds, count, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (fds[0].revents & POLLIN) return false;
  if (count == 2 && (fds[1].revents & POLLIN)) {
    // Events only say "look again": the scan finds out what changed. A watch the kernel
    // ended (its directory removed or moved away: IN_IGNORED) is forgotten, so that a
    // directory re-created under that name is watched again after the scan.
    alignas(inotify_event) char buffer[16 * 1024];
    ssize_t n;
    while ((n = read(inotify_fd_, buffer, sizeof(buffer))) > 0) {
      for (char* p = buffer; p < buffer + n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(p);
        if (event->mask & IN_IGNORED) {
          for (auto it = watched_.begin(); it != watched_.end(); ++it) {
            if (it->second == event->wd) {
              watched_.erase(it);
              break;
            }
          }
        }
        p += sizeof(inotify_event) + event->len;
      }
    }
  }
  return true;
}

void RepositoryWatcher::Run() {
  std::string last_error;
  bool rescan_at_once = false;
  while (WaitForChange(rescan_at_once)) {
    rescan_at_once = false;
    absl::StatusOr<RepositoryScan> scan = ScanModelRepository(options_.repository_dir);
    if (!scan.ok()) {
      std::string error(scan.status().message());
      if (error != last_error) {
        std::cerr << "shoal serve: watching the repository: " << error
                  << " (the models loaded keep serving; scanning again every "
                  << options_.poll_interval.count() << " ms)" << std::endl;
      }
      last_error = error;
      continue;
    }
    last_error.clear();
    // A version renamed into a model directory that appeared since the last scan, before
    // its watch was added, raised no event: look once more right away.
    rescan_at_once = WatchDirectories(*scan);
    models_->ApplyScan(filter_.Settled(*scan));
  }
}

}  // namespace shoal::serve
