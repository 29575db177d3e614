#include "master/shard_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace shoal::master {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using Kind = LeaseResult::Kind;

const Clock::TimePoint kT0 = Clock::TimePoint{} + std::chrono::hours(1);

spec::DatasetConfig Ranges(uint64_t samples, uint64_t shard_size, uint32_t epochs = 1,
                           milliseconds lease_timeout = seconds(60)) {
  spec::DatasetConfig d;
  d.samples = samples;
  d.shard_size = shard_size;
  d.epochs = epochs;
  d.lease_timeout = lease_timeout;
  d.configured = true;
  return d;
}

spec::DatasetConfig Files(std::vector<std::string> files, uint32_t epochs = 1) {
  spec::DatasetConfig d;
  d.files = std::move(files);
  d.epochs = epochs;
  d.configured = true;
  return d;
}

// Leases and expects a shard; returns its id.
uint64_t LeaseShard(ShardTable& t, const std::string& task, uint32_t epoch, Clock::TimePoint now,
                    std::vector<Json>* journal = nullptr, uint32_t attempt = 0) {
  absl::StatusOr<LeaseResult> r = t.Lease(task, attempt, epoch, /*wait=*/true, now, journal);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, Kind::kShard);
  return r->shard.id;
}

Kind LeaseKind(ShardTable& t, const std::string& task, uint32_t epoch, bool wait,
               Clock::TimePoint now) {
  absl::StatusOr<LeaseResult> r = t.Lease(task, 0, epoch, wait, now, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  return r->kind;
}

// Two tables are the same when their summaries and every shard (but the made-up deadlines of
// replayed leases) agree.
void ExpectSameTable(const ShardTable& a, const ShardTable& b) {
  ASSERT_EQ(a.Snapshot(), b.Snapshot());
  for (uint32_t e = 0; e < a.num_epochs(); ++e) {
    for (uint64_t s = 0; s < a.num_shards(); ++s) {
      ShardView x = a.Inspect(e, s);
      ShardView y = b.Inspect(e, s);
      ASSERT_EQ(x.state, y.state) << "epoch " << e << " shard " << s;
      EXPECT_EQ(x.task, y.task);
      EXPECT_EQ(x.attempt, y.attempt);
      EXPECT_EQ(x.step, y.step);
      EXPECT_EQ(x.returned_reason, y.returned_reason);
    }
  }
}

TEST(ShardTableTest, IndexRangeShardsCoverTheSamples) {
  ShardTable t(Ranges(250, 100));
  EXPECT_EQ(t.num_shards(), 3u);
  std::vector<Json> journal;
  for (uint64_t want : {0, 1, 2}) {
    absl::StatusOr<LeaseResult> r = t.Lease("worker:0", 0, 0, true, kT0, &journal);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->kind, Kind::kShard);
    EXPECT_EQ(r->shard.id, want);
    EXPECT_EQ(r->shard.start, want * 100);
    EXPECT_EQ(r->shard.end, std::min<uint64_t>(250, want * 100 + 100));
  }
  EXPECT_EQ(journal[1], Json({{"type", "shard_leased"}, {"epoch", 0}, {"shard", 1},
                              {"task", "worker:0"}, {"attempt", 0}}));
  EXPECT_EQ(t.Inspect(0, 2).task, "worker:0");  // one task may hold several leases
}

TEST(ShardTableTest, FileShardsAndProtocolReplies) {
  ShardTable t(Files({"a.npz", "b.npz"}));
  absl::StatusOr<LeaseResult> r = t.Lease("worker:1", 0, 0, true, kT0, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ToReply(),
            Json({{"ok", true}, {"shard", {{"id", 0}, {"epoch", 0}, {"file", "a.npz"}}}}));
  ASSERT_EQ(LeaseShard(t, "worker:2", 0, kT0), 1u);
  r = t.Lease("worker:1", 0, 0, true, kT0, nullptr);
  ASSERT_EQ(r->kind, Kind::kRetry);
  EXPECT_GE(r->retry_after, ShardTable::kRetryMin);
  EXPECT_LE(r->retry_after, ShardTable::kRetryMax);
  EXPECT_EQ(r->ToReply(), Json({{"ok", true}, {"retry_ms", r->retry_after.count()}}));
  r = t.Lease("worker:1", 0, 0, false, kT0, nullptr);
  EXPECT_EQ(r->ToReply(), Json({{"ok", true}, {"exhausted", true}, {"epoch", 0}}));
}

