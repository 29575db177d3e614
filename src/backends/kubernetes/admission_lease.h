#pragma once

// The lock that serializes Shoal's gang admissions in a namespace: a coordination.k8s.io Lease
// taken with the API server's optimistic concurrency (create, or replace an expired one at its
// resourceVersion), so two masters never both hold it. Whoever holds it may un-gate a gang's
// pods; a holder that dies loses it when its lease expires.

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::backends {

class KubeClient;

class AdmissionLease {
 public:
  // `holder`: this master (its job id); `duration`: how long a holder that stopped renewing
  // keeps it, which bounds how long a dead master can block the others.
  AdmissionLease(KubeClient& client, std::string ns, std::string name, std::string holder,
                 std::chrono::seconds duration);

  // True when this holder has the lease now (taken, or held already: renewed); false when
  // another live holder has it. Errors: the API server's (e.g. PermissionDenied).
  absl::StatusOr<bool> TryAcquire();
  // Gives it up, if held (best effort: an error leaves it to expire).
  void Release();
  // Who holds it now ("" when nobody), for messages.
  std::string last_holder() const { return last_holder_; }

 private:
  std::string Path() const;

  KubeClient& client_;
  std::string ns_;
  std::string name_;
  std::string holder_;
  std::chrono::seconds duration_;
  bool held_ = false;
  std::string last_holder_;
};

}  // namespace shoal::backends
