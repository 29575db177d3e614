#include "serve/repository/version_settle_filter.h"

#include <set>

namespace shoal::serve {

RepositoryScan VersionSettleFilter::Settled(const RepositoryScan& scan) {
  Clock::TimePoint now = clock_->Now();
  RepositoryScan settled;
  settled.ignored = scan.ignored;
  std::set<std::pair<std::string, int64_t>> present;
  for (const ModelEntry& model : scan.models) {
    ModelEntry kept = model;
    kept.versions.clear();
    for (const VersionEntry& version : model.versions) {
      auto key = std::make_pair(model.name, version.version);
      present.insert(key);
      auto [it, inserted] = seen_.try_emplace(key, Seen{version.fingerprint, now});
      if (!inserted && it->second.fingerprint != version.fingerprint) {
        it->second = Seen{version.fingerprint, now};
      }
      if (version.marked_complete || now - it->second.since >= settle_) {
        kept.versions.push_back(version);
      }
    }
    settled.models.push_back(std::move(kept));
  }
  for (auto it = seen_.begin(); it != seen_.end();) {
    it = present.count(it->first) ? std::next(it) : seen_.erase(it);
  }
  return settled;
}

void VersionSettleFilter::AcceptAll(const RepositoryScan& scan) {
  Clock::TimePoint settled_since = clock_->Now() - settle_;
  for (const ModelEntry& model : scan.models) {
    for (const VersionEntry& version : model.versions) {
      seen_[{model.name, version.version}] = Seen{version.fingerprint, settled_since};
    }
  }
}

}  // namespace shoal::serve
