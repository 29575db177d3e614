#include "serve/repository/repository_watcher.h"

#include <iostream>

#include "serve/repository/model_manager.h"

namespace shoal::serve {

RepositoryWatcher::RepositoryWatcher(const RepositoryWatcherOptions& options, ModelManager* models,
                                     const Clock* clock, const RepositoryScan& startup_scan)
    : options_(options), models_(models), filter_(clock, options.settle_time) {
  filter_.AcceptAll(startup_scan);
  thread_ = std::thread([this] { Run(); });
}

RepositoryWatcher::~RepositoryWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void RepositoryWatcher::Run() {
  std::string last_error;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, options_.poll_interval, [this] { return stopping_; });
      if (stopping_) return;
    }
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
    models_->ApplyScan(filter_.Settled(*scan));
  }
}

}  // namespace shoal::serve
