#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "common/port_range.h"
#include "nlohmann/json.hpp"
#include "spec/job_section.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// A command-line flag of `shoal run` and `shoal submit` that only one backend takes, e.g.
// --partition. Given to any other backend, it is refused before anything starts.
struct RunFlag {
  std::string name;  // with its dashes: "--partition"; unique across the registry
  std::string help;  // for --help
};

// What `shoal run` knows when it asks a backend whether the job can run there.
struct PreflightRequest {
  const spec::JobSpec* job = nullptr;  // validated; outlives the call
  // This backend's flags that were given (by RunFlag::name), with their values as typed.
  std::map<std::string, std::string> flags;
  std::string listen_host;              // --listen; empty: not given
  std::optional<uint32_t> fake_gpus;    // --fake-gpus
  std::optional<PortRange> task_ports;  // SHOAL_TASK_PORTS, already checked
};

// What the preflight settled, for the master.
struct Preflight {
  // Everything the backend's factory needs beyond the job file (flags resolved against the
  // job's section, addresses the cluster gave): stored in the job's submit.json under the
  // backend's name when not empty, and handed back to CreateBackend as `settings`.
  nlohmann::json settings = nlohmann::json::object();
  // Where the master listens (agents dial it); empty: 127.0.0.1.
  std::string listen_host;
};

// What the master (`shoal master`, cli/daemons.cc) knows when it builds the job's backend.
struct BackendContext {
  const spec::JobSpec* job = nullptr;
  std::string job_dir;
  const nlohmann::json* submit = nullptr;    // the job's whole submit.json
  const nlohmann::json* settings = nullptr;  // Preflight::settings as stored (an empty object)
  std::string listen_host;                   // from submit.json; empty: the backend's choice
};

struct CreatedBackend {
  std::unique_ptr<Backend> backend;
  std::string listen_host;  // where the master listens; empty: 127.0.0.1
};

// Everything one backend contributes outside the master's Backend interface: its name, its
// flags, its job-file section, the checks `shoal run` makes before anything exists, and the
// factory the master calls. One per backend folder (backends/<name>/<name>_provider.h); only
// the composition root (cli/backends_registry.cc) names them. Stateless: every method may be
// called from any thread, and more than once.
class BackendProvider {
 public:
  virtual ~BackendProvider() = default;

  // `--backend <name>`, submit.json's "backend", and Backend::Name().
  virtual std::string Name() const = 0;
  // The flags only this backend takes, in --help order.
  virtual std::vector<RunFlag> Flags() const { return {}; }
  // The backend's top-level job-file section, e.g. `slurm:`, if it has one. It is read in every
  // job file whichever backend runs it, so that a job file is valid or not by itself.
  virtual std::optional<spec::JobSection> JobSection() const { return std::nullopt; }

  // `shoal run`'s checks before anything exists: the flags (with the job file's rules for the
  // same keys), whether the job can ever run there, whether the cluster answers. An error means
  // a usage error (exit 2): its message is printed after "shoal: " as it is, so it names the
  // flag, key (file:line: key) or setting that is wrong.
  virtual absl::StatusOr<Preflight> Check(const PreflightRequest& request) const = 0;

  // Builds the job's backend in its master from what Check settled. An error is printed as it
  // is, and the master exits 2.
  virtual absl::StatusOr<CreatedBackend> Create(const BackendContext& context) const = 0;
};

}  // namespace shoal::backends
