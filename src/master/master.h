#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/journal.h"
#include "frameworks/cluster_plan.h"
#include "master/admission.h"
#include "master/agent_registry.h"
#include "master/control_plane.h"
#include "master/horovod_rendezvous.h"
#include "master/journaled_state.h"
#include "master/placement.h"
#include "master/resource_logs.h"
#include "master/restart_coordinator.h"
#include "master/sdk_relay.h"
#include "master/status_publisher.h"
#include "spec/job_spec.h"

namespace grpc {
class Server;
}

namespace shoal::master {

class MasterService;

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
  uint32_t agent_master_grace_ms = 10000;
  // Take over a job whose previous master died: rebuild its state from events.jsonl, listen on
  // the address it listened on, and re-attach to the agents and tasks still running.
  bool recover = false;
  // Every time the master reads and every timer of its loop (heartbeat checks, settling and
  // restart delays, status throttling). Must outlive the master.
  Clock* clock = SystemClock::Get();
};

// The only owner of one job: the coordinator of its parts (docs/design/0008-master-structure.md).
// Everything runs on its event loop: gRPC handlers and the backend post onto it. Every change is
// a journal record, applied to the JournaledState as it is written (group commit after each
// batch of work) and durable before it is visible to clients or agents.
class Master : public ControlPlane,
               private Admission::Host,
               private RestartCoordinator::Host,
               private SdkRelay::Host {
 public:
  static absl::StatusOr<std::unique_ptr<Master>> Create(MasterOptions options,
                                                        std::unique_ptr<backends::Backend> backend);
  ~Master() override;

  // Binds the control plane, writes master.json, and starts admission.
  absl::Status Start();
  std::string address() const { return address_; }
  // Blocks until the job reached its outcome and every agent was released. Returns the
  // process exit code: 0 succeeded, 1 failed, 3 killed.
  int Wait();
  // A service beside the job (TensorBoard) is up at `url`, or could not start: journaled and
  // shown to everyone following the job. Thread-safe.
  void AnnounceSidecar(const std::string& name, const std::string& url);
  void SidecarFailed(const std::string& name, const std::string& why);
  // After Wait: gives watchers up to `limit` to take what is left of the job's output and
  // status. True when every one did (or none is connected).
  bool WaitForWatchers(std::chrono::milliseconds limit);

  // ---- ControlPlane: called by MasterService from gRPC threads
  bool Authorized(const std::string& authorization_header) const override;
  uint64_t AgentConnected(std::shared_ptr<AgentConnection> connection) override;
  void AgentMessageReceived(AgentConnection* connection, uint64_t session,
                            const v1::AgentMessage& message) override;
  void AgentDisconnected(uint64_t session) override;
  void FillStatus(v1::JobStatus* status) override;
  std::shared_ptr<WatchQueue> AddWatcher(bool logs, uint64_t log_offset,
                                         std::function<void()> on_ready) override;
  void Kill(const std::string& reason) override;

 private:
  Master(MasterOptions options, std::unique_ptr<backends::Backend> backend);

  // All below run on the loop.
  // ---- registration and rendezvous (master_admission.cc)
  void OnRegister(AgentSession& session, const v1::AgentMessage& message);
  void CompleteRendezvous();
  // Every granted place the rendezvous waits for (all but deferred ones) has its agent.
  bool ExpectedAgentsRegistered();
  void RendezvousMayComplete() override;
  // At the rendezvous: the tasks of deferred places without an agent start out of the world
  // (slot_deferred). False when the job cannot start without them (it is then stopping).
  bool DeferSlotsWithoutPlace();
  // Ranks the tasks in the world as generation `generation` and journals it (the rendezvous
  // record, whose Apply sets each task's rank, place and port); the plan is plan_. `ports`: the
  // tasks' ports at the first rendezvous (later ones keep those the journal holds).
  std::optional<size_t> FormWorld(uint32_t generation, bool journal,
                                  const std::map<std::string, uint32_t>* ports = nullptr);
  v1::MasterMessage ClusterSpecMessage() const;
  void SendClusterSpec();
  void LaunchReadyRoles();

  // ---- task facts and places (master.cc)
  void OnTaskStarted(const v1::AgentMessage& message);
  // A chunk of a task's output, from a LogChunk or a LogBatch.
  void OnLogChunk(const v1::LogChunk& chunk, const std::string& node);
  // After the batch's output is in the files: each agent learns how far its tasks' output is
  // there, and stops keeping it (docs/design/0002-fault-tolerance.md). At most once per
  // kOutputAckInterval: one message back per message of output cost a chatty job's processes
  // ~70 % more CPU per line when the agent does not batch, and the agents can keep 8 MiB.
  void TellAgentsWhatOutputIsCommitted();
  static constexpr std::chrono::milliseconds kOutputAckInterval{250};
  void OnTaskExited(const v1::AgentMessage& message, bool settled = false);
  void OnTaskStalled(const v1::AgentMessage& message);
  // The agent's samples of its tasks: kept in each task's resources.jsonl.
  void OnResourceSamples(const v1::AgentMessage& message);
  void DrainProgress();
  void OnPlaceLost(const std::string& node, const std::string& why);
  // Asks the backend for a new agent on a lost place that tasks will restart on.
  void ReplacePlace(const std::string& node);
  void CheckHeartbeats();
  void FailTasksOnNode(const std::string& node, const std::string& reason);

  // ---- recovery (master_recovery.cc)
  void Recover();
  void ReconcileNode(const std::string& node, const v1::AgentMessage& registration);

  // ---- outcome and shutdown (master.cc)
  void SetPhase(JobPhase phase, const std::string& reason) override;
  void EvaluateOutcome();
  void BeginStopping(JobPhase outcome, const std::string& reason) override;
  void MaybeFinish();
  void Finish();
  // Tells those waiting in Wait that the job is over.
  void Finished();
  bool Ending() const override;

  // ---- the journal
  // Applies the record to job_ and appends it to the journal (durable at the batch's Commit).
  void Record(JournalRecord record) override;
  void Transition(TaskRecord& task, TaskState to, const std::string& reason = "") override;
  void AfterBatch();
  // Makes the journal durable, then sends what the batch queued for agents: an agent never acts
  // on a change the journal could lose.
  void Commit();

  // ---- the parts' Host interfaces
  bool Registered(const std::string& node) override;
  void AgentsStarted() override;
  backends::AgentStartOptions AgentStartOptions() const override;
  void CancelTimer(uint64_t id) override;
  void StopTask(TaskRecord& task, std::chrono::milliseconds grace,
                const std::string& reason) override;
  void Notice(const std::string& text) override;
  uint64_t PostAfter(std::chrono::milliseconds delay, std::function<void()> task) override;
  std::optional<size_t> FormWorld(uint32_t generation) override {
    return FormWorld(generation, /*journal=*/true);
  }
  void Relaunch(const std::string& role) override;
  bool PlaceReady(const TaskRecord& task) override;
  void Reply(uint64_t session, uint64_t request_id, const nlohmann::json& reply) override;
  void Checkpointed() override { restarts_.OnCheckpoint(); }

  MasterOptions options_;
  std::unique_ptr<backends::Backend> backend_;
  EventLoop loop_;
  std::unique_ptr<shoal::Journal> journal_;
  std::unique_ptr<MasterService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  // Owned by the loop.
  JournaledState job_;
  AgentRegistry agents_;
  RestartCoordinator restarts_;
  SdkRelay sdk_;
  Admission admission_;
  std::unique_ptr<StatusPublisher> publisher_;
  std::unique_ptr<ResourceLogs> resource_logs_;
  std::optional<Clock::TimePoint> output_acked_at_;  // TellAgentsWhatOutputIsCommitted
  frameworks::ClusterPlan plan_;
  std::set<std::string> notices_shown_;  // agent notices already shown to clients
  std::set<std::string> awaiting_reattach_;  // recovery: nodes whose agent has not come back
  std::set<std::string> replacing_nodes_;  // lost places whose new agent has not registered
  std::map<std::string, uint32_t> place_replacements_;
  // Deferred places reported lost before the rendezvous: replaced once it is done.
  std::set<std::string> deferred_lost_;
  bool recovery_started_ = false;
  std::vector<std::string> launched_roles_;
  // Horovod's gloo key-value store, for framework: horovod; null otherwise.
  std::unique_ptr<HorovodRendezvous> horovod_rendezvous_;
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
  mutable std::mutex mu_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
};

}  // namespace shoal::master
