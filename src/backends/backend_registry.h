#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "backends/backend_provider.h"
#include "spec/job_section.h"

namespace shoal::backends {

// The backends a `shoal` binary offers, by name, in the order they were added (the order of
// --help and of messages listing them). Built once by the composition root
// (cli/backends_registry.cc) and read-only after that.
class BackendRegistry {
 public:
  // Refuses a provider whose name, flag or section key is taken already: InvalidArgument.
  absl::Status Add(std::unique_ptr<BackendProvider> provider);

  // nullptr when no backend has that name.
  const BackendProvider* Find(const std::string& name) const;
  std::vector<std::string> Names() const;
  // "local, slurm or yarn"; with `default_name`, "local (default), slurm or yarn".
  std::string NamesForMessages(const std::string& default_name = "") const;
  const std::vector<std::unique_ptr<BackendProvider>>& providers() const { return providers_; }
  // Every backend's job-file section, for the job-file parser (spec::ParseJobSpec).
  const spec::JobSections& JobSections() const { return sections_; }

 private:
  std::vector<std::unique_ptr<BackendProvider>> providers_;
  spec::JobSections sections_;
};

}  // namespace shoal::backends
