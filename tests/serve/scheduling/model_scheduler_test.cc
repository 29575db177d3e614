#include "serve/scheduling/model_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace shoal::serve {
namespace {

using std::chrono::microseconds;

Tensor Rows(int64_t rows, float value) {
  Tensor x;
  x.name = "x";
  x.datatype = DataType::kFp32;
  x.shape = {rows, 1};
  std::vector<float> values(static_cast<size_t>(rows), value);
  x.data.resize(values.size() * sizeof(float));
  std::memcpy(x.data.data(), values.data(), x.data.size());
  return x;
}

float FirstFloat(const Tensor& t) {
  float v;
  std::memcpy(&v, t.data.data(), sizeof(v));
  return v;
}

// Shared by the fake instances of one test: what ran, and a gate that holds runs back.
struct Recorder {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<int64_t> batch_rows;  // dimension 0 of every Run's input
  int prepared = 0;
  int warmups_seen = 0;
  bool gate_open = true;
  int running = 0;
};

// Echoes its input as output "y" and appends the batch size as output "n" (one row per row).
class FakeRunner final : public ModelRunner {
 public:
  explicit FakeRunner(Recorder* recorder, absl::Status fail_with = absl::OkStatus())
      : recorder_(recorder), fail_with_(std::move(fail_with)) {}
  void PrepareThread() override {
    std::lock_guard<std::mutex> lock(recorder_->mu);
    ++recorder_->prepared;
  }
  absl::StatusOr<std::vector<Tensor>> Run(std::vector<Tensor> inputs) override {
    std::unique_lock<std::mutex> lock(recorder_->mu);
    ++recorder_->running;
    recorder_->changed.notify_all();
    recorder_->changed.wait(lock, [&] { return recorder_->gate_open; });
    --recorder_->running;
    recorder_->batch_rows.push_back(inputs[0].shape[0]);
    if (!fail_with_.ok()) return fail_with_;
    Tensor y = inputs[0];
    y.name = "y";
    Tensor n = Rows(inputs[0].shape[0], static_cast<float>(inputs[0].shape[0]));
    n.name = "n";
    return std::vector<Tensor>{std::move(y), std::move(n)};
  }

 private:
  Recorder* recorder_;
  absl::Status fail_with_;
};

std::vector<std::unique_ptr<ModelRunner>> Runners(Recorder* recorder, int n,
                                                  absl::Status fail = absl::OkStatus()) {
  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (int i = 0; i < n; ++i) runners.push_back(std::make_unique<FakeRunner>(recorder, fail));
  return runners;
}

// Submits one request and returns its future result.
std::future<absl::StatusOr<std::vector<Tensor>>> Submit(ModelScheduler& scheduler, int64_t rows,
                                                        float value) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<std::vector<Tensor>>>>();
  auto future = promise->get_future();
  scheduler.Submit({Rows(rows, value)}, rows,
                   [promise](absl::StatusOr<std::vector<Tensor>> r) { promise->set_value(std::move(r)); });
  return future;
}

TEST(ModelSchedulerTest, PreparesAndWarmsEveryInstanceBeforeStarting) {
  Recorder recorder;
  SchedulerOptions options;
  options.warmup = {{Rows(1, 0)}, {Rows(2, 0)}};
  InferenceStats stats;
  auto scheduler =
      ModelScheduler::Start(options, Runners(&recorder, 3), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.prepared, 3);
  EXPECT_EQ(recorder.batch_rows.size(), 6u);  // 2 warmup requests x 3 instances
}

