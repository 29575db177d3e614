#include "master/admission.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::master {

void Admission::TryAdmit() {
  if (job_->phase != JobPhase::kQueued) return;
  auto grants = backend_->Acquire(job_->spec, options_.job_id);
  if (!grants.ok()) {
    if (absl::IsUnavailable(grants.status())) {
      std::string why(grants.status().message());
      if (why != job_->phase_reason) {
        host_->Record(Queued{why});
        host_->SetPhase(JobPhase::kQueued, why);
      }
      host_->PostAfter(options_.retry, [this] { TryAdmit(); });
      return;
    }
    std::string why = absl::StrCat("cannot be admitted: ", grants.status().message());
    host_->Record(AdmissionRefused{why});
    host_->BeginStopping(JobPhase::kFailed, why);
    return;
  }
  auto placement = PlaceTasks(job_->spec, job_->tasks.tasks(), *grants);
  if (!placement.ok()) {
    host_->BeginStopping(JobPhase::kFailed, std::string(placement.status().message()));
    return;
  }
  placement_ = *placement;
  host_->Record(Admitted{backend_->Name(), *grants});
  host_->SetPhase(JobPhase::kStarting, "waiting for agents to register");

  if (auto st = backend_->StartAgents(host_->AgentStartOptions()); !st.ok()) {
    host_->BeginStopping(JobPhase::kFailed, absl::StrCat("cannot start agents: ", st.message()));
    return;
  }
  ArmRegisterTimer();
  host_->AgentsStarted();
}

void Admission::ArmRegisterTimer() {
  host_->CancelTimer(register_timer_);
  register_timer_ = host_->PostAfter(options_.register_timeout, [this] {
    if (job_->rendezvous_done || host_->Ending()) return;
    // A few names and a count: a reason that named each of a thousand places would be
    // kilobytes in every journal record, status and message that carries it.
    constexpr int kNamed = 10;
    std::string missing;
    int count = 0;
    for (const auto& g : job_->grants) {
      if (host_->Registered(g.name) || job_->deferred_places.count(g.name) > 0) continue;
      if (++count <= kNamed) missing += (missing.empty() ? "" : ", ") + g.name;
    }
    if (count > kNamed) absl::StrAppend(&missing, " and ", count - kNamed, " more");
    host_->BeginStopping(JobPhase::kFailed,
                         absl::StrFormat("agents on %s did not register within %.1fs", missing,
                                         options_.register_timeout.count() / 1000.0));
  });
}

void Admission::CancelRegisterTimer() { host_->CancelTimer(register_timer_); }

void Admission::ArmReattachTimer(std::function<void()> on_timeout) {
  register_timer_ = host_->PostAfter(options_.register_timeout, std::move(on_timeout));
}

absl::Status Admission::PlaceAgain() {
  auto placement = PlaceTasks(job_->spec, job_->tasks.tasks(), job_->grants);
  if (!placement.ok()) return placement.status();
  placement_ = *placement;
  return absl::OkStatus();
}

const backends::NodeGrant* Admission::GrantFor(const std::string& node) const {
  for (const auto& g : job_->grants) {
    if (g.name == node) return &g;
  }
  return nullptr;
}

void Admission::OnAllocationEvent(const backends::Backend::AllocationEvent& event) {
  using Kind = backends::Backend::AllocationEvent::Kind;
  if (host_->Ending()) return;
  switch (event.kind) {
    case Kind::kQueued:
      // The scheduler holds the job back: no agent can register until it runs, however long
      // that takes, so the registration deadline waits too.
      if (job_->rendezvous_done) return;
      CancelRegisterTimer();
      host_->Record(Queued{event.reason});
      host_->SetPhase(JobPhase::kQueued, event.reason);
      break;
    case Kind::kAllocated:
      if (job_->rendezvous_done) return;
      // A backend that held the places from Acquire on may still name deferred ones.
      if (job_->phase != JobPhase::kQueued && event.deferred.empty()) return;
      host_->Record(Allocated{backend_->Name(), event.deferred});
      if (job_->phase == JobPhase::kQueued) {
        host_->SetPhase(JobPhase::kStarting, "waiting for agents to register");
        ArmRegisterTimer();
      }
      if (!event.deferred.empty()) host_->RendezvousMayComplete();
      break;
    case Kind::kRefused: {
      std::string why = absl::StrCat("cannot be admitted: ", event.reason);
      host_->Record(AdmissionRefused{why});
      host_->BeginStopping(JobPhase::kFailed, why);
      break;
    }
    case Kind::kCancelled:
      host_->Record(CancelledOutside{event.reason});
      host_->BeginStopping(JobPhase::kKilled, event.reason);
      break;
  }
}

}  // namespace shoal::master
