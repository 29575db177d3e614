#include "master/shard_table.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shoal::master {

namespace {

nlohmann::json ShardRecord(const char* type, uint32_t epoch, uint64_t shard,
                           const std::string& task, uint32_t attempt) {
  return {{"type", type}, {"epoch", epoch}, {"shard", shard}, {"task", task},
          {"attempt", attempt}};
}

void Append(std::vector<nlohmann::json>* journal, nlohmann::json record) {
  if (journal != nullptr) journal->push_back(std::move(record));
}

std::string Where(uint32_t epoch, uint64_t shard) {
  return absl::StrCat("shard ", shard, " of epoch ", epoch);
}

// A whole-number field of a journal record, as the table wrote it. nlohmann's get<T>() would
// convert whatever number is there: 1.5 to 1, -1 to 4294967295, and 1e30 with undefined
// behaviour (found by fuzz/fuzz_journal). Anything but an integer within T's range is refused:
// nlohmann's out_of_range, which Apply turns into DataLoss like any other mistyped field.
template <typename T>
T WholeField(const nlohmann::json& record, const char* key) {
  const nlohmann::json& value = record.at(key);
  bool fits = false;
  if (value.is_number_unsigned()) {
    fits = value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  } else if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    fits = std::numeric_limits<T>::is_signed
               ? v >= static_cast<int64_t>(std::numeric_limits<T>::min())
               : v >= 0;
  }
  if (!fits) {
    throw nlohmann::json::out_of_range::create(
        406, absl::StrCat(key, " must be a whole number from ", std::numeric_limits<T>::min(),
                          " to ", std::numeric_limits<T>::max(), ", got ", value.dump()),
        &value);
  }
  return value.get<T>();
}

// FNV-1a: stable across builds and runs, unlike std::hash.
uint64_t StableHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

const char* ShardStateName(ShardState state) {
  switch (state) {
    case ShardState::kTodo: return "todo";
    case ShardState::kLeased: return "leased";
    case ShardState::kDone: return "done";
  }
  return "unknown";
}

nlohmann::json LeaseResult::ToReply() const {
  switch (kind) {
    case Kind::kShard: {
      nlohmann::json s = {{"id", shard.id}, {"epoch", shard.epoch}};
      if (!shard.file.empty()) {
        s["file"] = shard.file;
      } else {
        s["start"] = shard.start;
        s["end"] = shard.end;
      }
      return {{"ok", true}, {"shard", std::move(s)}};
    }
    case Kind::kRetry: return {{"ok", true}, {"retry_ms", retry_after.count()}};
    case Kind::kExhausted: return {{"ok", true}, {"exhausted", true}, {"epoch", epoch}};
  }
  return {{"ok", false}, {"error", "unknown lease result"}};
}

ShardTable::ShardTable(const spec::DatasetConfig& dataset)
    : dataset_(dataset),
      num_shards_(dataset.NumShards()),
      num_epochs_(dataset.epochs),
      epochs_(dataset.epochs) {
  RecomputeCurrentEpoch();
}

std::chrono::milliseconds ShardTable::RetryDelay(const std::string& task) const {
  auto span = static_cast<uint64_t>((kRetryMax - kRetryMin).count()) + 1;
  return kRetryMin + std::chrono::milliseconds(StableHash(task) % span);
}

void ShardTable::RecomputeCurrentEpoch() {
  current_epoch_ = 0;
  while (current_epoch_ < num_epochs_ && epochs_[current_epoch_].done == num_shards_) {
    ++current_epoch_;
  }
}

ShardInfo ShardTable::Describe(uint32_t epoch, uint64_t shard) const {
  ShardInfo info;
  info.epoch = epoch;
  info.id = shard;
  if (!dataset_.files.empty()) {
    info.file = dataset_.files[shard];
  } else {
    info.start = shard * dataset_.shard_size;
    info.end = std::min(dataset_.samples, info.start + dataset_.shard_size);
  }
  return info;
}

