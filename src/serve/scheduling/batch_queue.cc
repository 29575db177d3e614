#include "serve/scheduling/batch_queue.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shoal::serve {

void BatchQueue::Push(std::unique_ptr<PendingInference> request) {
  request->enqueued = clock_->Now();
  queue_.push_back(std::move(request));
}

bool BatchQueue::CanBatchTogether(const PendingInference& a, const PendingInference& b) {
  if (a.inputs.size() != b.inputs.size()) return false;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const Tensor& x = a.inputs[i];
    const Tensor& y = b.inputs[i];
    if (x.name != y.name || x.datatype != y.datatype || x.shape.size() != y.shape.size() ||
        x.shape.empty()) {
      return false;
    }
    if (!std::equal(x.shape.begin() + 1, x.shape.end(), y.shape.begin() + 1)) return false;
  }
  return true;
}

BatchQueue::Take BatchQueue::TakeDue() {
  Take take;
  if (queue_.empty()) return take;
  size_t count = 1;
  if (policy_.max_batch_size > 0) {
    const PendingInference& head = *queue_.front();
    int64_t rows = head.rows;
    bool blocked = false;  // the next request cannot join: waiting would not grow the batch
    for (; count < queue_.size(); ++count) {
      const PendingInference& next = *queue_[count];
      if (rows + next.rows > policy_.max_batch_size || !CanBatchTogether(head, next)) {
        blocked = true;
        break;
      }
      rows += next.rows;
    }
    Clock::TimePoint due = head.enqueued + policy_.max_delay;
    if (rows < policy_.max_batch_size && !blocked && clock_->Now() < due) {
      take.due_at = due;
      return take;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    take.batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return take;
}

void BatchQueue::ReturnToFront(std::vector<std::unique_ptr<PendingInference>> batch) {
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(std::move(*it));
}

std::vector<std::unique_ptr<PendingInference>> BatchQueue::TakeAll() {
  std::vector<std::unique_ptr<PendingInference>> all;
  for (auto& request : queue_) all.push_back(std::move(request));
  queue_.clear();
  return all;
}

std::vector<Tensor> ConcatenateRows(const std::vector<std::unique_ptr<PendingInference>>& batch) {
  const std::vector<Tensor>& first = batch.front()->inputs;
  std::vector<Tensor> inputs(first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    Tensor& out = inputs[i];
    out.name = first[i].name;
    out.datatype = first[i].datatype;
    out.shape = first[i].shape;
    out.shape[0] = 0;
    size_t bytes = 0;
    for (const auto& request : batch) bytes += request->inputs[i].data.size();
    out.data.reserve(bytes);
    for (const auto& request : batch) {
      const Tensor& in = request->inputs[i];
      out.shape[0] += in.shape[0];
      out.data.insert(out.data.end(), in.data.begin(), in.data.end());
    }
  }
  return inputs;
}

namespace {

absl::Status CheckBatchDimension(const Tensor& output, int64_t total) {
  if (output.shape.empty() || output.shape[0] != total) {
    return absl::InternalError(absl::StrCat(
        "output '", output.name, "' has shape ", ShapeString(output.shape), " for a batch of ",
        total, " rows; a batching model must return the batch dimension first"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> SliceRows(const std::vector<Tensor>& outputs,
                                              int64_t total_rows, int64_t first, int64_t count) {
  std::vector<Tensor> slice(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& output = outputs[i];
    if (absl::Status batched = CheckBatchDimension(output, total_rows); !batched.ok()) {
      return batched;
    }
    size_t row_bytes =
        total_rows == 0 ? 0 : output.data.size() / static_cast<size_t>(total_rows);
    Tensor& part = slice[i];
    part.name = output.name;
    part.datatype = output.datatype;
    part.shape = output.shape;
    part.shape[0] = count;
    auto begin = output.data.begin() + static_cast<ptrdiff_t>(row_bytes * first);
    part.data.assign(begin, begin + static_cast<ptrdiff_t>(row_bytes * count));
  }
  return slice;
}

absl::StatusOr<std::vector<Tensor>> TakeOutputs(PendingInference& request) {
  std::shared_ptr<BatchOutputs> result = std::move(request.result);
  if (!result->outputs.ok()) return result->outputs.status();
  if (result->whole) {
    // A batch of one: the outputs are this request's alone, unless something else kept them.
    if (result.use_count() == 1) return std::move(result->outputs);
    return result->outputs;
  }
  return SliceRows(*result->outputs, result->total_rows, request.first_row, request.rows);
}

void Finish(std::unique_ptr<PendingInference> request) {
  request->done(TakeOutputs(*request));
}

}  // namespace shoal::serve
