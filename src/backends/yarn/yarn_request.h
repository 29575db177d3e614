#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// What the job asks of YARN beyond its roles' resources (`yarn:` in the job file, or flags).
struct YarnRequest {
  std::string queue;       // empty: the cluster's default queue
  std::string node_label;  // a node label expression for every container; empty: none
};

// Memory each container is given on top of its task's, for the Shoal agent that runs beside the
// task in the same container (YARN counts the whole process tree against the container).
constexpr uint64_t kAgentHeadroomMb = 128;
// A task that asks for no memory gets a container of this size (YARN has no "no limit").
constexpr uint64_t kDefaultTaskMemoryMb = 512;

// One place per Shoal task, named role.index, each to be served by its own container.
std::vector<NodeGrant> YarnPlaces(const spec::JobSpec& job);

// The container a task of `resources` runs in: its memory in MB (task + agent headroom) and
// whole vcores (a fractional cpus rounds up; YARN grants whole vcores).
uint64_t YarnContainerMemoryMb(const spec::Resources& resources);
uint32_t YarnContainerVcores(const spec::Resources& resources);

// `argv` as one /bin/sh command line for a NodeManager's launch script: each word single-quoted,
// except words holding a NodeManager expansion ({{PWD}}, {{JAVA_HOME}}), which the NodeManager
// turns into $PWD before the shell runs: those are double-quoted, so the shell expands them.
std::string YarnShellCommand(const std::vector<std::string>& argv);

// A file a container gets from HDFS: the NodeManager downloads `url` before the container
// starts and links it into the container's working directory as `name`. `size` and
// `timestamp` (the file's HDFS modification time, ms) must be the file's exactly: the
// NodeManager refuses a file that changed since it was registered.
struct YarnLocalResource {
  std::string name;
  std::string url;  // hdfs://namenode:port/path
  uint64_t size = 0;
  int64_t timestamp = 0;
};

// The application master's configuration (ShoalAppMaster's argument, before base64): one entry
// per place with its container size, node label and the agent's command line; the files every
// agent container gets (the `shoal` binary); and the HDFS directory those files were staged in,
// which the AM deletes when the application ends.
struct YarnAmPlace {
  std::string name;
  uint64_t memory_mb = 0;
  uint32_t vcores = 1;
  uint32_t gpus = 0;
  std::string node_label;
  std::string command;  // the shell command that runs the place's agent
};
std::string YarnAmConfigJson(const std::vector<YarnAmPlace>& places, uint64_t idle_timeout_ms,
                             const std::vector<YarnLocalResource>& agent_resources = {},
                             const std::string& staging_dir = "");

// The body of POST /ws/v1/cluster/apps that submits the application master.
struct YarnSubmission {
  std::string application_id;
  std::string name;
  std::string queue;
  std::string node_label;
  std::string am_command;   // the whole command line, log redirections included
  std::string am_key;       // SHOAL_AM_KEY in the AM's environment
  // CLASSPATH in the AM's environment (':'-separated; the NodeManager expands {{VAR}} and the
  // launch script's shell $VAR, as in yarn.application.classpath).
  std::string am_classpath;
  std::vector<YarnLocalResource> local_resources;  // the AM jar
  uint64_t am_memory_mb = 256;
  uint32_t am_vcores = 1;
};
std::string YarnSubmissionJson(const YarnSubmission& submission);

// YARN's default application classpath (yarn.application.classpath when a cluster sets none), in
// NodeManager expansions, as a stock Hadoop installation lays it out: the NodeManager's
// configuration directory, then Hadoop's common, hdfs and yarn jars.
std::string DefaultYarnAmClasspath();

// A yarn.application.classpath value (comma-separated, maybe across lines) as a classpath:
// entries trimmed, empty ones dropped, joined with ':'.
std::string YarnClasspathFromConfig(const std::string& value);

// When an application master that never registered failed because Java could not load a class
// (NoClassDefFoundError, ClassNotFoundException in YARN's diagnostics of the AM's container),
// the class; else nothing.
std::optional<std::string> AmMissingClass(const std::string& diagnostics);

// What to tell the user when the AM could not load `missing_class` with `classpath` (from
// `source`): what is wrong, and which setting fixes it.
std::string AmClasspathFailureMessage(const std::string& missing_class,
                                      const std::string& classpath, const std::string& source);

// "http://host:port" (a trailing slash dropped) or InvalidArgument naming what is wrong.
absl::StatusOr<std::string> NormalizeRmWebAddress(const std::string& address);

}  // namespace shoal::backends
