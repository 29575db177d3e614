#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "master/horovod_rendezvous.h"
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/journal.h"
#include "frameworks/cluster_plan.h"
#include "master/failure_policy.h"
#include "master/job_state.h"
#include "master/placement.h"
#include "master/watch_queue.h"
#include "spec/job_spec.h"

namespace grpc {
class Server;
}
namespace shoal::v1 {
class AgentMessage;
class MasterMessage;
class JobStatus;
class WatchEvent;
}  // namespace shoal::v1

namespace shoal::master {

class MasterService;
class ShardTable;
class TaskLogs;

struct MasterOptions {
  std::string job_id;
  std::string job_dir;
  spec::JobSpec spec;
  std::string listen_host = "127.0.0.1";  // loopback unless configured otherwise
  uint16_t listen_port = 0;               // 0: any free port
  // How long Start() keeps trying a listen_port that is in use before it gives up. A recovering
  // master waits here for its predecessor's socket: a killed process keeps its files open until
  // its last thread is gone, which can be long after its main thread shows as a zombie.
  std::chrono::milliseconds listen_patience{0};
  std::string token;                      // every caller must present it
  std::string shoal_binary;               // for the backend to start agents
  std::chrono::milliseconds heartbeat_interval{1000};
  int heartbeat_misses = 3;
  std::chrono::milliseconds register_timeout{30000};
  std::chrono::milliseconds stop_grace{3000};
  std::chrono::milliseconds admission_retry{1000};
  // On backends whose resource manager signals agents and tasks itself (Slurm), how long a
  // task's unrequested SIGTERM or an agent's disconnect waits for the backend to report why
  // (a cancelled allocation) before it counts as a failure.
  std::chrono::milliseconds outside_stop_settle{2000};
  uint32_t agent_master_grace_ms = 10000;
  // Take over a job whose previous master died: rebuild its state from events.jsonl, listen on
  // the address it listened on, and re-attach to the agents and tasks still running.
  bool recover = false;
  // Every time the master reads and every timer of its loop (heartbeat checks, settling and
  // restart delays, status throttling). Must outlive the master.
  Clock* clock = SystemClock::Get();
};

// A stream to one agent. Implemented over gRPC by MasterService; thread-safe.
class AgentConnection {
 public:
  virtual ~AgentConnection() = default;
  virtual bool Send(const v1::MasterMessage& message) = 0;
  virtual void Close() = 0;

  // When the agent was last heard from. Written on the transport's thread for every message,
  // read by the master's loop: heartbeats, the bulk of the traffic, never wake the loop.
  void Touch(Clock::TimePoint now) {
    last_seen_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }
  Clock::TimePoint last_seen() const {
    return Clock::TimePoint(Clock::Duration(last_seen_ns_.load(std::memory_order_relaxed)));
  }

 private:
  std::atomic<int64_t> last_seen_ns_{0};
};

// The only owner of one job's state. Everything runs on its event loop: gRPC handlers and the
// backend post onto it. Every change is journalled (group commit after each batch of work)
// before it is visible to clients.
class Master {
 public:
  static absl::StatusOr<std::unique_ptr<Master>> Create(MasterOptions options,
                                                        std::unique_ptr<backends::Backend> backend);
  ~Master();

  // Binds the control plane, writes master.json, and starts admission.
  absl::Status Start();
  std::string address() const { return address_; }
  // Blocks until the job reached its outcome and every agent was released. Returns the
  // process exit code: 0 succeeded, 1 failed, 3 killed.
  int Wait();
  // Stops the job; the outcome is `killed` unless it was already decided.
  void Kill(const std::string& reason);
  // A service beside the job (TensorBoard) is up at `url`, or could not start: journaled and
  // shown to everyone following the job. Thread-safe.
  void AnnounceSidecar(const std::string& name, const std::string& url);
  void SidecarFailed(const std::string& name, const std::string& why);

  // ---- called by MasterService from gRPC threads
  bool Authorized(const std::string& authorization_header) const;
  uint64_t AgentConnected(std::shared_ptr<AgentConnection> connection);
  void AgentMessageReceived(AgentConnection* connection, uint64_t session,
                            const v1::AgentMessage& message);
  void AgentDisconnected(uint64_t session);
  void FillStatus(v1::JobStatus* status);  // thread-safe snapshot
  // A new watcher's queue; `on_ready` runs whenever events were pushed, output was committed or
  // it was closed. With `logs`, output is sent from byte `log_offset` of logs.txt on.
  std::shared_ptr<WatchQueue> AddWatcher(bool logs, uint64_t log_offset,
                                         std::function<void()> on_ready);
  // After Wait: gives watchers up to `limit` to take what is left of the job's output and
  // status. True when every one did (or none is connected).
  bool WaitForWatchers(std::chrono::milliseconds limit);