TEST(ModelSchedulerTest, AFailingWarmupRefusesTheScheduler) {
  Recorder recorder;
  SchedulerOptions options;
  options.warmup = {{Rows(1, 0)}};
  InferenceStats stats;
  auto scheduler = ModelScheduler::Start(options,
                                         Runners(&recorder, 2, absl::InternalError("boom")),
                                         SystemClock::Get(), &stats);
  ASSERT_FALSE(scheduler.ok());
  EXPECT_EQ(scheduler.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(scheduler.status().message().find(": boom"), absl::string_view::npos);
  EXPECT_EQ(scheduler.status().message().substr(0, 19), "warmup on instance ");
}

TEST(ModelSchedulerTest, CombinesRequestsThatQueueWhileTheInstanceIsBusy) {
  Recorder recorder;
  InferenceStats stats;
  SchedulerOptions options;
  // A delay far longer than the test: only "full" or "cannot grow" may dispatch a batch.
  options.policy = {/*max_batch_size=*/4, std::chrono::hours(1)};
  auto scheduler =
      ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();

  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = false;
  }
  // Four single-row requests fill a batch at once: no waiting for the delay.
  std::vector<std::future<absl::StatusOr<std::vector<Tensor>>>> first;
  for (int i = 0; i < 4; ++i) first.push_back(Submit(**scheduler, 1, float(i)));
  {
    std::unique_lock<std::mutex> lock(recorder.mu);
    recorder.changed.wait(lock, [&] { return recorder.running == 1; });
  }
  // While that batch runs, four more queue up and fill the next one.
  std::vector<std::future<absl::StatusOr<std::vector<Tensor>>>> second;
  for (int i = 0; i < 4; ++i) second.push_back(Submit(**scheduler, 1, float(10 + i)));
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = true;
  }
  recorder.changed.notify_all();

  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::vector<Tensor>> result = first[i].get();
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->size(), 2u);
    EXPECT_EQ((*result)[0].shape, (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(FirstFloat((*result)[0]), float(i));  // its own row back
    EXPECT_EQ(FirstFloat((*result)[1]), 4.0f);      // run in a batch of 4
  }
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::vector<Tensor>> result = second[i].get();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(FirstFloat((*result)[0]), float(10 + i));
    EXPECT_EQ(FirstFloat((*result)[1]), 4.0f);
  }
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.batch_rows, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(stats.execution_count, 2u);
  EXPECT_EQ(stats.inference_count, 8u);
}

TEST(ModelSchedulerTest, DeferredWakesLetARoundOfRequestsRunAsOneBatch) {
  Recorder recorder;
  InferenceStats stats;
  SchedulerOptions options;
  options.policy = {/*max_batch_size=*/8, microseconds(0)};  // no waiting for a batch to fill
  auto scheduler =
      ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();

  int flushes_scheduled = 0;
  DeferredWakes::Install([&] { ++flushes_scheduled; });
  std::vector<std::future<absl::StatusOr<std::vector<Tensor>>>> round;
  for (int i = 0; i < 5; ++i) round.push_back(Submit(**scheduler, 1, float(i)));
  // One flush is owed for the round, however many requests it queued.
  EXPECT_EQ(flushes_scheduled, 1);
  DeferredWakes::Flush();
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::vector<Tensor>> result = round[i].get();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(FirstFloat((*result)[0]), float(i));
    EXPECT_EQ(FirstFloat((*result)[1]), 5.0f);  // all five in one batch
  }
  // The next round owes a flush of its own.
  auto next = Submit(**scheduler, 1, 9.0f);
  EXPECT_EQ(flushes_scheduled, 2);
  DeferredWakes::Uninstall();  // flushes what is owed
  ASSERT_TRUE(next.get().ok());
  // Without deferral, Submit wakes an instance itself.
  ASSERT_TRUE(Submit(**scheduler, 1, 10.0f).get().ok());
  EXPECT_EQ(flushes_scheduled, 2);
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.batch_rows, (std::vector<int64_t>{5, 1, 1}));
}

