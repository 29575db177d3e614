// The Kubernetes backend's gang admission (docs/design/0013, "Gang admission"): the lease,
// whether the gang fits, releasing its pods to the scheduler and waiting until they are bound.
// Part of class KubernetesBackend (kubernetes_backend.h); runs on its commander thread, and in
// StartAgents before that thread starts.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/kubernetes/admission_lease.h"
#include "backends/kubernetes/gang_fit.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kubernetes_backend.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace shoal::backends {

namespace {
using Ms = std::chrono::milliseconds;
}  // namespace

void KubernetesBackend::Queue(const std::string& reason) {
  AllocationEventCallback on_event;
  {
    absl::MutexLock lock(&mu_);
    if (gang_ || refused_ || reason == last_queued_reason_) return;
    last_queued_reason_ = reason;
    on_event = on_event_;
  }
  spdlog::info("job {} is queued: {}", job_id_, reason);
  if (on_event) on_event({AllocationEvent::kQueued, reason});
}

absl::StatusOr<bool> KubernetesBackend::TakeLease() {
  if (lease_ == nullptr) {
    lease_ = std::make_unique<AdmissionLease>(*client_, options_.ns, options_.admission_lease,
                                              job_id_, options_.admission_lease_duration);
  }
  absl::StatusOr<bool> held = lease_unavailable_ ? true : lease_->TryAcquire();
  if (!held.ok() && held.status().code() == absl::StatusCode::kPermissionDenied) {
    // Admission still checks the room and releases the gang whole; only racing admissions of
    // other jobs are no longer kept apart (the take-back after the timeout still bounds them).
    lease_unavailable_ = true;
    spdlog::warn("may not use the admission lease {} in namespace {} ({}): admitting without "
                 "it", options_.admission_lease, options_.ns, std::string(held.status().message()));
    held = true;
  }
  return held;
}

void KubernetesBackend::ReleaseLease() {
  if (lease_ != nullptr && !lease_unavailable_) lease_->Release();
}

absl::StatusOr<size_t> KubernetesBackend::FitNow(const std::vector<nlohmann::json>& required,
                                                 const std::vector<nlohmann::json>& optional) {
  // Without the right to read nodes and every pod (cluster-scoped), the scheduler alone
  // decides, pod by pod, and all are released.
  if (fit_unavailable_) return optional.size();
  auto nodes = client_->Get("/api/v1/nodes");
  auto bound = client_->Get(
      "/api/v1/pods?fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2C"
      "status.phase%21%3DFailed");
  if (!nodes.ok() || !bound.ok()) {
    absl::Status st = nodes.ok() ? bound.status() : nodes.status();
    if (st.code() != absl::StatusCode::kPermissionDenied) return st;
    fit_unavailable_ = true;
    spdlog::warn("cannot read the cluster's nodes and pods ({}): gang admission falls back to "
                 "the scheduler, which places pods one by one", std::string(st.message()));
    return optional.size();
  }
  std::vector<nlohmann::json> node_list((*nodes)["items"].begin(), (*nodes)["items"].end());
  std::vector<nlohmann::json> pod_list((*bound)["items"].begin(), (*bound)["items"].end());
  auto fit_with = [&](size_t count) {
    std::vector<nlohmann::json> gang = required;
    gang.insert(gang.end(), optional.begin(), optional.begin() + count);
    return FitGang(node_list, pod_list, gang);
  };
  // The largest prefix of the optional pods that fits beside the required ones (fitting is
  // monotone in it, so a bisection finds it).
  size_t k = optional.size();
  if (fit_with(k).fits) return k;
  GangFit base = fit_with(0);  // an empty gang always fits
  if (!base.fits) return absl::UnavailableError(base.reason);
  size_t lo = 0;  // fits
  size_t hi = k;  // does not
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    (fit_with(mid).fits ? lo : hi) = mid;
  }
  // Not even one of them, and nothing else: say why.
  if (lo == 0 && required.empty()) return absl::UnavailableError(fit_with(1).reason);
  return lo;
}

std::vector<std::string> KubernetesBackend::AdmitBeforeCreating() {
  absl::StatusOr<bool> held = TakeLease();
  if (!held.ok() || !*held) return {};  // the commander's admission says why
  std::vector<std::string> required;
  std::vector<std::string> optional;
  std::vector<nlohmann::json> required_pods;
  std::vector<nlohmann::json> optional_pods;
  std::vector<std::pair<std::string, bool>> places;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, place] : places_) places.emplace_back(name, place.optional);
  }
  for (const auto& [name, is_optional] : places) {
    auto pod = PodManifest(name, 0);
    if (!pod.ok()) {
      ReleaseLease();
      return {};
    }
    (is_optional ? optional : required).push_back(name);
    (is_optional ? optional_pods : required_pods).push_back(std::move(*pod));
  }
  absl::StatusOr<size_t> fit = FitNow(required_pods, optional_pods);
  if (!fit.ok()) {
    ReleaseLease();
    return {};
  }
  std::vector<std::string> admitted = required;
  admitted.insert(admitted.end(), optional.begin(), optional.begin() + *fit);
  absl::MutexLock lock(&mu_);
  for (const std::string& place : admitted) places_[place].admitted = true;
  gang_admitted_ = true;
  return admitted;
}