 private:
  struct AgentSession {
    uint64_t id = 0;
    std::shared_ptr<AgentConnection> connection;
    std::string node;
    bool registered = false;
    std::vector<uint32_t> free_ports;
    std::string address;
    std::string leaving;  // why the agent said it is stopping, if it did
  };
  Master(MasterOptions options, std::unique_ptr<backends::Backend> backend);

  // All below run on the loop.
  void TryAdmit();
  // Rebuilds the job from the journal (options_.recover). Errors mean the journal cannot be
  // trusted; the job is then left as it is for a person to look at.
  absl::Status Replay(const std::vector<nlohmann::json>& records);
  void Recover();
  void ReconcileNode(const std::string& node, const v1::AgentMessage& registration);
  void OnRegister(AgentSession& session, const v1::AgentMessage& message);
  void CompleteRendezvous();
  void ArmRegisterTimer();
  void OnAllocationEvent(const backends::Backend::AllocationEvent& event);
  const backends::NodeGrant* GrantFor(const std::string& node) const;
  void LaunchReadyRoles();
  void OnTaskStarted(const v1::AgentMessage& message);
  void OnTaskExited(const v1::AgentMessage& message, bool settled = false);
  void OnLog(const v1::AgentMessage& message);
  void OnTaskStalled(const v1::AgentMessage& message);
  void OnSdkRequest(AgentSession& session, const v1::AgentMessage& message);
  // Applies the SDK steps heartbeats brought since the last drain.
  void DrainProgress();
  void ArmLeaseTimer();
  void ReleaseShards(const TaskRecord& task, const std::string& why);
  void ReplySdk(AgentSession& session, uint64_t request_id, const nlohmann::json& reply);
  // Applies the role's policy to a task that ended badly (exit, signal, hang, lost agent).
  void HandleTaskFailure(TaskRecord& task, const std::string& cause);
  void HandleCleanExit(TaskRecord& task);
  void ScheduleTaskRestart(TaskRecord& task, const PolicyDecision& decision);
  void RecordFailure(const TaskRecord& task, const std::string& cause, const std::string& action,
                     uint32_t restart);
  void RelaunchTask(const std::string& role, uint32_t index, uint32_t attempt);
  bool InGroup(const TaskRecord& task) const;
  // Stops every task of the group for a new rendezvous, which starts `delay` after the last
  // of them is gone.
  void BeginGroupRestart(const std::string& reason, std::chrono::milliseconds delay);
  void MaybeRelaunchGroup();
  void RelaunchGroup();
  void CheckGrowth();
  void BeginGrowth();
  // Assigns ranks to the tasks in the world and builds plan_ from them.
  bool BuildPlan(bool journal = true);
  void SendClusterSpec();
  v1::MasterMessage ClusterSpecMessage() const;
  // What the backend needs to start (or replace) this job's agents.
  backends::AgentStartOptions AgentStartOptionsForJob() const;
  void StopTask(TaskRecord& task, std::chrono::milliseconds grace, const std::string& reason);
  void OnPlaceLost(const std::string& node, const std::string& why);
  // Asks the backend for a new agent on a lost place that tasks will restart on.
  void ReplacePlace(const std::string& node);
  void DropSessionsOf(const std::string& node);
  void CheckHeartbeats();
  void FailTasksOnNode(const std::string& node, const std::string& reason);
  void SetPhase(JobPhase phase, const std::string& reason);
  void EvaluateOutcome();
  void BeginStopping(JobPhase outcome, const std::string& reason);
  void MaybeFinish();
  void Finish();
  void Journal(nlohmann::json record);
  void Transition(TaskRecord& task, TaskState to, const std::string& reason = "");
  void AfterBatch();
  // Makes the journal durable, then sends what the batch queued for agents: an agent never acts
  // on a change the journal could lose.
  void Commit();
  void SendToAgent(AgentSession& session, const v1::MasterMessage& message);
  // write_file: also refresh status.json (state changes do; progress-only refreshes do not).
  void PublishStatus(bool write_file = true);
  void WriteStatusFile();
  void EmitNotice(const std::string& notice);
  AgentSession* SessionForNode(const std::string& node);