// A thread that runs what is posted to it, in order: an event loop's stand-in.
class TaskThread {
 public:
  TaskThread() : thread_([this] { Loop(); }) {}
  ~TaskThread() {
    Post(nullptr);
    thread_.join();
  }
  void Post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    changed_.notify_all();
  }
  // Runs `task` on the thread and waits for it.
  void Run(std::function<void()> task) {
    std::promise<void> ran;
    Post([&] {
      task();
      ran.set_value();
    });
    ran.get_future().wait();
  }
  std::thread::id id() const { return thread_.get_id(); }

 private:
  void Loop() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return !tasks_.empty(); });
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      if (!task) return;
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  std::thread thread_;
};

// Submits one request; its future gives the result and the thread its `done` ran on.
using Completion = std::pair<absl::StatusOr<std::vector<Tensor>>, std::thread::id>;
std::future<Completion> SubmitNoting(ModelScheduler& scheduler, float value) {
  auto promise = std::make_shared<std::promise<Completion>>();
  auto future = promise->get_future();
  scheduler.Submit({Rows(1, value)}, 1, [promise](absl::StatusOr<std::vector<Tensor>> r) {
    promise->set_value(Completion(std::move(r), std::this_thread::get_id()));
  });
  return future;
}

// Holds the fake instances' runs back (closed), or lets them go.
void SetGate(Recorder& recorder, bool open) {
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = open;
  }
  recorder.changed.notify_all();
}

// One instance, batches of up to 8 rows dispatched as soon as it is free, and a thread to be
// the requests' home.
class CompletionHomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerOptions options;
    options.policy = {/*max_batch_size=*/8, microseconds(0)};
    auto started = ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(),
                                         &stats);
    ASSERT_TRUE(started.ok()) << started.status();
    scheduler = *std::move(started);
  }

  Recorder recorder;
  InferenceStats stats;
  std::unique_ptr<ModelScheduler> scheduler;
  TaskThread loop;
};

TEST_F(CompletionHomeTest, RequestsCompleteOnTheirHomeThreadABatchAtATime) {
  std::atomic<int> wakes{0};
  loop.Run([&] {
    CompletionHome::Install([&] {
      ++wakes;
      loop.Post([] { CompletionHome::DrainThisThread(); });
    });
  });

  SetGate(recorder, /*open=*/false);
  std::vector<std::future<Completion>> results;
  loop.Run([&] { results.push_back(SubmitNoting(*scheduler, 0)); });
  {
    std::unique_lock<std::mutex> lock(recorder.mu);
    recorder.changed.wait(lock, [&] { return recorder.running == 1; });
  }
  // Three more queue while the first runs, and run as one batch after it.
  loop.Run([&] {
    for (int i = 1; i <= 3; ++i) results.push_back(SubmitNoting(*scheduler, float(i)));
  });
  SetGate(recorder, /*open=*/true);
  for (int i = 0; i < 4; ++i) {
    Completion done = results[i].get();
    ASSERT_TRUE(done.first.ok()) << done.first.status();
    EXPECT_EQ(FirstFloat(done.first->at(0)), float(i));  // its own row of its batch
    EXPECT_EQ(FirstFloat(done.first->at(1)), i == 0 ? 1.0f : 3.0f);
    EXPECT_EQ(done.second, loop.id()) << "request " << i << " completed off its home thread";
  }
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    EXPECT_EQ(recorder.batch_rows, (std::vector<int64_t>{1, 3}));
  }
  // One wake per delivery that found the home empty: at most one per batch.
  EXPECT_GE(wakes.load(), 1);
  EXPECT_LE(wakes.load(), 2);

  // A caller that blocks on its result suspends its home: the instance thread completes it.
  std::future<Completion> suspended;
  loop.Run([&] {
    CompletionHome::Suspend blocking;
    EXPECT_EQ(CompletionHome::Current(), nullptr);
    suspended = SubmitNoting(*scheduler, 7);
  });
  Completion done = suspended.get();
  ASSERT_TRUE(done.first.ok());
  EXPECT_NE(done.second, loop.id());
  loop.Run([&] { EXPECT_NE(CompletionHome::Current(), nullptr); });
  loop.Run([] { CompletionHome::Uninstall(); });
}