void KubernetesBackend::TryAdmit() {
  // The gang (the places that are not optional) is admitted whole or not at all, with as many
  // optional places as fit beside it; once it is, each waiting place (optional ones,
  // replacements) is admitted whenever it fits, as many as fit.
  std::vector<std::string> required;
  std::vector<std::string> optional;
  std::vector<nlohmann::json> required_pods;
  std::vector<nlohmann::json> optional_pods;
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    first = !gang_admitted_;
    for (const std::string& place : waiting_admission_) {
      bool is_optional = !first || places_[place].optional;
      (is_optional ? optional : required).push_back(place);
      (is_optional ? optional_pods : required_pods).push_back(manifests_[place]);
    }
  }
  if (required.empty() && optional.empty()) return;
  auto retry_later = [this] {
    absl::MutexLock lock(&mu_);
    // 1 s, 2 s, then every 2.5 s: capacity comes back when other jobs end.
    int n = std::min(admission_failures_++, 2);
    next_admission_ = std::chrono::steady_clock::now() +
                      std::min(Ms(1000) * (1 << n), Ms(2500));
  };
  // The job's first admission is its queue message; later ones (it runs meanwhile) are said in
  // the log, once per reason.
  auto queue = [&](const std::string& reason) {
    if (first) {
      Queue(reason);
    } else if (reason != last_wait_reason_) {
      last_wait_reason_ = reason;
      spdlog::info("{} pod(s) of job {} wait for room: {}", optional.size(), job_id_, reason);
    }
  };
  absl::StatusOr<bool> held = TakeLease();
  if (!held.ok()) {
    spdlog::warn("cannot take the admission lease {} in namespace {}: {}; retrying",
                 options_.admission_lease, options_.ns, held.status().ToString());
    retry_later();
    return;
  }
  if (!*held) {
    queue(absl::StrCat("waiting for job ", lease_->last_holder(),
                       ", which is being admitted (lease ", options_.admission_lease, ")"));
    retry_later();
    return;
  }
  absl::StatusOr<size_t> fit = FitNow(required_pods, optional_pods);
  if (!fit.ok()) {
    ReleaseLease();
    if (absl::IsUnavailable(fit.status())) {
      queue(std::string(fit.status().message()));
    } else {
      spdlog::warn("cannot read the cluster's capacity: {}; retrying", fit.status().ToString());
    }
    retry_later();
    return;
  }
  std::vector<std::string> places = required;
  places.insert(places.end(), optional.begin(), optional.begin() + *fit);
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& place : places) places_[place].admitted = true;
    gang_admitted_ = true;
  }
  // Admitted: every gate goes, then the scheduler binds them; the lease is kept until it has,
  // so the next admission counts them.
  for (const std::string& place : places) {
    std::string pod;
    {
      absl::MutexLock lock(&mu_);
      const Place& p = places_[place];
      pod = PodName(context_.job_object, p.role, p.index, p.attempt);
    }
    auto patched = client_->Patch(absl::StrCat(PodsPath(), "/", pod),
                                  nlohmann::json::array({{{"op", "remove"},
                                                          {"path", "/spec/schedulingGates"}}}),
                                  PatchType::kJson);
    if (!patched.ok() && patched.status().code() != absl::StatusCode::kNotFound) {
      spdlog::warn("cannot admit pod {}: {}", pod, patched.status().ToString());
    }
  }
  AwaitBound(places, first);
}

void KubernetesBackend::AwaitBound(const std::vector<std::string>& places, bool first) {
  bool bound_all = false;
  bool more_waiting = false;
  {
    absl::MutexLock lock(&mu_);
    waiting_admission_.erase(
        std::remove_if(waiting_admission_.begin(), waiting_admission_.end(),
                       [&](const std::string& p) {
                         return std::find(places.begin(), places.end(), p) != places.end();
                       }),
        waiting_admission_.end());
    auto all_bound = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stopping_) return true;
      for (const std::string& place : places) {
        if (!places_[place].scheduled && !places_[place].lost) return false;
      }
      return true;
    };
    bound_all = mu_.AwaitWithTimeout(absl::Condition(&all_bound),
                                     absl::FromChrono(options_.admission_timeout));
    admission_failures_ = 0;
    if (!bound_all && !stopping_) {
      // The scheduler disagreed (another workload took the room meanwhile): take the pods
      // back whole rather than hold part of the cluster, and admit them again later.
      for (const std::string& place : places) {
        Place& p = places_[place];
        deletions_.emplace_back(place, PodName(context_.job_object, p.role, p.index, p.attempt));
        p.attempt += 1;
        p.scheduled = false;
        p.running = false;
        p.admitted = false;
        creations_.push_back(place);
      }
      if (first) gang_admitted_ = false;
      next_admission_ = std::chrono::steady_clock::now() + Ms(2000);
    } else if (!waiting_admission_.empty()) {
      // Optional places that did not fit: tried again as capacity comes back.
      more_waiting = true;
      next_admission_ = std::chrono::steady_clock::now() + Ms(1000);
    }
  }
  ReleaseLease();
  if (bound_all) {
    spdlog::info("admitted {} pods of job {}{}", places.size(), job_id_,
                 more_waiting ? "; the others wait for room" : "");
    if (first) {
      Queue(absl::StrCat("admitted; ", places.size(),
                         " pods are starting (their images, then Shoal's agent)"));
    }
  } else {
    spdlog::warn("the scheduler did not bind all {} admitted pods of job {} within {} ms; "
                 "taking them back to admit them again",
                 places.size(), job_id_, options_.admission_timeout.count());
  }
}

}  // namespace shoal::backends
