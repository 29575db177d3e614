#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "backends/backend_provider.h"
#include "backends/yarn/yarn_request.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// The YARN backend's flags (--yarn-rm, --queue, --node-label), its `yarn:` job-file section, its
// checks before a job starts (the ResourceManager, the AM jar, HDFS staging) and its factory
// (docs/backends/yarn.md).
class YarnProvider final : public BackendProvider {
 public:
  std::string Name() const override { return "yarn"; }
  std::vector<RunFlag> Flags() const override;
  std::optional<spec::JobSection> JobSection() const override;
  absl::StatusOr<Preflight> Check(const PreflightRequest& request) const override;
  absl::StatusOr<CreatedBackend> Create(const BackendContext& context) const override;
};

// The job's queue and node label: its `yarn:` section, overridden by the given --queue and
// --node-label, checked with the section's rules. InvalidArgument naming each bad flag, one per
// line: "invalid flag: --queue: must be a YARN queue name ...".
absl::StatusOr<YarnRequest> YarnFlagRequest(const spec::JobSpec& job,
                                            const std::map<std::string, std::string>& flags);

}  // namespace shoal::backends