TEST(ShardTableTest, ReturnedShardsAreLeasedAgainInAscendingOrder) {
  ShardTable t(Ranges(500, 100));
  for (int i = 0; i < 3; ++i) LeaseShard(t, "worker:" + std::to_string(i), 0, kT0);
  t.ReleaseTask("worker:2", "worker:2 failed", nullptr);
  t.ReleaseTask("worker:0", "worker:0 failed", nullptr);
  EXPECT_EQ(LeaseShard(t, "worker:3", 0, kT0), 0u);
  EXPECT_EQ(LeaseShard(t, "worker:3", 0, kT0), 2u);
  EXPECT_EQ(LeaseShard(t, "worker:3", 0, kT0), 3u);
  EXPECT_EQ(LeaseShard(t, "worker:3", 0, kT0), 4u);
}

TEST(ShardTableTest, NoWaitExhaustsWhileWaitRetriesUntilAllDone) {
  ShardTable t(Ranges(200, 100));
  LeaseShard(t, "worker:0", 0, kT0);
  LeaseShard(t, "worker:1", 0, kT0);
  EXPECT_EQ(LeaseKind(t, "worker:2", 0, /*wait=*/false, kT0), Kind::kExhausted);
  EXPECT_EQ(LeaseKind(t, "worker:2", 0, /*wait=*/true, kT0), Kind::kRetry);
  ASSERT_TRUE(t.Done("worker:0", 0, 0, 0, 5, kT0, nullptr).ok());
  EXPECT_EQ(LeaseKind(t, "worker:2", 0, true, kT0), Kind::kRetry);  // shard 1 may come back
  ASSERT_TRUE(t.Done("worker:1", 0, 0, 1, 6, kT0, nullptr).ok());
  EXPECT_EQ(LeaseKind(t, "worker:2", 0, true, kT0), Kind::kExhausted);
  EXPECT_EQ(LeaseKind(t, "worker:2", 0, false, kT0), Kind::kExhausted);
}

TEST(ShardTableTest, EpochsAreServedInOrder) {
  ShardTable t(Ranges(200, 100, /*epochs=*/2));
  EXPECT_EQ(t.current_epoch(), 0u);
  EXPECT_EQ(LeaseShard(t, "worker:0", 0, kT0), 0u);
  EXPECT_EQ(LeaseShard(t, "worker:1", 0, kT0), 1u);
  EXPECT_EQ(LeaseKind(t, "worker:0", 1, true, kT0), Kind::kRetry);
  EXPECT_EQ(LeaseKind(t, "worker:0", 1, false, kT0), Kind::kRetry);
  ASSERT_TRUE(t.Done("worker:0", 0, 0, 0, 1, kT0, nullptr).ok());
  EXPECT_EQ(LeaseKind(t, "worker:0", 1, false, kT0), Kind::kRetry);
  std::vector<Json> journal;
  ASSERT_TRUE(t.Done("worker:1", 0, 0, 1, 2, kT0, &journal).ok());
  ASSERT_EQ(journal.size(), 2u);
  EXPECT_EQ(journal[0], Json({{"type", "shard_done"}, {"epoch", 0}, {"shard", 1},
                              {"task", "worker:1"}, {"attempt", 0}, {"step", 2}}));
  EXPECT_EQ(journal[1], Json({{"type", "epoch_complete"}, {"epoch", 0}}));
  EXPECT_EQ(t.current_epoch(), 1u);
  EXPECT_EQ(LeaseKind(t, "worker:0", 0, true, kT0), Kind::kExhausted);
  EXPECT_EQ(LeaseShard(t, "worker:0", 1, kT0), 0u);
  absl::StatusOr<LeaseResult> beyond = t.Lease("worker:0", 0, 2, true, kT0, nullptr);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(beyond.status().message(), HasSubstr("epoch 2"));
}

