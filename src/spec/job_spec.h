#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spec/job_section.h"

namespace shoal::spec {

enum class Framework { kNone, kPyTorch, kTensorFlow, kJax, kPaddle, kHorovod, kMpi };

struct Resources {
  double cpus = 1.0;            // may be fractional; whole cores are pinned when they fit
  uint64_t memory_bytes = 0;    // 0: no limit requested
  uint32_t gpus = 0;
};

// What happens when a task of a role ends badly (docs/fault-tolerance.md).
enum class OnFailure {
  kFailJob,       // the job fails (the default)
  kRestartTask,   // only that task is started again (roles that can rejoin: ps, evaluator)
  kRestartGroup,  // every task of the group is stopped and a new rendezvous starts them all
  kElastic,       // like restart-group, but the group shrinks to the survivors (>= min) and
                  // grows back towards max when capacity returns
};

// Which exits trigger `on_failure`'s action.
enum class RestartMode {
  kNever,      // none: any failure fails the job
  kOnFailure,  // a non-zero exit, a signal, a hang or a lost agent
  kAlways,     // also a clean exit (services such as an evaluator loop); restart-task only
};

const char* OnFailureName(OnFailure v);
const char* RestartModeName(RestartMode v);

struct Role {
  std::string name;
  uint32_t instances = 1;
  // Exactly one of these is set: an argv list, or a shell string run through /bin/sh -c.
  std::vector<std::string> argv;
  std::string shell;
  std::map<std::string, std::string> env;
  // The parser always fills it with an absolute path: `working_dir` resolved against the job
  // file's directory, or that directory itself. Empty only in specs built by hand, where it
  // means the job directory's task folder.
  std::string working_dir;
  Resources resources;
  bool untracked = false;       // stopped once the tracked roles finish; never decides outcome
  std::vector<std::string> depends_on;  // start only after these roles are all running

  // Failure handling, resolved by the parser: the role's own keys, else the job's, else the
  // defaults (fail-job; restart follows on_failure; max_restarts 3; no progress timeout).
  OnFailure on_failure = OnFailure::kFailJob;
  RestartMode restart = RestartMode::kNever;
  // restart-task: per task; restart-group and elastic: failures of the whole group.
  uint32_t max_restarts = 3;
  // A task that reported a step through the SDK and then reports none for this long is hung:
  // it is killed and handled as a failure. Zero: never.
  std::chrono::milliseconds progress_timeout{0};
  // Elastic roles only (`instances: {min, max}`): `instances` equals max_instances.
  uint32_t min_instances = 0;  // 0: not elastic
  uint32_t max_instances = 0;
  int line = 0;                 // line of the role's key in the job file, for messages
  int instances_line = 0;       // line of its `instances` key; 0 where it was not written

  // 1-based lines of the `resources` keys, so that checks made after parsing (CheckFitsMachine)
  // point at the key to edit. 0 where the key was not written; messages then use `line`.
  struct ResourceLines {
    int cpus = 0;
    int memory = 0;
    int gpus = 0;
  };
  ResourceLines resource_lines;
};

struct Backoff {
  // The n-th restart (1-based) waits min(max, initial * 2^(n-1)).
  std::chrono::milliseconds initial{1000};
  std::chrono::milliseconds max{30000};
};

struct HeartbeatConfig {
  std::chrono::milliseconds interval{1000};
  uint32_t misses = 3;  // an agent silent for interval * misses is lost
};

// Where tasks publish trained models for `shoal serve` (`publish:` in the job file): every task
// gets SHOAL_MODEL_REPOSITORY (and SHOAL_MODEL_KEEP), which shoal.publish_model reads.
struct PublishConfig {
  std::string repository;  // absolute (resolved against the job file), or hdfs://nn/path
  uint32_t keep = 0;       // newest versions kept per model after a publication; 0: all
  bool configured = false;
};

struct CheckpointConfig {
  // Absolute (resolved against the job file's directory). Empty: `checkpoints` under the job
  // directory, which a later run of the same file does not see.
  std::string dir;
  uint32_t keep = 3;  // complete checkpoints kept; older ones are pruned after each save
  bool configured = false;  // the job file has a `checkpoint` section
};

// A dataset handed out in shards, each leased to one worker at a time and completed exactly
// once per epoch. Exactly one of `files`, `samples` and `parquet` is set by the parser; for a
// Parquet dataset `files` is filled from the listing fixed at submission (parquet_dataset.h).
struct DatasetConfig {
  std::vector<std::string> files;  // one shard per file, as written in the job file
  // A Parquet file or directory: an absolute local path or hdfs://namenode[:port]/path.
  std::string parquet;
  int parquet_line = 0;  // where the job file gives it, for the listing's messages
  uint64_t samples = 0;            // index ranges [0, samples) cut into shard_size pieces
  uint64_t shard_size = 0;
  uint32_t epochs = 1;
  std::chrono::milliseconds lease_timeout{60000};
  bool configured = false;

  uint64_t NumShards() const {
    if (!files.empty()) return files.size();
    return shard_size == 0 ? 0 : (samples + shard_size - 1) / shard_size;
  }
};

// A TensorBoard beside the job (`tensorboard:` in the job file), started by the master for the
// job's life and never part of its outcome.
struct TensorBoardConfig {
  bool configured = false;
  std::string logdir;                // absolute; empty: <job dir>/tensorboard
  std::vector<std::string> command;  // empty: Shoal's default TensorBoard (docs/tensorboard.md)
};

// An MPI job (`framework: mpi`, `mpi:` in the job file): the `launcher` role runs mpirun against
// a hostfile of the `worker` tasks, each of which hosts this many ranks (docs/frameworks.md).
struct MpiConfig {
  uint32_t slots_per_worker = 1;
};

struct JobSpec {
  std::string name;
  Framework framework = Framework::kNone;
  // Roles in the order they appear in the file.
  std::vector<Role> roles;
  // Roles whose tasks must all exit 0 for the job to succeed. Filled by the parser: the
  // `success.roles` list, else {"chief"} when a chief role exists, else every tracked role.
  std::vector<std::string> success_roles;
  std::string source_path;      // the file it was read from

  // Job-wide failure handling; roles inherit on_failure, restart, max_restarts and
  // progress_timeout from here unless they set their own.
  OnFailure on_failure = OnFailure::kFailJob;
  Backoff backoff;
  HeartbeatConfig heartbeat;
  CheckpointConfig checkpoint;
  DatasetConfig dataset;
  // The sections the parser read for their owners (a backend's `slurm:`), by their key; the
  // owner finds its typed value with Section<T>(). Only sections written in the file are here.
  std::map<std::string, std::shared_ptr<const SectionValue>> sections;
  TensorBoardConfig tensorboard;
  PublishConfig publish;
  MpiConfig mpi;

  const Role* FindRole(const std::string& name) const;
  // The value of section `name` when it was written and is a T; else nullptr.
  template <typename T>
  const T* Section(const std::string& name) const {
    auto it = sections.find(name);
    return it == sections.end() ? nullptr : dynamic_cast<const T*>(it->second.get());
  }
  uint32_t TotalTasks() const;
};

const char* FrameworkName(Framework f);

}  // namespace shoal::spec
