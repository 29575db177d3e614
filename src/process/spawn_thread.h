#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace shoal::process {

// One long-lived thread that runs every process start. Tasks carry PR_SET_PDEATHSIG, which the
// kernel ties to the *thread* that created them: started from a caller's short-lived thread, a
// task would be killed when that thread exits. Run() executes `work` on this thread and returns
// when it is done. Thread-safe; calls are served one at a time.
class SpawnThread {
 public:
  SpawnThread() : thread_([this] { Loop(); }) {}
  ~SpawnThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SpawnThread(const SpawnThread&) = delete;
  SpawnThread& operator=(const SpawnThread&) = delete;

  void Run(const std::function<void()>& work) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return work_ == nullptr; });
    work_ = &work;
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_; });
    work_ = nullptr;
    cv_.notify_all();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (work_ != nullptr && !done_); });
      if (stop_) return;
      const std::function<void()>* work = work_;
      lock.unlock();
      (*work)();
      lock.lock();
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* work_ = nullptr;
  bool done_ = true;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal::process
