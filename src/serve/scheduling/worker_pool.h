#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace shoal::serve {

// A fixed set of threads running posted tasks in the order posted. The gRPC front end runs
// its ModelInfer calls here: they block while their model works, which gRPC's callback threads
// must not do, and calls beyond the pool's size wait in order instead of being refused.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  // Stop().
  ~WorkerPool();

  // Queues `task`. REQUIRES: Stop() has not been called.
  void Post(std::function<void()> task);

  // Runs every task already queued, then joins the threads. Idempotent.
  void Stop();

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace shoal::serve
