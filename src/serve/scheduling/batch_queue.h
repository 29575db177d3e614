#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serve/core/tensor.h"

namespace shoal::serve {

// Called exactly once with a request's outputs or why it failed.
using InferenceDone = std::function<void(absl::StatusOr<std::vector<Tensor>>)>;

class CompletionHome;

// What one model call returned, shared by the requests of its batch until each has taken its
// rows (SliceRows) on the thread that completes it.
struct BatchOutputs {
  absl::StatusOr<std::vector<Tensor>> outputs;
  int64_t total_rows = 0;
  // A batch of one request: its outputs are the model's, whole (an unbatched model's first
  // dimension need not be a batch dimension).
  bool whole = false;
};

// A request waiting for a model instance.
struct PendingInference {
  std::vector<Tensor> inputs;  // in the model's argument order, already validated
  int64_t rows = 1;            // its batch dimension (inputs' dim 0) when batching
  Clock::TimePoint enqueued{};
  InferenceDone done;
  // The thread `done` runs on once the request has run (completion_home.h); null: the
  // instance thread that ran it.
  std::shared_ptr<CompletionHome> home;
  // Set when the request has run: its batch's outputs, and where its rows start in them.
  std::shared_ptr<BatchOutputs> result;
  int64_t first_row = 0;
};

struct BatchPolicy {
  // 0: every request runs alone. N >= 1: requests are combined on dimension 0 up to N rows.
  int64_t max_batch_size = 0;
  // How long the oldest request may wait for the batch to fill.
  Clock::Duration max_delay{0};
};

// The dynamic batcher's decisions, without threads: which queued requests run together, and
// when. A batch is a run of requests from the head of the queue (first come, first served)
// whose inputs agree on names, datatypes and every dimension but the first, with at most
// max_batch_size rows in all. It is due when it is full, when the next request cannot join it,
// or when its oldest request has waited max_delay. Not thread-safe: the owner locks.
class BatchQueue {
 public:
  // `clock` must outlive the queue.
  BatchQueue(BatchPolicy policy, const Clock* clock) : policy_(policy), clock_(clock) {}

  // Queues `request`, stamping its enqueue time with the clock's now.
  void Push(std::unique_ptr<PendingInference> request);

  struct Take {
    // The requests to run together, oldest first; empty when none is due.
    std::vector<std::unique_ptr<PendingInference>> batch;
    // When `batch` is empty and requests wait: when the head's batch becomes due.
    std::optional<Clock::TimePoint> due_at;
  };
  // Removes and returns the batch that is due now, if any.
  Take TakeDue();

  // Puts a batch TakeDue returned back at the head of the queue, as it was (an instance that
  // found no free CPU gives it back; it takes the batch again, grown, once it has one).
  void ReturnToFront(std::vector<std::unique_ptr<PendingInference>> batch);

  // Removes every queued request (at shutdown, to fail them).
  std::vector<std::unique_ptr<PendingInference>> TakeAll();

  size_t size() const { return queue_.size(); }
  const BatchPolicy& policy() const { return policy_; }

  // Whether two requests' inputs can be concatenated on dimension 0.
  static bool CanBatchTogether(const PendingInference& a, const PendingInference& b);

 private:
  const BatchPolicy policy_;
  const Clock* const clock_;
  std::deque<std::unique_ptr<PendingInference>> queue_;
};

// The inputs of a batch, each input concatenated on dimension 0 in request order. REQUIRES:
// the requests can batch together (BatchQueue::CanBatchTogether), every input has rank >= 1.
std::vector<Tensor> ConcatenateRows(const std::vector<std::unique_ptr<PendingInference>>& batch);

// One request's part of a batch's outputs: `count` rows from `first`, of `total_rows`.
// InternalError when an output is a scalar or its dimension 0 is not the batch's total rows
// (a model that does not keep the batch dimension cannot be batched).
absl::StatusOr<std::vector<Tensor>> SliceRows(const std::vector<Tensor>& outputs,
                                              int64_t total_rows, int64_t first, int64_t count);

// The outputs `request` (which has run) answers with: its rows of its batch's, or the batch's
// error. Moves them out when the request holds the batch's outputs alone.
absl::StatusOr<std::vector<Tensor>> TakeOutputs(PendingInference& request);

// Runs the `done` of a request that has run with its outputs (TakeOutputs), then frees it, on
// the calling thread.
void Finish(std::unique_ptr<PendingInference> request);

}  // namespace shoal::serve
