#include "serve/scheduling/model_scheduler.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace shoal::serve {
namespace {

struct ThreadDeferral {
  std::function<void()> schedule_flush;
  std::vector<std::shared_ptr<DeferredWakes::Signal>> owed;
};
thread_local std::unique_ptr<ThreadDeferral> this_thread_deferral;

}  // namespace

void DeferredWakes::Install(std::function<void()> schedule_flush) {
  this_thread_deferral = std::make_unique<ThreadDeferral>();
  this_thread_deferral->schedule_flush = std::move(schedule_flush);
}

void DeferredWakes::Uninstall() {
  Flush();
  this_thread_deferral.reset();
}

bool DeferredWakes::Defer(const std::shared_ptr<Signal>& signal) {
  ThreadDeferral* deferral = this_thread_deferral.get();
  if (deferral == nullptr) return false;
  bool first = deferral->owed.empty();
  if (std::find(deferral->owed.begin(), deferral->owed.end(), signal) == deferral->owed.end()) {
    deferral->owed.push_back(signal);
  }
  if (first) deferral->schedule_flush();
  return true;
}

void DeferredWakes::Flush() {
  ThreadDeferral* deferral = this_thread_deferral.get();
  if (deferral == nullptr) return;
  std::vector<std::shared_ptr<Signal>> owed;
  owed.swap(deferral->owed);
  for (const auto& signal : owed) signal->work.notify_one();
}

absl::StatusOr<std::unique_ptr<ModelScheduler>> ModelScheduler::Start(
    SchedulerOptions options, std::vector<std::unique_ptr<ModelRunner>> runners,
    const Clock* clock, InferenceStats* stats) {
  if (runners.empty()) return absl::InvalidArgumentError("a model needs at least one instance");
  int slots_per_batch = options.slots ? options.slots->SlotsFor(options.threads_per_instance) : 0;
  std::unique_ptr<ModelScheduler> scheduler(
      new ModelScheduler(options.policy, clock, stats, options.slots, slots_per_batch));
  scheduler->runners_ = std::move(runners);
  // The warmup requests live on this stack until every instance reported back.
  const std::vector<std::vector<Tensor>>* warmup = &options.warmup;
  for (size_t i = 0; i < scheduler->runners_.size(); ++i) {
    ModelRunner* runner = scheduler->runners_[i].get();
    scheduler->threads_.emplace_back(
        [s = scheduler.get(), i, runner, warmup] { s->InstanceLoop(i, runner, warmup); });
  }
  absl::Status error;
  {
    std::unique_lock<std::mutex> lock(scheduler->mu_);
    scheduler->warmup_done_.wait(lock, [&] {
      return scheduler->warm_instances_ == scheduler->runners_.size() ||
             !scheduler->warmup_error_.ok();
    });
    error = scheduler->warmup_error_;
  }
  if (!error.ok()) return error;  // the destructor stops and joins the instances
  return scheduler;
}

ModelScheduler::~ModelScheduler() {
  std::vector<std::unique_ptr<PendingInference>> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    abandoned = queue_.TakeAll();
  }
  wake_->work.notify_all();
  for (std::thread& thread : threads_) thread.join();
  for (auto& request : abandoned) {
    request->done(absl::UnavailableError("the server is shutting down"));
  }
}

void ModelScheduler::Submit(std::vector<Tensor> inputs, int64_t rows, InferenceDone done) {
  auto request = std::make_unique<PendingInference>();
  request->inputs = std::move(inputs);
  request->rows = rows;
  request->done = std::move(done);
  request->home = CompletionHome::Current();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      // Not possible while the owner keeps the scheduler alive for its callers; kept total.
      request->done(absl::UnavailableError("the server is shutting down"));
      return;
    }
    queue_.Push(std::move(request));
    // While an instance of this model runs and no CPU is free, waking another would only see
    // that: the running one takes the request when its batch is done.
    if (!CanStartAnotherLocked()) return;
  }
  if (!DeferredWakes::Defer(wake_)) wake_->work.notify_one();
}