TEST(ShardTableTest, WithoutDatasetLeasingFails) {
  ShardTable t{spec::DatasetConfig{}};
  EXPECT_EQ(t.Lease("worker:0", 0, 0, true, kT0, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardTableTest, DoneByNonHolderIsRefused) {
  ShardTable t(Ranges(300, 100));
  LeaseShard(t, "worker:2", 0, kT0);
  absl::Status s = t.Done("worker:1", 0, 0, 0, 3, kT0, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("shard 0 of epoch 0"));
  EXPECT_THAT(s.message(), HasSubstr("leased to worker:2 now"));
  s = t.Done("worker:1", 0, 0, 2, 3, kT0, nullptr);
  EXPECT_THAT(s.message(), HasSubstr("shard 2 of epoch 0 is not leased to worker:1"));
  EXPECT_EQ(t.Inspect(0, 0).state, ShardState::kLeased);
}

TEST(ShardTableTest, DoneByStaleAttemptIsRefused) {
  ShardTable t(Ranges(300, 100));
  LeaseShard(t, "worker:1", 0, kT0, nullptr, /*attempt=*/1);
  absl::Status s = t.Done("worker:1", 0, 0, 0, 3, kT0, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("leased to attempt 1 of worker:1 now"));
  EXPECT_TRUE(t.Done("worker:1", 1, 0, 0, 3, kT0, nullptr).ok());
}

TEST(ShardTableTest, DoneIsRecordedExactlyOnce) {
  ShardTable t(Ranges(300, 100));
  LeaseShard(t, "worker:1", 0, kT0);
  std::vector<Json> journal;
  ASSERT_TRUE(t.Done("worker:1", 0, 0, 0, 7, kT0, &journal).ok());
  absl::Status s = t.Done("worker:1", 0, 0, 0, 8, kT0, &journal);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("shard 0 of epoch 0 is already done (at step 7)"));
  EXPECT_EQ(t.Done("worker:2", 0, 0, 0, 7, kT0, &journal).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(journal.size(), 1u);
  EXPECT_EQ(t.Counts(0).done, 1u);
  EXPECT_EQ(t.Done("worker:1", 0, 0, 9, 7, kT0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Done("worker:1", 0, 3, 0, 7, kT0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// A master that journaled a Done and died before answering: the agent asks its replacement
// again, and the holder must hear that its shard is done, not that its lease was lost (it would
// then treat a shard the journal counts as done as not processed).
TEST(ShardTableTest, TheHoldersLastDoneAskedAgainSucceedsAndJournalsNothing) {
  std::vector<Json> journal;
  ShardTable t(Ranges(300, 100));
  LeaseShard(t, "worker:1", 0, kT0, &journal, /*attempt=*/2);
  ASSERT_TRUE(t.Done("worker:1", 2, 0, 0, 7, kT0, &journal).ok());
  absl::StatusOr<ShardTable> replayed = ShardTable::Replay(t.dataset(), journal, kT0);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(replayed->Done("worker:1", 2, 0, 0, 7, kT0 + seconds(1), &journal).ok());
  EXPECT_EQ(journal.size(), 2u);
  EXPECT_EQ(replayed->Counts(0).done, 1u);
  // Not for another attempt, nor once the task completed another shard.
  EXPECT_FALSE(replayed->Done("worker:1", 3, 0, 0, 7, kT0, nullptr).ok());
  LeaseShard(*replayed, "worker:1", 0, kT0, nullptr, 2);
  ASSERT_TRUE(replayed->Done("worker:1", 2, 0, 1, 9, kT0, nullptr).ok());
  EXPECT_FALSE(replayed->Done("worker:1", 2, 0, 0, 7, kT0, nullptr).ok());
}

// A master that leased a shard, journaled it and died before answering: the agent asks its
// replacement again with the same request id, and the task gets that shard, not a second one.
TEST(ShardTableTest, ALeaseAskedAgainGetsTheShardItsFirstAskingLeased) {
  std::vector<Json> journal;
  ShardTable t(Ranges(300, 100));
  auto lease = [](ShardTable& table, uint64_t request, Clock::TimePoint now,
                  std::vector<Json>* records) {
    absl::StatusOr<LeaseResult> r = table.Lease("worker:0", 1, 0, true, now, records, request);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kind, Kind::kShard);
    return r->shard.id;
  };
  ASSERT_EQ(lease(t, 41, kT0, &journal), 0u);
  ASSERT_EQ(journal.size(), 1u);
  EXPECT_EQ(journal[0]["request"], 41);
  absl::StatusOr<ShardTable> replayed = ShardTable::Replay(t.dataset(), journal, kT0);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(lease(*replayed, 41, kT0 + seconds(1), &journal), 0u);
  EXPECT_EQ(journal.size(), 1u) << "nothing new to journal";
  EXPECT_EQ(replayed->num_leases(), 1u);
  // Another call gets the next shard; so does the same call once its lease is lost.
  EXPECT_EQ(lease(*replayed, 42, kT0 + seconds(1), &journal), 1u);
  EXPECT_EQ(lease(*replayed, 41, kT0 + seconds(61), &journal), 2u);
  // Without a request id (an older agent) every call is a new one.
  EXPECT_EQ(LeaseShard(t, "worker:0", 0, kT0, nullptr, 1), 1u);
}

TEST(ShardTableTest, DoneAfterDeadlineIsRefusedEvenBeforeExpiry) {
  ShardTable t(Ranges(300, 100, 1, seconds(10)));
  LeaseShard(t, "worker:1", 0, kT0);
  absl::Status s = t.Done("worker:1", 0, 0, 0, 3, kT0 + seconds(10), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("the lease on shard 0 of epoch 0 was lost: its lease expired"));
  // Progress does not revive it either.
  EXPECT_EQ(t.Progress("worker:1", kT0 + seconds(11)), 0u);
  std::vector<Json> journal;
  std::vector<ReturnedLease> expired = t.ExpireLeases(kT0 + seconds(11), &journal);
  ASSERT_EQ(expired.size(), 1u);
  s = t.Done("worker:1", 0, 0, 0, 3, kT0 + seconds(11), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("was lost: its lease expired"));
  LeaseShard(t, "worker:2", 0, kT0 + seconds(12));
  s = t.Done("worker:1", 0, 0, 0, 3, kT0 + seconds(12), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("was lost: it is leased to worker:2 now"));
}

TEST(ShardTableTest, ProgressExtendsEveryLeaseOfTheTask) {
  ShardTable t(Ranges(300, 100, 1, seconds(10)));
  LeaseShard(t, "worker:1", 0, kT0);
  LeaseShard(t, "worker:1", 0, kT0 + seconds(2));
  LeaseShard(t, "worker:2", 0, kT0 + seconds(4));
  EXPECT_EQ(t.NextDeadline(), kT0 + seconds(10));
  EXPECT_EQ(t.Progress("worker:1", kT0 + seconds(8)), 2u);
  EXPECT_EQ(t.Progress("worker:9", kT0 + seconds(8)), 0u);
  EXPECT_EQ(t.Inspect(0, 0).deadline, kT0 + seconds(18));
  EXPECT_EQ(t.Inspect(0, 1).deadline, kT0 + seconds(18));
  EXPECT_EQ(t.NextDeadline(), kT0 + seconds(14));
  std::vector<ReturnedLease> expired = t.ExpireLeases(kT0 + seconds(15), nullptr);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].task, "worker:2");
  EXPECT_EQ(t.Counts(0).leased, 2u);
  EXPECT_TRUE(t.Done("worker:1", 0, 0, 1, 4, kT0 + seconds(17), nullptr).ok());
}

TEST(ShardTableTest, ExpiredLeasesReturnToTodo) {
  ShardTable t(Ranges(300, 100, 1, seconds(10)));
  LeaseShard(t, "worker:1", 0, kT0, nullptr, 2);
  LeaseShard(t, "worker:2", 0, kT0 + seconds(1));
  std::vector<Json> journal;
  EXPECT_TRUE(t.ExpireLeases(kT0 + seconds(9), &journal).empty());
  std::vector<ReturnedLease> expired = t.ExpireLeases(kT0 + seconds(10), &journal);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].shard, 0u);
  EXPECT_EQ(expired[0].attempt, 2u);
  ASSERT_EQ(journal.size(), 1u);
  EXPECT_EQ(journal[0], Json({{"type", "shard_returned"}, {"epoch", 0}, {"shard", 0},
                              {"task", "worker:1"}, {"attempt", 2},
                              {"reason", "its lease expired"}}));
  EXPECT_EQ(t.Inspect(0, 0).state, ShardState::kTodo);
  EXPECT_EQ(t.Inspect(0, 0).returned_reason, "its lease expired");
  EXPECT_EQ(t.NextDeadline(), kT0 + seconds(11));
  EXPECT_EQ(LeaseShard(t, "worker:3", 0, kT0 + seconds(10)), 0u);
  t.ExpireLeases(kT0 + seconds(60), nullptr);
  EXPECT_EQ(t.NextDeadline(), std::nullopt);
  EXPECT_EQ(t.Counts(0).todo, 3u);
}

TEST(ShardTableTest, ReleaseTaskReturnsAllItsLeases) {
  ShardTable t(Ranges(400, 100));
  LeaseShard(t, "worker:1", 0, kT0);
  LeaseShard(t, "worker:2", 0, kT0);
  LeaseShard(t, "worker:1", 0, kT0);
  std::vector<Json> journal;
  std::vector<ReturnedLease> back = t.ReleaseTask("worker:1", "worker:1 was restarted", &journal);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].shard, 0u);
  EXPECT_EQ(back[1].shard, 2u);
  EXPECT_EQ(journal[1]["reason"], "worker:1 was restarted");
  EXPECT_EQ(t.Counts(0).leased, 1u);
  EXPECT_TRUE(t.ReleaseTask("worker:1", "again", nullptr).empty());
  absl::Status s = t.Done("worker:1", 0, 0, 2, 1, kT0, nullptr);
  EXPECT_THAT(s.message(),
              HasSubstr("the lease on shard 2 of epoch 0 was lost: worker:1 was restarted"));
}

