// The master's handling of what agents report about tasks (started, exited, stalled, their
// SDK steps) and of stopping one. Part of class Master (master.h), on its loop.
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "master/master.h"
#include "shoal/v1/shoal.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {
namespace {

// " (memory: 2GiB)" for a role with a memory limit, "" otherwise.
std::string MemoryLimitText(const spec::JobSpec& spec, const std::string& role) {
  const spec::Role* r = spec.FindRole(role);
  if (r == nullptr || r->resources.memory_bytes == 0) return "";
  return absl::StrCat(" (memory: ", FormatByteSize(r->resources.memory_bytes), ")");
}

}  // namespace

void Master::OnTaskStarted(const v1::AgentMessage& message) {
  const auto& m = message.task_started();
  TaskRecord* rec = job_.tasks.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt()) return;
  rec->pid = m.pid();
  Transition(*rec, TaskState::kRunning);
  if (job_.tasks.AllStarted() && job_.phase == JobPhase::kStarting) {
    SetPhase(JobPhase::kRunning, "");
  }
  LaunchReadyRoles();
}

void Master::OnTaskExited(const v1::AgentMessage& message, bool settled) {
  const auto& m = message.task_exited();
  TaskRecord* rec = job_.tasks.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt() || IsTerminal(rec->state)) return;
  bool signalled_from_outside = (m.signal() == SIGTERM || m.signal() == SIGKILL) &&
                                !m.stopped_by_agent() && m.error().empty() &&
                                rec->hung_reason.empty() && backend_->SignalsTasksFromOutside() &&
                                job_.phase != JobPhase::kStopping;
  // The resource manager signals the tasks of a cancelled allocation or of a node it took down
  // along with their agents (Slurm sends SIGTERM, or SIGKILL at once for a node gone down, in
  // no fixed order). Wait for the backend to say so (the job then ends as cancelled) before
  // this counts as a failure of the task; and while the task's agent is going or gone, for its
  // disconnection, which reports every task of the place lost (looked at again in case the
  // agent comes back).
  auto agent_going = [&] {
    AgentSession* session = agents_.ForNode(rec->node);
    return session == nullptr || !session->leaving.empty();
  };
  if (signalled_from_outside && (!settled || agent_going())) {
    loop_.PostAfter(backend_->OutsideStopSettle(),
                    [this, message] { OnTaskExited(message, /*settled=*/true); });
    return;
  }
  // Whatever partial line the task left goes out too, so its last words are not lost.
  publisher_->logs().FinishTask(rec->Key());
  rec->exit_code = m.exit_code();
  rec->signal = m.signal();
  if (!m.error().empty()) {
    restarts_.HandleTaskFailure(*rec, absl::StrCat("could not start: ", m.error()));
  } else if (!rec->hung_reason.empty()) {
    restarts_.HandleTaskFailure(*rec, rec->hung_reason);
  } else if (m.stopped_by_agent()) {
    Transition(*rec, TaskState::kKilled, rec->reason.empty() ? "stopped by Shoal" : rec->reason);
  } else if (m.signal() == 0 && m.exit_code() == 0) {
    restarts_.HandleCleanExit(*rec);
  } else if (m.oom_killed()) {
    // The final line must say why, not only the signal (the notice before it already does).
    restarts_.HandleTaskFailure(*rec, absl::StrCat(DescribeExit(m.exit_code(), m.signal()),
                                                   " for exceeding its memory limit",
                                                   MemoryLimitText(options_.spec, rec->role)));
  } else {
    restarts_.HandleTaskFailure(*rec, DescribeExit(m.exit_code(), m.signal()));
  }
  EvaluateOutcome();
  restarts_.MaybeRelaunchGroup();
  MaybeFinish();
}

void Master::DrainProgress() {
  std::vector<std::tuple<const std::pair<std::string, uint32_t>*, uint32_t, uint64_t>> batch;
  {
    std::lock_guard<std::mutex> lock(progress_mu_);
    progress_drain_scheduled_ = false;
    for (auto& [key, entry] : pending_progress_) {
      if (!entry.fresh) continue;
      entry.fresh = false;
      // Map nodes are never erased, so the key stays valid after the lock is released.
      batch.emplace_back(&key, entry.attempt, entry.step);
    }
  }
  for (const auto& [key, attempt, step] : batch) {
    TaskRecord* rec = job_.tasks.Find(key->first, key->second);
    if (rec == nullptr || rec->attempt != attempt) continue;
    if (rec->step == step) continue;
    rec->step = step;
    // Steps change every second in every task of a large job: they refresh the status at a
    // slow pace of their own, not as a state change would.
    publisher_->ProgressChanged();
    if (job_.shards) job_.shards->Progress(rec->Key(), options_.clock->Now());
  }
}