void ModelScheduler::InstanceLoop(size_t index, ModelRunner* runner,
                                  const std::vector<std::vector<Tensor>>* warmup) {
  runner->PrepareThread();
  absl::Status warm;
  for (const std::vector<Tensor>& request : *warmup) {
    absl::StatusOr<std::vector<Tensor>> outputs = runner->Run(request);
    if (!outputs.ok()) {
      warm = absl::Status(outputs.status().code(),
                          absl::StrCat("warmup on instance ", index, ": ",
                                       outputs.status().message()));
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (warm.ok()) {
      ++warm_instances_;
    } else if (warmup_error_.ok()) {
      warmup_error_ = warm;
    }
  }
  warmup_done_.notify_all();
  warmup = nullptr;  // Start() returns (and frees it) once every instance got here

  std::unique_lock<std::mutex> lock(mu_);
  bool holding_slots = false;  // this instance holds its compute slots (slots_ only)
  bool ran_on_slots = false;   // ...and has run a batch on them since it took them
  while (!stopping_) {
    BatchQueue::Take take = queue_.TakeDue();
    if (take.batch.empty()) {
      if (holding_slots) {
        slots_->Release(slots_per_batch_);
        holding_slots = false;
        ran_on_slots = false;
      }
      if (take.due_at) {
        // The clock may be a test's: sleep for what it says is left, in real time, then look
        // again; a new request wakes the thread earlier.
        Clock::Duration left = *take.due_at - clock_->Now();
        wake_->work.wait_for(lock, std::max(left, Clock::Duration(std::chrono::microseconds(1))));
      } else {
        wake_->work.wait(lock);
      }
      continue;
    }
    if (slots_) {
      // An instance that ran the last batch keeps its CPU for the next one (its module's
      // weights are still in the caches), unless another model waits for a CPU. One that has
      // just been given the CPU runs its batch first, or two waiters would hand it back and
      // forth without running anything.
      if (holding_slots && ran_on_slots && slots_->HasWaiters()) {
        slots_->Release(slots_per_batch_);
        holding_slots = false;
        ran_on_slots = false;
      }
      if (!holding_slots && !slots_->TryAcquire(slots_per_batch_)) {
        // Every CPU is taken: the batch goes back to the queue, where it keeps growing. When
        // an instance of this model holds one, it takes the batch once its own is done;
        // otherwise wait for a CPU, then look again.
        queue_.ReturnToFront(std::move(take.batch));
        take.batch.clear();
        if (running_ > 0) {
          wake_->work.wait(lock);
          continue;
        }
        lock.unlock();
        slots_->Acquire(slots_per_batch_);
        lock.lock();
      }
      holding_slots = true;
      if (take.batch.empty()) continue;  // given back above: take it again, grown
    }
    ++running_;
    // Others may be able to take the next batch while this one runs.
    if (queue_.size() > 0 && CanStartAnotherLocked()) wake_->work.notify_one();
    lock.unlock();
    Execute(runner, std::move(take.batch));
    lock.lock();
    --running_;
    ran_on_slots = holding_slots;
  }
  if (holding_slots) slots_->Release(slots_per_batch_);
}

bool ModelScheduler::CanStartAnotherLocked() const {
  return !slots_ || running_ == 0 || slots_->Available() >= slots_per_batch_;
}

void ModelScheduler::Execute(ModelRunner* runner,
                             std::vector<std::unique_ptr<PendingInference>> batch) {
  Clock::TimePoint start = clock_->Now();
  int64_t total_rows = 0;
  for (const auto& request : batch) {
    total_rows += request->rows;
    stats_->queue_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(start - request->enqueued).count());
  }
  auto result = std::make_shared<BatchOutputs>();
  result->total_rows = total_rows;
  result->whole = batch.size() == 1;
  result->outputs = result->whole ? runner->Run(std::move(batch.front()->inputs))
                                  : runner->Run(ConcatenateRows(batch));
  Clock::TimePoint end = clock_->Now();
  stats_->compute_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
  stats_->execution_count += 1;
  stats_->inference_count += static_cast<uint64_t>(total_rows);
  stats_->last_inference_ms = clock_->UnixMillis();
  int64_t first_row = 0;
  for (auto& request : batch) {
    request->result = result;
    request->first_row = first_row;
    first_row += request->rows;
  }
  result.reset();
  Complete(std::move(batch));
}

void ModelScheduler::Complete(std::vector<std::unique_ptr<PendingInference>> batch) {
  // A batch's requests usually share one home (one event loop); each home gets its requests in
  // one delivery, in batch order.
  std::vector<std::unique_ptr<PendingInference>> same_home;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i]) continue;
    CompletionHome* home = batch[i]->home.get();
    if (home != nullptr) {
      for (size_t j = i; j < batch.size(); ++j) {
        if (batch[j] && batch[j]->home.get() == home) same_home.push_back(std::move(batch[j]));
      }
      if (home->Deliver(same_home)) continue;
      // The home has closed: complete them here.
      for (auto& request : same_home) Finish(std::move(request));
      same_home.clear();
      continue;
    }
    Finish(std::move(batch[i]));
  }
}

}  // namespace shoal::serve
