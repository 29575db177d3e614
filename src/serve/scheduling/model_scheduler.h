#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serve/core/inference_stats.h"
#include "serve/core/tensor.h"
#include "serve/scheduling/batch_queue.h"
#include "serve/scheduling/completion_home.h"
#include "serve/scheduling/compute_slots.h"

namespace shoal::serve {

// One model instance as the scheduler drives it. Each runner is used by one thread only: the
// instance thread the scheduler starts for it.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Called once on the instance thread before anything else (it sizes the thread's intra-op
  // parallelism).
  virtual void PrepareThread() = 0;
  // Runs the model on `inputs` (the model's argument order) and returns its named outputs.
  virtual absl::StatusOr<std::vector<Tensor>> Run(std::vector<Tensor> inputs) = 0;
};

// Lets an event loop collect the requests it reads in one round into one batch. While a thread
// has deferred wakes installed, ModelScheduler::Submit on it queues the request without waking
// an instance and owes the wake instead; the first owed wake calls `schedule_flush`, which must
// arrange for Flush() to run on this thread once the round's other ready work is done (an Asio
// loop posts it). Without this, the first request of a round wakes an instance at once, which
// on a shared core preempts the loop and runs that request alone.
class DeferredWakes {
 public:
  struct Signal {
    std::condition_variable work;
  };

  // Installs deferral on the calling thread for the rest of its life (or until Uninstall).
  static void Install(std::function<void()> schedule_flush);
  static void Uninstall();
  // True when the calling thread defers: then `signal` is owed a wake.
  static bool Defer(const std::shared_ptr<Signal>& signal);
  // Wakes one instance of every scheduler owed a wake since the last Flush.
  static void Flush();
};

struct SchedulerOptions {
  BatchPolicy policy;
  // Requests (inputs in the model's argument order) that every instance runs, in order, before
  // the scheduler starts; their outputs are dropped, their errors refuse the scheduler.
  std::vector<std::vector<Tensor>> warmup;
  // The server's CPUs, shared with every other scheduler: each instance holds
  // `slots->SlotsFor(threads_per_instance)` of them while it runs a batch. Null: instances run
  // whenever they have work.
  std::shared_ptr<ComputeSlots> slots;
  int threads_per_instance = 1;
};

// Runs one model version's requests on its instances: one thread per ModelRunner, all taking
// batches from one BatchQueue. Requests for a busy model wait in the queue; a free instance
// takes the batch that is due (batch_queue.h) or sleeps until it is.
class ModelScheduler {
 public:
  // Starts the instance threads; each prepares itself and runs the warmup requests. Returns
  // once every instance is warm, or the first warmup error ("instance 2: ...") after stopping
  // them all. `clock` and `stats` must outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<ModelScheduler>> Start(
      SchedulerOptions options, std::vector<std::unique_ptr<ModelRunner>> runners,
      const Clock* clock, InferenceStats* stats);

  // Fails every queued request with Unavailable, lets running batches finish, joins.
  ~ModelScheduler();

  // Queues one request. REQUIRES: `inputs` are valid for the model and, when batching, have
  // `rows` (<= max_batch_size) as their dimension 0. `done` runs exactly once: on the calling
  // thread's CompletionHome when it has one, else on an instance thread (or on the
  // destructor's thread for requests still queued at shutdown), where it must not call back
  // into the scheduler.
  void Submit(std::vector<Tensor> inputs, int64_t rows, InferenceDone done);

  const BatchPolicy& policy() const { return queue_.policy(); }

 private:
  ModelScheduler(BatchPolicy policy, const Clock* clock, InferenceStats* stats,
                 std::shared_ptr<ComputeSlots> slots, int slots_per_batch)
      : clock_(clock), stats_(stats), slots_(std::move(slots)),
        slots_per_batch_(slots_per_batch), queue_(policy, clock) {}

  // The body of instance thread `index`.
  void InstanceLoop(size_t index, ModelRunner* runner, const std::vector<std::vector<Tensor>>* warmup);
  // Whether an instance woken now could start a batch: no instance runs, or a CPU is free.
  bool CanStartAnotherLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Execute(ModelRunner* runner, std::vector<std::unique_ptr<PendingInference>> batch);
  // Sends each request of a batch that has run to its home, and completes the rest here.
  static void Complete(std::vector<std::unique_ptr<PendingInference>> batch);

  const Clock* const clock_;
  InferenceStats* const stats_;
  const std::shared_ptr<ComputeSlots> slots_;
  const int slots_per_batch_;
  std::vector<std::unique_ptr<ModelRunner>> runners_;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  // Work queued, or stopping. Shared, so that a deferred wake (DeferredWakes) outliving the
  // scheduler signals nothing harmful.
  std::shared_ptr<DeferredWakes::Signal> wake_ = std::make_shared<DeferredWakes::Signal>();
  std::condition_variable warmup_done_;   // an instance finished its warmup
  BatchQueue queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  size_t warm_instances_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // instances running a batch
  absl::Status warmup_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::serve