void Master::OnTaskStalled(const v1::AgentMessage& message) {
  const auto& m = message.stalled();
  TaskRecord* rec = job_.tasks.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt() || rec->state != TaskState::kRunning ||
      Ending()) {
    return;
  }
  rec->hung_reason = absl::StrFormat("hung: no progress for %.1fs after step %d",
                                     m.silent_ms() / 1000.0, m.last_step());
  Record(TaskHung{rec->Key(), rec->attempt, m.last_step(), m.silent_ms()});
  spdlog::warn("{} is {}; killing it", rec->Key(), rec->hung_reason);
  Notice(absl::StrCat(rec->Key(), " is ", rec->hung_reason, "; killing it"));
  // No grace: a hung process rarely handles SIGTERM, and every second it holds the group is lost.
  StopTask(*rec, std::chrono::milliseconds(0), rec->hung_reason);
}

void Master::StopTask(TaskRecord& task, std::chrono::milliseconds grace,
                      const std::string& reason) {
  if (task.state == TaskState::kPending) {
    Transition(task, TaskState::kKilled, reason);
    return;
  }
  if (IsTerminal(task.state)) return;
  task.reason = reason;
  AgentSession* s = agents_.ForNode(task.node);
  if (s == nullptr) {
    Transition(task, TaskState::kKilled, reason + "; its agent is gone");
    return;
  }
  v1::MasterMessage msg;
  auto* t = msg.mutable_stop()->add_tasks();
  t->set_role(task.role);
  t->set_index(task.index);
  t->set_attempt(task.attempt);
  msg.mutable_stop()->set_grace_ms(static_cast<uint32_t>(grace.count()));
  agents_.Send(*s, msg);
}

void Master::OnResourceSamples(const v1::AgentMessage& message) {
  for (const v1::TaskResources& t : message.resources().tasks()) {
    TaskRecord* rec = job_.tasks.Find(t.task().role(), t.task().index());
    if (rec == nullptr || rec->attempt != t.task().attempt()) continue;
    ResourceSample sample;
    sample.attempt = t.task().attempt();
    sample.ts_unix_ms = t.ts_unix_ms();
    sample.start_unix_ms = t.start_unix_ms();
    sample.cpu_seconds_total = t.cpu_seconds_total();
    sample.rss_bytes = t.rss_bytes();
    for (const auto& gpu : t.gpus()) {
      sample.gpus.push_back({gpu.index(), gpu.util_percent(), gpu.memory_bytes()});
    }
    resource_logs_->Add(absl::StrCat(rec->role, "-", rec->index), sample, rec->step);
  }
}

void Master::OnLogChunk(const v1::LogChunk& chunk, const std::string& node) {
  TaskRecord* rec = job_.tasks.Find(chunk.task().role(), chunk.task().index());
  if (rec == nullptr) return;
  // Watchers read the lines from logs.txt once the batch's flush commits them.
  publisher_->logs().Append(
      {rec->Key(), chunk.task().attempt(), chunk.stream() == v1::LogChunk::STREAM_STDERR},
      absl::StrCat(rec->role, "-", rec->index), chunk.offset(), chunk.data(), node);
}

void Master::TellAgentsWhatOutputIsCommitted() {
  const Clock::TimePoint now = options_.clock->Now();
  if (output_acked_at_ && now - *output_acked_at_ < kOutputAckInterval) return;  // kept for later
  output_acked_at_ = now;
  std::map<std::string, v1::MasterMessage> by_node;
  for (const CommittedOutput& c : publisher_->logs().TakeCommitted()) {
    auto* p = by_node[c.source].mutable_logs_committed()->add_positions();
    auto [role, index] = SplitTaskKey(c.stream.task);
    p->mutable_task()->set_role(role);
    p->mutable_task()->set_index(index);
    p->mutable_task()->set_attempt(c.stream.attempt);
    p->set_stream(c.stream.is_stderr ? v1::LogChunk::STREAM_STDERR : v1::LogChunk::STREAM_STDOUT);
    p->set_offset(c.offset);
  }
  if (by_node.empty()) return;
  for (auto& [node, message] : by_node) {
    if (AgentSession* s = agents_.ForNode(node)) agents_.Send(*s, message);
  }
  agents_.Flush();
}

}  // namespace shoal::master