absl::StatusOr<LeaseResult> ShardTable::Lease(const std::string& task, uint32_t attempt,
                                              uint32_t epoch, bool wait, Clock::TimePoint now,
                                              std::vector<nlohmann::json>* journal,
                                              uint64_t request) {
  if (num_shards_ == 0) {
    return absl::FailedPreconditionError("the job has no dataset to lease shards of");
  }
  if (epoch >= num_epochs_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epoch ", epoch, " is beyond the dataset's ", num_epochs_, " epochs (0..",
        num_epochs_ - 1, ")"));
  }
  LeaseResult result;
  result.epoch = epoch;
  if (auto held = leases_by_task_.find(task); request != 0 && held != leases_by_task_.end()) {
    for (const Key& key : held->second) {
      const LeaseEntry& lease = leases_.at(key);
      if (lease.request == request && lease.attempt == attempt && key.first == epoch &&
          lease.deadline > now) {
        result.kind = LeaseResult::Kind::kShard;
        result.shard = Describe(key.first, key.second);
        return result;
      }
    }
  }
  Epoch& e = epochs_[epoch];
  auto retry = [&] {
    result.kind = LeaseResult::Kind::kRetry;
    result.retry_after = RetryDelay(task);
    return result;
  };
  // Frozen first: a rollback may reopen an epoch that is complete now.
  if (frozen_) return retry();
  if (e.done == num_shards_) {
    result.kind = LeaseResult::Kind::kExhausted;
    return result;
  }
  if (epoch > current_epoch_) return retry();

  uint64_t shard;
  if (!e.returned.empty()) {
    // Every returned shard is below next_fresh, so the lowest todo shard is here.
    auto it = e.returned.begin();
    shard = it->first;
    e.returned.erase(it);
  } else if (e.next_fresh < num_shards_) {
    shard = e.next_fresh++;
  } else {
    // Nothing todo: the rest is leased (the epoch is not complete).
    if (wait) return retry();
    result.kind = LeaseResult::Kind::kExhausted;
    return result;
  }
  Key key{epoch, shard};
  Clock::TimePoint deadline = now + dataset_.lease_timeout;
  leases_[key] = LeaseEntry{task, attempt, deadline, request};
  leases_by_task_[task].insert(key);
  leases_by_deadline_.insert({deadline, key});
  ++e.leased;
  if (journal != nullptr) {
    journal->push_back(ShardRecord("shard_leased", epoch, shard, task, attempt));
    if (request != 0) journal->back()["request"] = request;
  }
  result.kind = LeaseResult::Kind::kShard;
  result.shard = Describe(epoch, shard);
  return result;
}

absl::Status ShardTable::Done(const std::string& task, uint32_t attempt, uint32_t epoch,
                              uint64_t shard, int64_t step, Clock::TimePoint now,
                              std::vector<nlohmann::json>* journal) {
  return Complete(task, attempt, epoch, shard, step, now, journal);
}