TEST_F(CompletionHomeTest, AHomeThatGoesCompletesWhatItWasGivenAndNothingAfter) {
  std::promise<void> delivered;
  // This home's thread never drains on its own: what was delivered waits for Uninstall.
  loop.Run([&] { CompletionHome::Install([&] { delivered.set_value(); }); });
  std::future<Completion> given;
  loop.Run([&] { given = SubmitNoting(*scheduler, 1); });
  ASSERT_EQ(delivered.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the request was not delivered to its home";
  EXPECT_EQ(given.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  loop.Run([] { CompletionHome::Uninstall(); });
  ASSERT_EQ(given.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(given.get().second, loop.id());

  // A request submitted before the home went, and run after: its instance thread completes it.
  loop.Run([&] { CompletionHome::Install([] {}); });
  SetGate(recorder, /*open=*/false);
  std::future<Completion> late;
  loop.Run([&] { late = SubmitNoting(*scheduler, 2); });
  loop.Run([] { CompletionHome::Uninstall(); });
  SetGate(recorder, /*open=*/true);
  Completion done = late.get();
  ASSERT_TRUE(done.first.ok());
  EXPECT_EQ(FirstFloat(done.first->at(0)), 2.0f);
  EXPECT_NE(done.second, loop.id());
}

TEST(ModelSchedulerTest, WithoutBatchingRunsEachRequestAlone) {
  Recorder recorder;
  InferenceStats stats;
  auto scheduler =
      ModelScheduler::Start(SchedulerOptions{}, Runners(&recorder, 1), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = false;
  }
  std::vector<std::future<absl::StatusOr<std::vector<Tensor>>>> results;
  for (int i = 0; i < 3; ++i) results.push_back(Submit(**scheduler, 2, float(i)));
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = true;
  }
  recorder.changed.notify_all();
  for (auto& f : results) {
    auto result = f.get();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(FirstFloat((*result)[1]), 2.0f);
  }
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.batch_rows, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(stats.execution_count, 3u);
}

TEST(ModelSchedulerTest, AModelErrorReachesEveryRequestOfTheBatch) {
  Recorder recorder;
  InferenceStats stats;
  SchedulerOptions options;
  options.policy = {/*max_batch_size=*/2, std::chrono::hours(1)};
  auto scheduler = ModelScheduler::Start(options,
                                         Runners(&recorder, 1, absl::InternalError("bad")),
                                         SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  auto a = Submit(**scheduler, 1, 0);
  auto b = Submit(**scheduler, 1, 1);
  EXPECT_EQ(a.get().status(), absl::InternalError("bad"));
  EXPECT_EQ(b.get().status(), absl::InternalError("bad"));
}

TEST(ModelSchedulerTest, ShutdownFailsTheRequestsStillQueued) {
  Recorder recorder;
  InferenceStats stats;
  SchedulerOptions options;
  options.policy = {/*max_batch_size=*/8, std::chrono::hours(1)};
  auto scheduler =
      ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  auto waiting = Submit(**scheduler, 1, 0);  // waits an hour for company
  scheduler->reset();
  absl::StatusOr<std::vector<Tensor>> result = waiting.get();
  EXPECT_EQ(result.status(), absl::UnavailableError("the server is shutting down"));
}

TEST(ModelSchedulerTest, TheDelayDispatchesAPartialBatch) {
  Recorder recorder;
  InferenceStats stats;
  SchedulerOptions options;
  options.policy = {/*max_batch_size=*/8, microseconds(2000)};
  auto scheduler =
      ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  auto result = Submit(**scheduler, 3, 0).get();  // 3 of 8 rows: only the delay sends it
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FirstFloat((*result)[1]), 3.0f);
  EXPECT_GE(stats.queue_ns.load(), 2'000'000u);
}

TEST(ModelSchedulerTest, InstancesBeyondTheCpusWaitForOneAndTheirBatchGrows) {
  Recorder recorder;
  InferenceStats stats;
  SchedulerOptions options;
  options.policy = {/*max_batch_size=*/8, microseconds(0)};
  options.slots = std::make_shared<ComputeSlots>(1);  // one CPU for two instances
  auto scheduler =
      ModelScheduler::Start(options, Runners(&recorder, 2), SystemClock::Get(), &stats);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = false;
  }
  std::vector<std::future<absl::StatusOr<std::vector<Tensor>>>> results;
  results.push_back(Submit(**scheduler, 1, 0));
  {
    std::unique_lock<std::mutex> lock(recorder.mu);
    recorder.changed.wait(lock, [&] { return recorder.running == 1; });
  }
  // The idle instance wakes for these but finds the only CPU taken: it must not run them
  // beside the first batch, and those that come while it waits join its batch.
  for (int i = 1; i <= 3; ++i) results.push_back(Submit(**scheduler, 1, float(i)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int i = 4; i <= 5; ++i) results.push_back(Submit(**scheduler, 1, float(i)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    EXPECT_EQ(recorder.running, 1);
    recorder.gate_open = true;
  }
  recorder.changed.notify_all();
  for (size_t i = 0; i < results.size(); ++i) {
    absl::StatusOr<std::vector<Tensor>> result = results[i].get();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(FirstFloat((*result)[0]), float(i));
  }
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.batch_rows, (std::vector<int64_t>{1, 5}));
}

TEST(ModelSchedulerTest, AnInstanceKeepingItsCpuLetsAnotherModelWaitingForOneGoFirst) {
  Recorder recorder;  // both models: x sends 1-row requests, y 2-row ones
  InferenceStats x_stats, y_stats;
  SchedulerOptions options;
  options.policy = {/*max_batch_size=*/8, microseconds(0)};
  options.slots = std::make_shared<ComputeSlots>(1);
  auto x = ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(), &x_stats);
  auto y = ModelScheduler::Start(options, Runners(&recorder, 1), SystemClock::Get(), &y_stats);
  ASSERT_TRUE(x.ok() && y.ok());
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = false;
  }
  auto x1 = Submit(**x, 1, 0);
  {
    std::unique_lock<std::mutex> lock(recorder.mu);
    recorder.changed.wait(lock, [&] { return recorder.running == 1; });
  }
  auto x2 = Submit(**x, 1, 1);  // x has more work when its batch is done...
  auto y1 = Submit(**y, 2, 2);  // ...but y has been waiting for the CPU
  // Until y's instance waits for the CPU (a fixed sleep was too short on a loaded machine).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!options.slots->HasWaiters() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool y_waited = options.slots->HasWaiters();
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    recorder.gate_open = true;
  }
  recorder.changed.notify_all();
  EXPECT_TRUE(y_waited) << "y's instance never waited for the CPU";
  ASSERT_TRUE(x1.get().ok());
  ASSERT_TRUE(x2.get().ok());
  ASSERT_TRUE(y1.get().ok());
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.batch_rows, (std::vector<int64_t>{1, 2, 1}));
}

TEST(ComputeSlotsTest, AnInstanceTakesItsThreadsWorthOfSlotsAtMostAll) {
  ComputeSlots slots(4);
  EXPECT_EQ(slots.SlotsFor(0), 1);
  EXPECT_EQ(slots.SlotsFor(2), 2);
  EXPECT_EQ(slots.SlotsFor(16), 4);
  EXPECT_TRUE(slots.TryAcquire(3));
  EXPECT_FALSE(slots.TryAcquire(2));
  std::thread waiter([&] { slots.Acquire(2); });
  slots.Release(3);
  waiter.join();
  EXPECT_TRUE(slots.TryAcquire(2));
  EXPECT_FALSE(slots.TryAcquire(1));
}

}  // namespace
}  // namespace shoal::serve
