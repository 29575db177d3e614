#include "serve/scheduling/batch_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

namespace shoal::serve {
namespace {

using std::chrono::microseconds;

// A request with one FP32 input "x" of shape [rows, width], whose values are `first`,
// first + 1, ...; `done` records into `*result` (when given).
std::unique_ptr<PendingInference> Request(int64_t rows, int64_t width = 2, float first = 0,
                                          absl::StatusOr<std::vector<Tensor>>* result = nullptr) {
  auto request = std::make_unique<PendingInference>();
  Tensor x;
  x.name = "x";
  x.datatype = DataType::kFp32;
  x.shape = {rows, width};
  std::vector<float> values(static_cast<size_t>(rows * width));
  for (size_t i = 0; i < values.size(); ++i) values[i] = first + static_cast<float>(i);
  x.data.resize(values.size() * sizeof(float));
  std::memcpy(x.data.data(), values.data(), x.data.size());
  request->inputs.push_back(std::move(x));
  request->rows = rows;
  request->done = [result](absl::StatusOr<std::vector<Tensor>> r) {
    if (result) *result = std::move(r);
  };
  return request;
}

std::vector<float> Floats(const Tensor& t) {
  std::vector<float> values(t.data.size() / sizeof(float));
  std::memcpy(values.data(), t.data.data(), t.data.size());
  return values;
}

// The width (dimension 1) of a batch of exactly one request; -1 for any other batch.
int64_t WidthOfLoneRequest(const BatchQueue::Take& take) {
  return take.batch.size() == 1 ? take.batch[0]->inputs[0].shape[1] : -1;
}

std::vector<int64_t> RowsOf(const std::vector<std::unique_ptr<PendingInference>>& batch) {
  std::vector<int64_t> rows;
  for (const auto& r : batch) rows.push_back(r->rows);
  return rows;
}

TEST(BatchQueueTest, WithoutBatchingEveryRequestIsDueAloneAtOnce) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/0, microseconds(1000)}, &clock);
  queue.Push(Request(1));
  queue.Push(Request(1));
  BatchQueue::Take take = queue.TakeDue();
  EXPECT_EQ(take.batch.size(), 1u);
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_EQ(queue.TakeDue().batch.size(), 1u);
  EXPECT_TRUE(queue.TakeDue().batch.empty());
  EXPECT_FALSE(queue.TakeDue().due_at.has_value());
}

TEST(BatchQueueTest, WaitsForTheDelayWhileTheBatchIsNotFull) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/4, microseconds(500)}, &clock);
  Clock::TimePoint start = clock.Now();
  queue.Push(Request(1));
  clock.Advance(microseconds(100));
  queue.Push(Request(2));

  BatchQueue::Take take = queue.TakeDue();
  EXPECT_TRUE(take.batch.empty());
  ASSERT_TRUE(take.due_at.has_value());
  EXPECT_EQ(*take.due_at, start + microseconds(500));  // the oldest request's deadline

  clock.Advance(microseconds(399));
  EXPECT_TRUE(queue.TakeDue().batch.empty());
  clock.Advance(microseconds(1));
  take = queue.TakeDue();
  EXPECT_EQ(RowsOf(take.batch), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(queue.size(), 0u);
}

TEST(BatchQueueTest, AFullBatchIsDueWithoutWaiting) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/4, microseconds(1'000'000)}, &clock);
  queue.Push(Request(1));
  queue.Push(Request(3));
  queue.Push(Request(1));
  BatchQueue::Take take = queue.TakeDue();
  EXPECT_EQ(RowsOf(take.batch), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(queue.size(), 1u);
}

TEST(BatchQueueTest, ABatchTheNextRequestCannotJoinIsDueAtOnce) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/4, microseconds(1'000'000)}, &clock);
  queue.Push(Request(3));
  queue.Push(Request(2));  // 5 rows would be over the limit
  EXPECT_EQ(RowsOf(queue.TakeDue().batch), (std::vector<int64_t>{3}));
  // The second now heads the queue and waits for company.
  EXPECT_TRUE(queue.TakeDue().batch.empty());
}