absl::Status ShardTable::Complete(const std::string& task, uint32_t attempt, uint32_t epoch,
                                  uint64_t shard, int64_t step,
                                  std::optional<Clock::TimePoint> now,
                                  std::vector<nlohmann::json>* journal) {
  if (epoch >= num_epochs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch ", epoch, " is beyond the dataset's ", num_epochs_, " epochs"));
  }
  if (shard >= num_shards_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, " does not exist (the dataset has ", num_shards_,
                     " shards)"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " of the done report for ", Where(epoch, shard),
                     " is negative"));
  }
  Epoch& e = epochs_[epoch];
  if (IsDone(e, shard)) {
    // Live only: a journal holds each Done once.
    if (auto last = last_done_.find(task);
        now && last != last_done_.end() && last->second.attempt == attempt &&
        last->second.epoch == epoch && last->second.shard == shard && last->second.step == step &&
        e.done_step[shard] == step) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        Where(epoch, shard), " is already done (at step ", e.done_step[shard], ")"));
  }
  Key key{epoch, shard};
  auto lost = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("the lease on ", Where(epoch, shard), " was lost: ", why));
  };
  auto it = leases_.find(key);
  if (it == leases_.end()) {
    auto r = e.returned.find(shard);
    if (r != e.returned.end() && r->second.task == task) return lost(r->second.reason);
    return absl::FailedPreconditionError(absl::StrCat(
        Where(epoch, shard), " is not leased to ", task, " (attempt ", attempt, ")"));
  }
  const LeaseEntry& lease = it->second;
  if (lease.task != task) return lost(absl::StrCat("it is leased to ", lease.task, " now"));
  if (lease.attempt != attempt) {
    return lost(absl::StrCat("it is leased to attempt ", lease.attempt, " of ", task,
                             " now, not attempt ", attempt));
  }
  if (now && lease.deadline <= *now) return lost(kExpiredReason);

  leases_by_deadline_.erase({lease.deadline, key});
  auto t = leases_by_task_.find(task);
  t->second.erase(key);
  if (t->second.empty()) leases_by_task_.erase(t);
  leases_.erase(it);
  --e.leased;
  if (e.done_step.empty()) e.done_step.assign(num_shards_, kNotDone);
  e.done_step[shard] = step;
  ++e.done;
  e.max_done_step = std::max(e.max_done_step, step);
  last_done_[task] = LastDone{attempt, epoch, shard, step};
  if (journal != nullptr) {
    journal->push_back(ShardRecord("shard_done", epoch, shard, task, attempt));
    journal->back()["step"] = step;
  }
  if (e.done == num_shards_) {
    Append(journal, {{"type", "epoch_complete"}, {"epoch", epoch}});
    if (epoch == current_epoch_) RecomputeCurrentEpoch();
  }
  return absl::OkStatus();
}

size_t ShardTable::Progress(const std::string& task, Clock::TimePoint now) {
  auto t = leases_by_task_.find(task);
  if (t == leases_by_task_.end()) return 0;
  Clock::TimePoint deadline = now + dataset_.lease_timeout;
  size_t extended = 0;
  for (const Key& key : t->second) {
    LeaseEntry& lease = leases_.at(key);
    if (lease.deadline <= now) continue;  // already lost; ExpireLeases collects it
    leases_by_deadline_.erase({lease.deadline, key});
    lease.deadline = deadline;
    leases_by_deadline_.insert({deadline, key});
    ++extended;
  }
  return extended;
}

void ShardTable::ReturnToTodo(const Key& key, const std::string& reason,
                              std::vector<nlohmann::json>* journal,
                              std::vector<ReturnedLease>* out) {
  auto it = leases_.find(key);
  LeaseEntry lease = std::move(it->second);
  leases_.erase(it);
  leases_by_deadline_.erase({lease.deadline, key});
  auto t = leases_by_task_.find(lease.task);
  t->second.erase(key);
  if (t->second.empty()) leases_by_task_.erase(t);
  Epoch& e = epochs_[key.first];
  --e.leased;
  e.returned[key.second] = Returned{lease.task, lease.attempt, reason};
  if (journal != nullptr) {
    journal->push_back(
        ShardRecord("shard_returned", key.first, key.second, lease.task, lease.attempt));
    journal->back()["reason"] = reason;
  }
  if (out != nullptr) out->push_back({key.first, key.second, lease.task, lease.attempt});
}

std::vector<ReturnedLease> ShardTable::ReleaseTask(const std::string& task,
                                                   const std::string& reason,
                                                   std::vector<nlohmann::json>* journal) {
  std::vector<ReturnedLease> out;
  auto t = leases_by_task_.find(task);
  if (t == leases_by_task_.end()) return out;
  std::vector<Key> keys(t->second.begin(), t->second.end());  // ReturnToTodo erases t
  for (const Key& key : keys) ReturnToTodo(key, reason, journal, &out);
  return out;
}

std::vector<ReturnedLease> ShardTable::ExpireLeases(Clock::TimePoint now,
                                                    std::vector<nlohmann::json>* journal) {
  std::vector<ReturnedLease> out;
  while (!leases_by_deadline_.empty() && leases_by_deadline_.begin()->first <= now) {
    Key key = leases_by_deadline_.begin()->second;
    ReturnToTodo(key, kExpiredReason, journal, &out);
  }
  return out;
}