  MasterOptions options_;
  std::unique_ptr<backends::Backend> backend_;
  EventLoop loop_;
  std::unique_ptr<shoal::Journal> journal_;
  std::unique_ptr<MasterService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  // Owned by the loop.
  JobState state_;
  JobPhase phase_ = JobPhase::kQueued;
  std::string phase_reason_;
  std::optional<Outcome> pending_outcome_;
  std::vector<backends::NodeGrant> grants_;
  std::vector<PlacedTask> placement_;
  frameworks::ClusterPlan plan_;
  std::map<uint64_t, AgentSession> sessions_;
  std::map<std::string, uint64_t> node_sessions_;  // registered node -> session id
  std::set<std::string> granted_nodes_;
  std::map<std::string, std::string> node_addresses_;  // node -> address its agent reported
  std::map<std::string, std::vector<std::string>> node_gpus_;
  std::set<std::string> notices_shown_;  // agent notices already shown to clients  // node -> GPUs its agent sees
  std::set<std::string> awaiting_reattach_;
  std::set<std::string> replacing_nodes_;  // lost places whose new agent has not registered
  std::map<std::string, uint32_t> place_replacements_;  // recovery: nodes whose agent has not come back
  bool finished_before_recovery_ = false;
  bool recovery_started_ = false;
  std::string previous_address_;  // recovery: where the previous master listened
  std::unique_ptr<TaskLogs> logs_;
  std::vector<std::pair<std::shared_ptr<AgentConnection>, std::unique_ptr<v1::MasterMessage>>>
      outbox_;
  std::vector<std::string> launched_roles_;
  bool status_dirty_ = true;
  // status.json is rewritten (with an fsync) at most every kStatusFileInterval while running,
  // so a burst of task changes in a large job costs one write, not thousands.
  static constexpr std::chrono::milliseconds kStatusFileInterval{250};
  Clock::TimePoint last_status_write_{};
  static constexpr std::chrono::milliseconds kStatusPublishInterval{50};
  Clock::TimePoint last_publish_{};
  bool publish_pending_ = false;
  bool progress_dirty_ = false;  // only SDK steps changed since the last publish
  static constexpr std::chrono::milliseconds kProgressPublishInterval{1000};
  bool status_write_pending_ = false;
  bool rendezvous_done_ = false;
  // Horovod's gloo key-value store, for framework: horovod; null otherwise.
  std::unique_ptr<HorovodRendezvous> horovod_rendezvous_;
  // Failure handling (docs/fault-tolerance.md).
  uint32_t generation_ = 0;       // bumped by every group restart or rescale
  FailurePolicy policy_;
  struct FailureEntry {
    std::string role;
    uint32_t index = 0;
    uint32_t attempt = 0;
    std::string cause;
    std::string action;
    uint32_t restart = 0;
    int64_t unix_ms = 0;
  };
  static constexpr size_t kFailuresKept = 100;
  std::deque<FailureEntry> failures_;  // newest last, for status
  uint32_t failures_total_ = 0;
  bool group_restart_in_progress_ = false;
  std::chrono::milliseconds group_restart_delay_{0};
  bool grow_pending_ = false;     // elastic: capacity is back; grow after the next checkpoint
  bool grow_timer_set_ = false;
  std::map<std::string, uint32_t> slot_ports_;            // task key -> its port, fixed per job
  std::unique_ptr<ShardTable> shards_;  // null without a dataset
  bool lease_timer_armed_ = false;
  uint64_t register_timer_ = 0;
  int64_t created_unix_ms_ = 0;
  int64_t finished_unix_ms_ = 0;

  // Shared with gRPC threads.
  static constexpr std::chrono::milliseconds kProgressDrainInterval{200};
  struct PendingStep {
    uint32_t attempt = 0;
    uint64_t step = 0;
    bool fresh = false;  // not applied yet
  };
  std::mutex progress_mu_;
  // (role, index) -> the latest step heard; entries are never erased
  std::map<std::pair<std::string, uint32_t>, PendingStep> pending_progress_;
  bool progress_drain_scheduled_ = false;
  std::atomic<uint64_t> next_session_{1};
  mutable std::mutex mu_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  std::string status_snapshot_;  // serialized v1::JobStatus, refreshed after each batch
  std::vector<std::weak_ptr<WatchQueue>> watchers_;
  // The notices watchers were sent, for those that attach later.
  WatchBacklog watch_backlog_;
  // logs.txt as watchers read it; committed after each batch's flush.
  std::shared_ptr<LogFeed> log_feed_;
};

}  // namespace shoal::master