TEST(BatchQueueTest, RequestsOfDifferentShapesAreNotBatchedTogether) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/8, microseconds(1'000'000)}, &clock);
  queue.Push(Request(1, /*width=*/2));
  queue.Push(Request(1, /*width=*/3));
  queue.Push(Request(1, /*width=*/2));
  // First come, first served: a batch stops at the first request that cannot join it, and is
  // due at once, since waiting could not grow it.
  EXPECT_EQ(WidthOfLoneRequest(queue.TakeDue()), 2);
  EXPECT_EQ(WidthOfLoneRequest(queue.TakeDue()), 3);
  // The last one heads the queue alone and waits for company until the delay.
  EXPECT_TRUE(queue.TakeDue().batch.empty());
  clock.Advance(microseconds(1'000'000));
  EXPECT_EQ(WidthOfLoneRequest(queue.TakeDue()), 2);
}

TEST(BatchQueueTest, ZeroDelayTakesWhateverIsQueued) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/8, microseconds(0)}, &clock);
  queue.Push(Request(1));
  queue.Push(Request(2));
  EXPECT_EQ(RowsOf(queue.TakeDue().batch), (std::vector<int64_t>{1, 2}));
}

TEST(BatchQueueTest, TakeAllEmptiesTheQueue) {
  FakeClock clock;
  BatchQueue queue({/*max_batch_size=*/8, microseconds(100)}, &clock);
  queue.Push(Request(1));
  queue.Push(Request(1));
  EXPECT_EQ(queue.TakeAll().size(), 2u);
  EXPECT_EQ(queue.size(), 0u);
}

TEST(BatchQueueTest, ConcatenatesOnDimensionZeroAndSplitsBack) {
  std::vector<std::unique_ptr<PendingInference>> batch;
  batch.push_back(Request(1, 2, /*first=*/0));   // [[0, 1]]
  batch.push_back(Request(2, 2, /*first=*/10));  // [[10, 11], [12, 13]]
  std::vector<Tensor> inputs = ConcatenateRows(batch);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].name, "x");
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(Floats(inputs[0]), (std::vector<float>{0, 1, 10, 11, 12, 13}));

  auto first = SliceRows(inputs, 3, /*first=*/0, /*count=*/1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].name, "x");
  EXPECT_EQ((*first)[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Floats((*first)[0]), (std::vector<float>{0, 1}));
  auto second = SliceRows(inputs, 3, /*first=*/1, /*count=*/2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Floats((*second)[0]), (std::vector<float>{10, 11, 12, 13}));
}

TEST(BatchQueueTest, ARequestTakesItsRowsOrTheWholeOutputsOfABatchOfOne) {
  std::vector<std::unique_ptr<PendingInference>> batch;
  batch.push_back(Request(1, 2, /*first=*/0));
  batch.push_back(Request(2, 2, /*first=*/10));
  auto result = std::make_shared<BatchOutputs>();
  result->outputs = ConcatenateRows(batch);
  result->total_rows = 3;
  batch[0]->result = result;
  batch[1]->result = result;
  batch[1]->first_row = 1;
  result.reset();
  auto second = TakeOutputs(*batch[1]);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Floats((*second)[0]), (std::vector<float>{10, 11, 12, 13}));
  EXPECT_EQ(batch[1]->result, nullptr);  // let go of the batch's outputs
  auto first = TakeOutputs(*batch[0]);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Floats((*first)[0]), (std::vector<float>{0, 1}));

  // An unbatched model's output need not have the batch's rows first: a batch of one gets it
  // whole.
  Tensor scalar;
  scalar.name = "loss";
  scalar.data.resize(4);
  auto alone = std::make_shared<BatchOutputs>();
  alone->outputs = std::vector<Tensor>{scalar};
  alone->total_rows = 1;
  alone->whole = true;
  batch[0]->result = std::move(alone);
  auto whole = TakeOutputs(*batch[0]);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)[0].name, "loss");
  EXPECT_TRUE((*whole)[0].shape.empty());

  // The batch's error is every request's.
  auto failed = std::make_shared<BatchOutputs>();
  failed->outputs = absl::InternalError("the model threw");
  batch[1]->result = std::move(failed);
  EXPECT_EQ(TakeOutputs(*batch[1]).status().message(), "the model threw");
}

TEST(BatchQueueTest, SplittingRefusesOutputsWithoutTheBatchDimension) {
  Tensor scalar;
  scalar.name = "loss";
  scalar.shape = {};
  scalar.data.resize(4);
  auto split = SliceRows({scalar}, 3, /*first=*/1, /*count=*/2);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().message(),
            "output 'loss' has shape [] for a batch of 3 rows; a batching model must return the "
            "batch dimension first");
}

}  // namespace
}  // namespace shoal::serve
