#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend_provider.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// The Spark backend's flag (--spark-master), its `spark:` job-file section, its checks before a
// job starts (the master URL, a Python with PySpark, a standalone master that answers) and its
// factory (docs/backends/spark.md).
class SparkProvider final : public BackendProvider {
 public:
  std::string Name() const override { return "spark"; }
  std::vector<RunFlag> Flags() const override;
  std::optional<spec::JobSection> JobSection() const override;
  absl::StatusOr<Preflight> Check(const PreflightRequest& request) const override;
  absl::StatusOr<CreatedBackend> Create(const BackendContext& context) const override;
};

// The Spark master the job runs on: --spark-master, else the job file's spark.master, else
// SHOAL_SPARK_MASTER; checked with the section's rule. InvalidArgument naming the flag or the
// variable when it is malformed or nothing gives one.
absl::StatusOr<std::string> SparkMasterFor(const spec::JobSpec& job,
                                           const std::map<std::string, std::string>& flags);

// The Python that runs the driver: SHOAL_SPARK_PYTHON, else the one this build was configured
// with (the `spark` venv of setup.sh).
std::string SparkPython();

}  // namespace shoal::backends
