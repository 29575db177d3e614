#include "master/status_publisher.h"

#include <unistd.h>

#include <thread>

#include "common/files.h"
#include "master/job_status_json.h"
#include "shoal/v1/shoal.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {
namespace {

v1::TaskState ToProto(TaskState s) {
  switch (s) {
    case TaskState::kPending: return v1::TASK_STATE_PENDING;
    case TaskState::kStarting: return v1::TASK_STATE_STARTING;
    case TaskState::kRunning: return v1::TASK_STATE_RUNNING;
    case TaskState::kSucceeded: return v1::TASK_STATE_SUCCEEDED;
    case TaskState::kFailed: return v1::TASK_STATE_FAILED;
    case TaskState::kKilled: return v1::TASK_STATE_KILLED;
  }
  return v1::TASK_STATE_UNSPECIFIED;
}

v1::JobState ToProto(JobPhase p) {
  switch (p) {
    case JobPhase::kQueued: return v1::JOB_STATE_QUEUED;
    case JobPhase::kStarting: return v1::JOB_STATE_STARTING;
    case JobPhase::kRunning: return v1::JOB_STATE_RUNNING;
    case JobPhase::kStopping: return v1::JOB_STATE_STOPPING;
    case JobPhase::kSucceeded: return v1::JOB_STATE_SUCCEEDED;
    case JobPhase::kFailed: return v1::JOB_STATE_FAILED;
    case JobPhase::kKilled: return v1::JOB_STATE_KILLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

}  // namespace

v1::JobStatus BuildJobStatus(const JournaledState& job, const StatusFacts& facts) {
  v1::JobStatus status;
  status.set_job_id(job.job_id);
  status.set_name(facts.name);
  status.set_state(ToProto(job.phase));
  status.set_reason(job.phase_reason);
  status.set_created_unix_ms(facts.created_unix_ms);
  status.set_finished_unix_ms(facts.finished_unix_ms);
  for (const auto& t : job.tasks.tasks()) {
    auto* ts = status.add_tasks();
    ts->mutable_task()->set_role(t.role);
    ts->mutable_task()->set_index(t.index);
    // A finished task that will be started again shows as pending: "failed" would read as final.
    ts->set_state(t.restart_pending && IsTerminal(t.state) && t.in_world &&
                          job.phase != JobPhase::kStopping && !IsTerminal(job.phase)
                      ? v1::TASK_STATE_PENDING
                      : ToProto(t.state));
    ts->set_node(t.node);
    ts->set_pid(t.pid);
    ts->set_exit_code(t.exit_code);
    ts->set_signal(t.signal);
    ts->set_global_rank(t.global_rank);
    ts->set_reason(t.reason);
    ts->set_attempt(t.attempt);
    ts->set_in_world(t.in_world);
    ts->set_step(t.step);
  }
  status.set_generation(job.generation);
  status.set_group_restarts(job.policy.group_restarts());
  status.set_world_size(facts.world_size);
  if (job.shards) status.set_shards_json(job.shards->Snapshot().dump());
  for (const auto& f : job.failures) {
    auto* fr = status.add_failures();
    fr->mutable_task()->set_role(f.role);
    fr->mutable_task()->set_index(f.index);
    fr->mutable_task()->set_attempt(f.attempt);
    fr->set_cause(f.cause);
    fr->set_action(f.action);
    fr->set_restart(f.restart);
    fr->set_unix_ms(f.unix_ms);
  }
  status.set_failures_total(job.failures_total);
  if (job.last_publication) {
    const ModelPublished& r = job.last_publication->record;
    v1::Publication* p = status.mutable_last_publication();
    p->set_task(r.task);
    p->set_model(r.model);
    p->set_version(r.version);
    p->set_repository(r.repository);
    if (r.step) p->set_step(*r.step);
    p->mutable_metrics()->insert(r.metrics.begin(), r.metrics.end());
    p->set_unix_ms(job.last_publication->unix_ms);
  }
  return status;
}

absl::StatusOr<std::unique_ptr<StatusPublisher>> StatusPublisher::Open(const std::string& job_dir,
                                                                       EventLoop* loop,
                                                                       Clock* clock) {
  auto publisher = std::unique_ptr<StatusPublisher>(new StatusPublisher(job_dir, loop, clock));
  auto logs = TaskLogs::Open(job_dir);
  if (!logs.ok()) return logs.status();
  publisher->logs_ = std::move(*logs);
  auto feed = LogFeed::Open(job_dir + "/logs.txt");
  if (!feed.ok()) return feed.status();
  publisher->log_feed_ = std::move(*feed);
  return publisher;
}

void StatusPublisher::AfterBatch(bool job_over, const std::function<v1::JobStatus()>& build) {
  if (logs_->Flush() && logs_->combined_bytes() != log_feed_->committed()) {
    log_feed_->Commit(logs_->combined_bytes());
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : watchers_) {
      if (auto q = w.lock()) q->NewOutput();
    }
  }
  auto now = clock_->Now();
  if (!status_dirty_ && progress_dirty_ && now - last_publish_ >= kProgressPublishInterval) {
    progress_dirty_ = false;
    last_publish_ = now;
    Publish(build(), /*write_file=*/false, job_over);
    return;
  }
  if (!status_dirty_) return;
  // A large job changes thousands of task states in a burst: publish the whole status at most
  // every kStatusPublishInterval (the end of the job is always published at once).
  if (job_over || now - last_publish_ >= kStatusPublishInterval) {
    status_dirty_ = false;
    progress_dirty_ = false;
    last_publish_ = now;
    Publish(build(), /*write_file=*/true, job_over);
  } else if (!publish_pending_) {
    publish_pending_ = true;
    loop_->PostAfter(kStatusPublishInterval, [this] {
      publish_pending_ = false;
      // Runs as a batch of its own: AfterBatch follows and publishes.
    });
  }
}

void StatusPublisher::Publish(const v1::JobStatus& status, bool write_file, bool job_over) {
  std::string serialized = status.SerializeAsString();
  v1::WatchEvent event;
  *event.mutable_status() = status;
  std::string event_bytes = event.SerializeAsString();
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_snapshot_ = serialized;
    std::vector<std::weak_ptr<WatchQueue>> alive;
    uint64_t mark = logs_->combined_bytes();
    for (auto& w : watchers_) {
      if (auto q = w.lock()) {
        q->Push(event_bytes, mark, /*is_status=*/true);
        alive.push_back(w);
      }
    }
    watchers_.swap(alive);
  }
  if (!write_file) return;
  auto now = clock_->Now();
  if (job_over || now - last_status_write_ >= kStatusFileInterval) {
    last_status_write_ = now;
    WriteStatusFile();
  } else if (!status_write_pending_) {
    status_write_pending_ = true;
    loop_->PostAfter(kStatusFileInterval, [this] {
      status_write_pending_ = false;
      last_status_write_ = clock_->Now();
      WriteStatusFile();
    });
  }
}