std::optional<Clock::TimePoint> ShardTable::NextDeadline() const {
  if (leases_by_deadline_.empty()) return std::nullopt;
  return leases_by_deadline_.begin()->first;
}

void ShardTable::BeginRollback(std::vector<nlohmann::json>* journal) {
  // The returns are journaled before the freeze, so that replaying shards_frozen finds no lease.
  while (!leases_.empty()) {
    Key key = leases_.begin()->first;
    ReturnToTodo(key, kGroupRestartReason, journal, nullptr);
  }
  if (frozen_) return;
  frozen_ = true;
  Append(journal, {{"type", "shards_frozen"}});
}

absl::StatusOr<uint64_t> ShardTable::Resumed(int64_t step,
                                             std::vector<nlohmann::json>* journal) {
  if (!frozen_) {
    return absl::FailedPreconditionError(
        "no group restart is under way: the checkpoint step was already taken into account");
  }
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("resumed step ", step, " is negative"));
  }
  while (!leases_.empty()) {  // none can exist while frozen; kept for safety
    Key key = leases_.begin()->first;
    ReturnToTodo(key, kGroupRestartReason, journal, nullptr);
  }
  std::string reason = absl::StrCat("it was reopened by the rollback to step ", step);
  uint64_t count = 0;
  for (Epoch& e : epochs_) {
    if (e.max_done_step <= step) continue;  // nothing of this epoch was done after `step`
    for (uint64_t s = 0; s < e.done_step.size(); ++s) {
      if (e.done_step[s] == kNotDone || e.done_step[s] <= step) continue;
      e.done_step[s] = kNotDone;
      --e.done;
      e.returned[s] = Returned{"", 0, reason};
      ++count;
    }
    e.max_done_step = std::min(e.max_done_step, step);
  }
  frozen_ = false;
  last_done_.clear();  // the tasks that made them were restarted: no repeat is current
  RecomputeCurrentEpoch();
  Append(journal, {{"type", "shards_reopened"},
                   {"resumed_step", step},
                   {"count", count},
                   {"epoch", current_epoch_}});
  return count;
}

EpochCounts ShardTable::Counts(uint32_t epoch) const {
  const Epoch& e = epochs_[epoch];
  return EpochCounts{num_shards_ - e.leased - e.done, e.leased, e.done};
}

ShardView ShardTable::Inspect(uint32_t epoch, uint64_t shard) const {
  ShardView view;
  const Epoch& e = epochs_[epoch];
  if (IsDone(e, shard)) {
    view.state = ShardState::kDone;
    view.step = e.done_step[shard];
    return view;
  }
  if (auto it = leases_.find({epoch, shard}); it != leases_.end()) {
    view.state = ShardState::kLeased;
    view.task = it->second.task;
    view.attempt = it->second.attempt;
    view.deadline = it->second.deadline;
    return view;
  }
  if (auto it = e.returned.find(shard); it != e.returned.end()) {
    view.returned_reason = it->second.reason;
  }
  return view;
}

nlohmann::json ShardTable::Snapshot() const {
  nlohmann::json counts = nlohmann::json::array();
  for (uint32_t i = 0; i < num_epochs_; ++i) {
    EpochCounts c = Counts(i);
    counts.push_back({{"epoch", i}, {"todo", c.todo}, {"leased", c.leased}, {"done", c.done}});
  }
  nlohmann::json leases = nlohmann::json::array();
  for (const auto& [key, lease] : leases_) {
    leases.push_back({{"epoch", key.first},
                      {"shard", key.second},
                      {"task", lease.task},
                      {"attempt", lease.attempt}});
  }
  return {{"shards", num_shards_},
          {"epochs", num_epochs_},
          {"current_epoch", current_epoch_},
          {"complete", AllComplete()},
          {"frozen", frozen_},
          {"epoch_counts", std::move(counts)},
          {"leases", std::move(leases)}};
}

