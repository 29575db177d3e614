#include "backends/kubernetes/admission_lease.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/kubernetes/kube_client.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {
namespace {

// The MicroTime format of Lease's acquireTime and renewTime.
std::string MicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

std::optional<absl::Time> ParseMicroTime(const std::string& text) {
  absl::Time t;
  std::string error;
  if (absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", text, absl::UTCTimeZone(), &t, &error)) return t;
  return std::nullopt;
}

}  // namespace

AdmissionLease::AdmissionLease(KubeClient& client, std::string ns, std::string name,
                               std::string holder, std::chrono::seconds duration)
    : client_(client),
      ns_(std::move(ns)),
      name_(std::move(name)),
      holder_(std::move(holder)),
      duration_(duration) {}

std::string AdmissionLease::Path() const {
  return absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/", ns_, "/leases");
}

absl::StatusOr<bool> AdmissionLease::TryAcquire() {
  const std::string now = MicroTime(absl::Now());
  nlohmann::json spec = {{"holderIdentity", holder_},
                         {"leaseDurationSeconds", duration_.count()},
                         {"acquireTime", now},
                         {"renewTime", now}};
  auto created = client_.Create(Path(), {{"apiVersion", "coordination.k8s.io/v1"},
                                         {"kind", "Lease"},
                                         {"metadata", {{"name", name_}, {"namespace", ns_}}},
                                         {"spec", spec}});
  if (created.ok()) {
    held_ = true;
    last_holder_ = holder_;
    return true;
  }
  if (created.status().code() != absl::StatusCode::kAlreadyExists) return created.status();
  auto lease = client_.Get(absl::StrCat(Path(), "/", name_));
  if (!lease.ok()) return lease.status();
  const nlohmann::json current = lease->value("spec", nlohmann::json::object());
  std::string holder = current.value("holderIdentity", "");
  int64_t seconds = current.value("leaseDurationSeconds", 0);
  std::optional<absl::Time> renewed = ParseMicroTime(current.value("renewTime", ""));
  bool expired = !renewed || *renewed + absl::Seconds(seconds) < absl::Now();
  last_holder_ = holder;
  if (!holder.empty() && holder != holder_ && !expired) return false;
  // Free, expired, or ours: take it at the version read; a concurrent taker makes this a
  // conflict (Aborted), and then it is theirs.
  nlohmann::json replacement = *lease;
  if (holder == holder_) spec["acquireTime"] = current.value("acquireTime", now);
  replacement["spec"] = spec;
  auto replaced = client_.Replace(absl::StrCat(Path(), "/", name_), replacement);
  if (replaced.ok()) {
    held_ = true;
    last_holder_ = holder_;
    return true;
  }
  if (replaced.status().code() == absl::StatusCode::kAborted) return false;
  return replaced.status();
}

void AdmissionLease::Release() {
  if (!held_) return;
  held_ = false;
  auto lease = client_.Get(absl::StrCat(Path(), "/", name_));
  if (!lease.ok()) return;
  if ((*lease)["spec"].value("holderIdentity", "") != holder_) return;
  // Deleted at the version read: a lease taken over meanwhile (ours had expired) stays.
  std::string version = (*lease)["metadata"].value("resourceVersion", "");
  (void)client_.Delete(absl::StrCat(Path(), "/", name_),
                       nlohmann::json{{"preconditions", {{"resourceVersion", version}}}});
}

}  // namespace shoal::backends