// Epoch 0 of 4 shards done at steps 10, 20, 30, 40; epoch 1 shards 0 and 1 at 50, 60 and
// shard 2 leased.
ShardTable TwoEpochsInProgress(std::vector<Json>* journal) {
  ShardTable t(Ranges(400, 100, 3));
  int64_t step = 0;
  for (uint32_t e = 0; e < 2; ++e) {
    for (uint64_t s = 0; s < (e == 0 ? 4u : 2u); ++s) {
      uint64_t id = LeaseShard(t, "worker:0", e, kT0, journal);
      EXPECT_TRUE(t.Done("worker:0", 0, e, id, step += 10, kT0, journal).ok());
    }
  }
  LeaseShard(t, "worker:1", 1, kT0, journal);
  return t;
}

TEST(ShardTableTest, RollbackFreezesLeasingUntilResumed) {
  std::vector<Json> journal;
  ShardTable t = TwoEpochsInProgress(&journal);
  journal.clear();
  t.BeginRollback(&journal);
  ASSERT_EQ(journal.size(), 2u);
  EXPECT_EQ(journal[0]["type"], "shard_returned");
  EXPECT_EQ(journal[0]["reason"], "the group restarted");
  EXPECT_EQ(journal[1], Json({{"type", "shards_frozen"}}));
  EXPECT_TRUE(t.frozen());
  EXPECT_EQ(t.num_leases(), 0u);
  EXPECT_EQ(LeaseKind(t, "worker:0", 1, true, kT0), Kind::kRetry);
  EXPECT_EQ(LeaseKind(t, "worker:0", 1, false, kT0), Kind::kRetry);
  EXPECT_EQ(LeaseKind(t, "worker:0", 0, false, kT0), Kind::kRetry);  // may be reopened
  absl::Status s = t.Done("worker:1", 0, 1, 2, 70, kT0, nullptr);
  EXPECT_THAT(s.message(), HasSubstr("was lost: the group restarted"));

  journal.clear();
  absl::StatusOr<uint64_t> reopened = t.Resumed(45, &journal);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(*reopened, 2u);  // epoch 1's shards 0 and 1
  EXPECT_EQ(journal.back(), Json({{"type", "shards_reopened"}, {"resumed_step", 45},
                                  {"count", 2}, {"epoch", 1}}));
  EXPECT_FALSE(t.frozen());
  EXPECT_EQ(t.Counts(0).done, 4u);
  EXPECT_EQ(t.Counts(1).done, 0u);
  EXPECT_EQ(LeaseShard(t, "worker:0", 1, kT0), 0u);
  EXPECT_EQ(t.Resumed(45, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShardTableTest, RollbackAcrossEpochBoundaryResumesTheEarlierEpoch) {
  ShardTable t = TwoEpochsInProgress(nullptr);
  t.BeginRollback(nullptr);
  absl::StatusOr<uint64_t> reopened = t.Resumed(25, nullptr);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(*reopened, 4u);  // epoch 0 shards 2, 3 (steps 30, 40) and epoch 1 shards 0, 1
  EXPECT_EQ(t.current_epoch(), 0u);
  EXPECT_EQ(t.Inspect(0, 1).state, ShardState::kDone);
  EXPECT_EQ(t.Inspect(0, 1).step, 20);
  EXPECT_EQ(t.Inspect(0, 2).state, ShardState::kTodo);
  EXPECT_EQ(t.Inspect(0, 2).returned_reason, "it was reopened by the rollback to step 25");
  EXPECT_EQ(LeaseKind(t, "worker:0", 1, true, kT0), Kind::kRetry);
  EXPECT_EQ(LeaseShard(t, "worker:0", 0, kT0), 2u);
  EXPECT_EQ(LeaseShard(t, "worker:0", 0, kT0), 3u);
  EXPECT_TRUE(t.Done("worker:0", 0, 0, 2, 30, kT0, nullptr).ok());
  EXPECT_TRUE(t.Done("worker:0", 0, 0, 3, 40, kT0, nullptr).ok());
  EXPECT_EQ(t.current_epoch(), 1u);
  EXPECT_EQ(LeaseShard(t, "worker:0", 1, kT0), 0u);
}

TEST(ShardTableTest, ResumedFromNoCheckpointKeepsOnlyStepZero) {
  ShardTable t = TwoEpochsInProgress(nullptr);
  t.BeginRollback(nullptr);
  EXPECT_EQ(*t.Resumed(0, nullptr), 6u);
  EXPECT_EQ(t.Counts(0).todo, 4u);
  EXPECT_EQ(t.Counts(1).todo, 4u);
}

TEST(ShardTableTest, ReplayReproducesTheTable) {
  std::vector<Json> journal;
  ShardTable t = TwoEpochsInProgress(&journal);
  LeaseShard(t, "worker:2", 1, kT0, &journal, 3);
  t.ReleaseTask("worker:2", "worker:2 failed", &journal);
  LeaseShard(t, "worker:3", 1, kT0, &journal);
  {
    absl::StatusOr<ShardTable> replayed = ShardTable::Replay(t.dataset(), journal, kT0);
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    ExpectSameTable(t, *replayed);
  }
  t.BeginRollback(&journal);
  {
    // Replayed while frozen: still frozen.
    absl::StatusOr<ShardTable> replayed = ShardTable::Replay(t.dataset(), journal, kT0);
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    EXPECT_TRUE(replayed->frozen());
    ExpectSameTable(t, *replayed);
  }
  ASSERT_TRUE(t.Resumed(25, &journal).ok());
  LeaseShard(t, "worker:0", 0, kT0, &journal, 1);
  // Records of the rest of the master's journal are skipped.
  journal.insert(journal.begin() + 3, Json({{"type", "task_state"}, {"task", "worker:0"}}));
  absl::StatusOr<ShardTable> replayed =
      ShardTable::Replay(t.dataset(), journal, kT0 + seconds(5));
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ExpectSameTable(t, *replayed);
  EXPECT_EQ(replayed->NextDeadline(), kT0 + seconds(65));  // a fresh deadline
}

TEST(ShardTableTest, ReplayRefusesAJournalThatDoesNotFit) {
  std::vector<Json> journal;
  TwoEpochsInProgress(&journal);
  // Another dataset: only 2 shards per epoch.
  absl::StatusOr<ShardTable> other = ShardTable::Replay(Ranges(200, 100, 3), journal, kT0);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss);
  // A record lost: the done of shard 0 is missing, so shard 1 is leased out of order.
  std::vector<Json> gap = journal;
  gap.erase(gap.begin() + 1);
  EXPECT_EQ(ShardTable::Replay(Ranges(400, 100, 3), gap, kT0).status().code(),
            absl::StatusCode::kDataLoss);
  std::vector<Json> broken = {{{"type", "shard_done"}, {"epoch", "zero"}}};
  EXPECT_EQ(ShardTable::Replay(Ranges(400, 100, 3), broken, kT0).status().code(),
            absl::StatusCode::kDataLoss);
}

// Found by fuzz/fuzz_journal: a number that is not a whole number in the field's range (a
// float, a negative, one past uint32) was converted by nlohmann's get<T>(), 1e30 with undefined
// behaviour, and -1 or 1.5 replayed as attempt 4294967295 or epoch 1.
TEST(ShardTableTest, ReplayRefusesNumbersTheTableNeverWrites) {
  const Json fields = {{"type", "shard_leased"}, {"epoch", 0}, {"shard", 0}, {"task", "w:0"},
                       {"attempt", 0}};
  const std::vector<std::pair<std::string, Json>> wrong = {
      {"epoch", 1e30},          {"epoch", 1.5},        {"epoch", -1},
      {"epoch", 4294967296ull}, {"attempt", -1},       {"attempt", 0.5},
      {"shard", -2},            {"shard", 1e300},      {"attempt", 4294967296ull}};
  for (const auto& [key, value] : wrong) {
    Json record = fields;
    record[key] = value;
    absl::StatusOr<ShardTable> replayed = ShardTable::Replay(Ranges(400, 100, 3), {record}, kT0);
    EXPECT_EQ(replayed.status().code(), absl::StatusCode::kDataLoss) << record.dump();
    EXPECT_THAT(replayed.status().message(), HasSubstr(key + " must be a whole number"))
        << record.dump();
  }
  std::vector<Json> done = {fields, {{"type", "shard_done"}, {"epoch", 0}, {"shard", 0},
                                     {"task", "w:0"}, {"attempt", 0}, {"step", 2.5}}};
  EXPECT_EQ(ShardTable::Replay(Ranges(400, 100, 3), done, kT0).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(ShardTable::Replay(Ranges(400, 100, 3), {fields}, kT0).ok());
}

TEST(ShardTableTest, ManyShardsStayCheap) {
  // 100k shards over 2 epochs; each call must be logarithmic for this to finish quickly.
  ShardTable t(Ranges(100'000, 1, 2));
  for (uint32_t e = 0; e < 2; ++e) {
    for (uint64_t i = 0; i < 100'000; ++i) {
      absl::StatusOr<LeaseResult> r = t.Lease("worker:0", 0, e, true, kT0, nullptr);
      ASSERT_EQ(r->shard.id, i);
      int64_t step = static_cast<int64_t>(e * 100'000 + i);
      ASSERT_TRUE(t.Done("worker:0", 0, e, i, step, kT0, nullptr).ok());
    }
  }
  EXPECT_TRUE(t.AllComplete());
}

// --- Randomized simulations ---

struct SimWorker {
  std::string task;
  uint32_t attempt = 0;
  uint32_t epoch = 0;
  std::vector<std::pair<uint32_t, uint64_t>> held;  // (epoch, shard) as the worker believes
  bool finished = false;
};

TEST(ShardTableTest, RandomWorkersCompleteEveryShardExactlyOnce) {
  constexpr uint32_t kEpochs = 3;
  ShardTable t(Ranges(57 * 10 - 3, 10, kEpochs, seconds(10)));  // 57 shards, the last short
  std::mt19937_64 rng(20240611);
  std::vector<SimWorker> workers(6);
  for (size_t i = 0; i < workers.size(); ++i) workers[i].task = "worker:" + std::to_string(i);
  std::map<std::pair<uint32_t, uint64_t>, int> done_count;
  std::vector<Json> journal;
  Clock::TimePoint now = kT0;
  int64_t step = 0;
  int iterations = 0;
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };

  while (!t.AllComplete() && ++iterations < 200'000) {
    now += milliseconds(rng() % 1500);
    t.ExpireLeases(now, &journal);
    SimWorker& w = workers[rng() % workers.size()];
    if (chance(2)) {  // dies and is restarted
      t.ReleaseTask(w.task, w.task + " failed", &journal);
      w.held.clear();
      ++w.attempt;
      w.epoch = 0;
      w.finished = false;
      continue;
    }
    if (chance(30)) t.Progress(w.task, now);
    if (!w.held.empty() && chance(50)) {
      size_t k = rng() % w.held.size();
      auto [e, s] = w.held[k];
      w.held.erase(w.held.begin() + k);
      absl::Status st = t.Done(w.task, w.attempt, e, s, ++step, now, &journal);
      if (st.ok()) {
        ++done_count[{e, s}];
      } else {
        ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
      }
      continue;
    }
    if (w.finished) continue;
    absl::StatusOr<LeaseResult> r = t.Lease(w.task, w.attempt, w.epoch, true, now, &journal);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->kind == Kind::kShard) {
      w.held.push_back({r->shard.epoch, r->shard.id});
    } else if (r->kind == Kind::kExhausted) {
      if (++w.epoch == kEpochs) w.finished = true;
    }
  }
  ASSERT_TRUE(t.AllComplete()) << "after " << iterations << " iterations";
  EXPECT_EQ(done_count.size(), kEpochs * t.num_shards());
  for (const auto& [key, count] : done_count) {
    EXPECT_EQ(count, 1) << "epoch " << key.first << " shard " << key.second;
  }
  for (uint32_t e = 0; e < kEpochs; ++e) EXPECT_EQ(t.Counts(e).done, t.num_shards());
  absl::StatusOr<ShardTable> replayed = ShardTable::Replay(t.dataset(), journal, now);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ExpectSameTable(t, *replayed);
}

// Training with checkpoints: the model holds the shards done up to the global step; a group
// restart rolls the model back to the last checkpoint, and the table must reopen exactly the
// shards the model lost.
TEST(ShardTableTest, RandomRollbacksKeepEveryShardInTheModelExactlyOnce) {
  constexpr uint32_t kEpochs = 3;
  ShardTable t(Ranges(100, 1, kEpochs, seconds(10)));
  std::mt19937_64 rng(7);
  std::vector<SimWorker> workers(4);
  for (size_t i = 0; i < workers.size(); ++i) workers[i].task = "worker:" + std::to_string(i);
  // The model: (epoch, shard) -> steps it was trained in at (a multiset, to catch doubles).
  std::multimap<std::pair<uint32_t, uint64_t>, int64_t> model;
  std::vector<Json> journal;
  Clock::TimePoint now = kT0;
  int64_t step = 0;
  int64_t checkpoint = 0;
  int rollbacks = 0;
  int epoch_rewinds = 0;
  uint32_t last_epoch = 0;
  int iterations = 0;
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };

  while (!t.AllComplete() && ++iterations < 200'000) {
    now += milliseconds(rng() % 1500);
    t.ExpireLeases(now, &journal);
    if (chance(5)) checkpoint = step;
    // A group restart to the last checkpoint: now and then, and often right after an epoch
    // boundary (so that it reopens shards of the epoch before).
    bool new_epoch = t.current_epoch() > last_epoch;
    last_epoch = t.current_epoch();
    if (rollbacks < 30 && (chance(1) || (new_epoch && chance(80)))) {
      ++rollbacks;
      t.BeginRollback(&journal);
      std::vector<SimWorker> old = workers;
      for (SimWorker& w : workers) {
        w.held.clear();
        ++w.attempt;
        w.epoch = 0;
        w.finished = false;
      }
      // Leftovers of the previous generation are refused, and nothing is leased until resumed.
      for (SimWorker& w : old) {
        for (auto [e, s] : w.held) {
          ASSERT_FALSE(t.Done(w.task, w.attempt, e, s, step + 1, now, &journal).ok());
        }
      }
      ASSERT_EQ(t.Lease("worker:0", workers[0].attempt, 0, true, now, &journal)->kind,
                Kind::kRetry);
      for (auto it = model.begin(); it != model.end();) {
        it = it->second > checkpoint ? model.erase(it) : std::next(it);
      }
      step = checkpoint;
      uint32_t epoch_before = t.current_epoch();
      ASSERT_TRUE(t.Resumed(checkpoint, &journal).ok());
      epoch_rewinds += t.current_epoch() < epoch_before;
      continue;
    }
    SimWorker& w = workers[rng() % workers.size()];
    if (chance(2)) {
      t.ReleaseTask(w.task, w.task + " failed", &journal);
      w.held.clear();
      ++w.attempt;
      w.epoch = 0;
      w.finished = false;
      continue;
    }
    if (chance(30)) t.Progress(w.task, now);
    if (!w.held.empty() && chance(50)) {
      size_t k = rng() % w.held.size();
      auto [e, s] = w.held[k];
      w.held.erase(w.held.begin() + k);
      absl::Status st = t.Done(w.task, w.attempt, e, s, step + 1, now, &journal);
      if (st.ok()) model.insert({{e, s}, ++step});
      continue;
    }
    if (w.finished) continue;
    absl::StatusOr<LeaseResult> r = t.Lease(w.task, w.attempt, w.epoch, true, now, &journal);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->kind == Kind::kShard) {
      w.held.push_back({r->shard.epoch, r->shard.id});
    } else if (r->kind == Kind::kExhausted) {
      if (++w.epoch == kEpochs) w.finished = true;
    }
  }
  ASSERT_TRUE(t.AllComplete()) << "after " << iterations << " iterations";
  EXPECT_GE(rollbacks, 3);
  EXPECT_GE(epoch_rewinds, 1);  // some rollback reopened an earlier epoch
  EXPECT_EQ(model.size(), kEpochs * t.num_shards());
  for (uint32_t e = 0; e < kEpochs; ++e) {
    for (uint64_t s = 0; s < t.num_shards(); ++s) {
      EXPECT_EQ(model.count({e, s}), 1u) << "epoch " << e << " shard " << s;
      auto it = model.find({e, s});
      if (it != model.end()) {
        EXPECT_EQ(t.Inspect(e, s).step, it->second);
      }
    }
  }
  absl::StatusOr<ShardTable> replayed = ShardTable::Replay(t.dataset(), journal, now);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ExpectSameTable(t, *replayed);
}

}  // namespace
}  // namespace shoal::master