// --- Replay ---

bool ShardTable::IsShardRecord(const nlohmann::json& record) {
  if (!record.is_object()) return false;
  auto it = record.find("type");
  if (it == record.end() || !it->is_string()) return false;
  const std::string& type = it->get_ref<const std::string&>();
  return type == "shard_leased" || type == "shard_done" || type == "shard_returned" ||
         type == "shards_frozen" || type == "shards_reopened" || type == "epoch_complete";
}

absl::Status ShardTable::Apply(const nlohmann::json& record, Clock::TimePoint now) {
  if (!IsShardRecord(record)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a shard table record: ", record.dump()));
  }
  auto mismatch = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrCat("the shard journal does not fit the dataset: ", record.dump(), ": ", why));
  };
  // The fields are read with nlohmann's checked accessors; a missing or mistyped field throws.
  try {
    const std::string type = record.at("type").get<std::string>();
    if (type == "shards_frozen") {
      if (frozen_) return mismatch("leasing is frozen already");
      if (!leases_.empty()) return mismatch("leases are still held");
      BeginRollback(nullptr);
      return absl::OkStatus();
    }
    if (type == "shards_reopened") {
      auto step = WholeField<int64_t>(record, "resumed_step");
      auto count = WholeField<uint64_t>(record, "count");
      absl::StatusOr<uint64_t> reopened = Resumed(step, nullptr);
      if (!reopened.ok()) return mismatch(std::string(reopened.status().message()));
      if (*reopened != count) {
        return mismatch(absl::StrCat("it reopens ", *reopened, " shards here"));
      }
      return absl::OkStatus();
    }
    auto epoch = WholeField<uint32_t>(record, "epoch");
    if (epoch >= num_epochs_) return mismatch("no such epoch");
    if (type == "epoch_complete") {
      if (epochs_[epoch].done != num_shards_) return mismatch("the epoch is not complete");
      return absl::OkStatus();
    }
    auto shard = WholeField<uint64_t>(record, "shard");
    auto task = record.at("task").get<std::string>();
    auto attempt = WholeField<uint32_t>(record, "attempt");
    if (shard >= num_shards_) return mismatch("no such shard");
    if (type == "shard_leased") {
      // The table hands out shards deterministically, so leasing again must give this shard.
      uint64_t request = record.contains("request") ? WholeField<uint64_t>(record, "request") : 0;
      absl::StatusOr<LeaseResult> got = Lease(task, attempt, epoch, true, now, nullptr, request);
      if (!got.ok()) return mismatch(std::string(got.status().message()));
      if (got->kind != LeaseResult::Kind::kShard || got->shard.id != shard) {
        return mismatch("the table would not lease that shard now");
      }
      return absl::OkStatus();
    }
    if (type == "shard_done") {
      // The journal holds only accepted reports: no deadline check (a replayed lease's deadline
      // is made up anyway).
      absl::Status s = Complete(task, attempt, epoch, shard, WholeField<int64_t>(record, "step"),
                                std::nullopt, nullptr);
      if (!s.ok()) return mismatch(std::string(s.message()));
      return absl::OkStatus();
    }
    // shard_returned
    auto it = leases_.find({epoch, shard});
    if (it == leases_.end() || it->second.task != task || it->second.attempt != attempt) {
      return mismatch("the shard is not leased to that task");
    }
    ReturnToTodo({epoch, shard}, record.at("reason").get<std::string>(), nullptr, nullptr);
    return absl::OkStatus();
  } catch (const nlohmann::json::exception& e) {
    return mismatch(e.what());
  }
}

absl::StatusOr<ShardTable> ShardTable::Replay(const spec::DatasetConfig& dataset,
                                              const std::vector<nlohmann::json>& records,
                                              Clock::TimePoint now) {
  ShardTable table(dataset);
  for (const nlohmann::json& record : records) {
    if (!IsShardRecord(record)) continue;
    SHOAL_RETURN_IF_ERROR(table.Apply(record, now));
  }
  return table;
}

}  // namespace shoal::master
