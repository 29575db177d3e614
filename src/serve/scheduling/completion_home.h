#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "serve/scheduling/batch_queue.h"

namespace shoal::serve {

// Lets an event loop take back the requests it submitted once they have run: their `done`
// runs on the loop's thread, one drain per batch, instead of on the instance thread. Everything
// the loop allocated for a request (its inputs, its callbacks, its reply) is then freed on the
// thread that allocated it, where glibc's per-thread cache serves it again, and a batch's
// replies reach the loop through one queued handler, not one each. While a thread has a home
// installed, ModelScheduler::Submit on it sends the request's completion there.
class CompletionHome {
 public:
  // Makes the calling thread the home of the requests it submits from now on. `wake` is called
  // from an instance thread when a delivery finds the home empty; it must arrange for
  // DrainThisThread() to run on the installing thread soon (an Asio loop posts it).
  static void Install(std::function<void()> wake);
  // Completes what was delivered, then takes no more deliveries: requests that finish later
  // run their `done` on their instance thread, as without a home.
  static void Uninstall();
  // Runs `done` of every request delivered to the calling thread's home, in order.
  static void DrainThisThread();
  // The calling thread's home: null when it has none, or while a Suspend is alive on it.
  static std::shared_ptr<CompletionHome> Current();

  // While alive, requests submitted on this thread complete on their instance thread: for a
  // caller that blocks on the result, which its home could not deliver while it waits.
  class Suspend {
   public:
    Suspend();
    ~Suspend();
    Suspend(const Suspend&) = delete;
    Suspend& operator=(const Suspend&) = delete;
  };

  explicit CompletionHome(std::function<void()> wake) : wake_(std::move(wake)) {}

  // From an instance thread: queues requests that have run for the home's thread, and empties
  // `finished`. False, leaving `finished` as it was, when the home takes no more deliveries.
  bool Deliver(std::vector<std::unique_ptr<PendingInference>>& finished);

 private:
  void Drain();
  void Close();

  const std::function<void()> wake_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<PendingInference>> delivered_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // The home's thread only: the last drain's vector, kept for its capacity.
  std::vector<std::unique_ptr<PendingInference>> draining_;
};

}  // namespace shoal::serve