void StatusPublisher::WriteStatusFile() {
  v1::JobStatus status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status.ParseFromString(status_snapshot_);
  }
  nlohmann::json j = JobStatusToJson(status);
  j["master_pid"] = ::getpid();
  if (auto st = WriteFileAtomically(job_dir_ + "/status.json", j.dump(2)); !st.ok()) {
    spdlog::error("cannot write status.json: {}", st.ToString());
  }
}

void StatusPublisher::EmitNotice(const std::string& notice) {
  v1::WatchEvent event;
  event.set_notice(notice);
  std::string serialized = event.SerializeAsString();
  uint64_t mark = logs_->combined_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : watchers_) {
    if (auto q = w.lock()) q->Push(serialized, mark, /*is_status=*/false);
  }
  watch_backlog_.Add(std::move(serialized), mark);
}

std::shared_ptr<WatchQueue> StatusPublisher::NewWatcher(bool logs, uint64_t log_offset,
                                                        std::function<void()> on_ready) {
  return std::make_shared<WatchQueue>(logs ? log_feed_ : nullptr, log_offset,
                                      std::move(on_ready));
}

void StatusPublisher::Attach(const std::shared_ptr<WatchQueue>& queue, bool job_over) {
  v1::WatchEvent event;
  {
    // Under the lock: nothing published meanwhile is missed or sent twice.
    std::lock_guard<std::mutex> lock(mu_);
    event.mutable_status()->ParseFromString(status_snapshot_);
    watch_backlog_.ReplayTo(*queue);
    queue->Push(event.SerializeAsString(), logs_->combined_bytes(), /*is_status=*/true);
    watchers_.push_back(queue);
  }
  if (job_over) queue->Close();
}

void StatusPublisher::CloseWatchers() {
  std::vector<std::shared_ptr<WatchQueue>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : watchers_) {
      if (auto q = w.lock()) watchers.push_back(q);
    }
  }
  for (auto& q : watchers) q->Close();
}

bool StatusPublisher::WaitForWatchers(std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    bool drained = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : watchers_) {
        // A watcher whose client went away is released by its call: expired here.
        if (auto q = w.lock(); q && !q->Drained()) drained = false;
      }
    }
    if (drained) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void StatusPublisher::FillStatus(v1::JobStatus* status) {
  std::lock_guard<std::mutex> lock(mu_);
  status->ParseFromString(status_snapshot_);
}

}  // namespace shoal::master
