#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/clock.h"
#include "serve/repository/model_repository.h"

namespace shoal::serve {

// The repository watcher's rule for "this version directory is completely copied": its
// fingerprint (every file's name, size and modification time) has stayed the same for the
// settle time. A copy in progress keeps changing sizes and times; a version published by a
// rename (docs/serving.md) is settled one settle time after it appears, or at once when it
// holds kVersionCompleteMarker (its publisher promises it was renamed in whole). A version that is
// settled yet still broken (a truncated model.pt) fails to load and is refused; it is tried
// again once its fingerprint changes. Not thread-safe: the watcher's thread owns it.
class VersionSettleFilter {
 public:
  // `clock` must outlive the filter. A `settle` of zero lets every version through at once.
  VersionSettleFilter(const Clock* clock, Clock::Duration settle)
      : clock_(clock), settle_(settle) {}

  // `scan` with only the versions that are settled at the clock's now; remembers the others'
  // fingerprints to compare with the next scan, and forgets versions no longer on disk.
  // Models are kept even when none of their versions is settled.
  RepositoryScan Settled(const RepositoryScan& scan);

  // Takes every version of `scan` as settled from now on: the startup scan, which is loaded
  // without waiting, must not be waited for again.
  void AcceptAll(const RepositoryScan& scan);

 private:
  struct Seen {
    std::string fingerprint;
    Clock::TimePoint since;  // when this fingerprint was first seen
  };
  const Clock* const clock_;
  const Clock::Duration settle_;
  std::map<std::pair<std::string, int64_t>, Seen> seen_;  // (model, version)
};

}  // namespace shoal::serve
