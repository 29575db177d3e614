#pragma once

// The job-file parser: one document into a JobSpec, every problem collected. Internal to spec/;
// its methods are defined by subject in job_file_parser.cc (the document, maps and scalars, the
// top level), role_parser.cc, failure_policy_parser.cc and job_sections_parser.cc.

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "spec/job_section.h"
#include "spec/job_spec.h"
#include "spec/parse_support.h"
#include "yaml-cpp/yaml.h"

namespace shoal::spec {

// The job file's own top-level keys; the sections read for their owners (JobSections) are
// listed between the two parts.
constexpr absl::string_view kTopKeysBeforeSections[] = {
    "name",         "framework",        "success", "roles",     "on_failure", "restart",
    "max_restarts", "progress_timeout", "backoff", "heartbeat", "checkpoint", "dataset"};
constexpr absl::string_view kTopKeysAfterSections[] = {"tensorboard", "publish", "mpi"};
constexpr absl::string_view kRoleKeys[] = {
    "instances",  "command",    "env",     "working_dir",  "resources",       "untracked",
    "depends_on", "on_failure", "restart", "max_restarts", "progress_timeout"};
constexpr absl::string_view kResourceKeys[] = {"cpus", "memory", "gpus"};
constexpr absl::string_view kSuccessKeys[] = {"roles"};
constexpr absl::string_view kInstancesKeys[] = {"min", "max"};
constexpr absl::string_view kBackoffKeys[] = {"initial", "max"};
constexpr absl::string_view kHeartbeatKeys[] = {"interval", "misses"};
constexpr absl::string_view kCheckpointKeys[] = {"dir", "keep"};
constexpr absl::string_view kTensorBoardKeys[] = {"logdir", "command"};
constexpr absl::string_view kPublishKeys[] = {"repository", "keep"};
constexpr absl::string_view kDatasetKeys[] = {"shards", "samples",       "shard_size",
                                              "epochs", "lease_timeout", "parquet"};
// In the order the messages list them; the names come from job_spec.cc.
constexpr OnFailure kOnFailureValues[] = {OnFailure::kFailJob, OnFailure::kRestartTask,
                                          OnFailure::kRestartGroup, OnFailure::kElastic};
constexpr RestartMode kRestartValues[] = {RestartMode::kNever, RestartMode::kOnFailure,
                                          RestartMode::kAlways};
constexpr absl::string_view kFrameworks[] = {"none",  "pytorch", "tensorflow", "jax",
                                             "paddle", "horovod", "mpi"};
constexpr absl::string_view kMpiKeys[] = {"slots_per_worker"};
// framework: mpi gives these role names their meaning (Kubeflow MPIJob's names).
constexpr char kMpiLauncher[] = "launcher";
constexpr char kMpiWorker[] = "worker";

// Bounds that keep totals far from integer overflow; no real job comes near them.
constexpr int64_t kMaxInstances = 100000;
constexpr int64_t kMaxGpusPerTask = 1024;
// max_restarts, heartbeat.misses, checkpoint.keep, dataset.epochs.
constexpr int64_t kMaxCount = 1000000;
constexpr int64_t kMaxSamples = std::numeric_limits<int64_t>::max();
// Agents cannot usefully report more often than this.
constexpr std::chrono::milliseconds kMinHeartbeatInterval{10};

// Merge keys resolved inside one another, and in all: bounds on anchors that merge themselves
// or chains of lists of aliases built to multiply the work.
constexpr int kMaxMergeDepth = 32;
constexpr int kMaxMerges = 10000;

constexpr char kDurationForm[] = "a duration such as 500ms, 30s or 2m";
constexpr char kCheckpointDirForm[] =
    "a directory path, absolute or relative to the job file, or a URI such as hdfs://nn/ckpt";

constexpr char kCommandForm[] =
    "a non-empty list of strings (argv), e.g. [python3, train.py], or a non-empty string run "
    "by /bin/sh -c";

// One `key: value` pair of a map, with the 1-based line of the key.
struct Entry {
  std::string key;
  YAML::Node key_node;
  YAML::Node value;
  int line = 0;
  // The value is, or lies inside, a value written elsewhere (an alias `*name`, or a map merged
  // with `<<`). yaml-cpp shares the anchored node, whose marks point at the anchor; messages
  // about anything inside must point at the use instead, which is `line`.
  bool aliased = false;
};

// A key that may be written at the job level, on a role, or both.
template <typename T>
struct Written {
  std::optional<T> value;  // set when written and valid
  int line = 0;            // 0: not written
  bool invalid() const { return line > 0 && !value.has_value(); }
};

// The failure-handling keys a role inherits from the job unless it writes its own.
struct FailureKeys {
  Written<OnFailure> on_failure;
  Written<RestartMode> restart;
  Written<uint32_t> max_restarts;
  Written<std::chrono::milliseconds> progress_timeout;
};

// Where cross-role checks point, kept beside each parsed role.
struct RoleSite {
  int depends_on_line = 0;
  std::vector<int> depends_on_item_lines;  // parallel to Role::depends_on
  FailureKeys failure;
  int instances_line = 0;
  bool instances_range = false;  // `instances` was written as {min, max}
};

// Parses one document into a JobSpec, collecting every problem instead of stopping at the first.
// Lives for one parse.
class JobFileParser {
 public:
  JobFileParser(std::string source, std::string base_dir, const JobSections& sections)
      : source_(std::move(source)), base_dir_(std::move(base_dir)), sections_(sections) {}
  absl::StatusOr<JobSpec> Parse(const std::string& text);

 private:
  // The SectionReader handed to an owner's parse function (job_sections_parser.cc).
  class OwnedSectionReader;

  struct Problem {
    int line;
    std::string text;
  };
  void Error(int line, absl::string_view key, absl::string_view message);

  absl::Status Refuse(const std::string& only);

  absl::Status Refuse();

  // A node's 1-based line; `fallback` for nulls, whose mark points past the key to the next
  // token, and for nodes without a mark.
  static int LineOf(const YAML::Node& node, int fallback);

  // Whether `value` is an alias of a node anchored earlier in the file: yaml-cpp hands out the
  // anchored node itself, so its mark lies before the key that uses it, which never happens to
  // a value written in place.
  static bool IsAliasUse(const YAML::Node& value, const YAML::Node& user);

  // The line for messages about `holder`'s value itself (rather than its key): the use when the
  // value is aliased, else where the value is written.
  static int ValueLine(const Entry& holder);

  // The line for messages about item `i` of the list `holder.value`: an aliased item (or any
  // item of an aliased list) is reported where the list is used.
  static int ItemLine(const Entry& holder, size_t i);

  // YAML 1.1's merge key: a plain `<<` (not a quoted "<<", which is an ordinary key).
  static bool IsMergeKey(const YAML::Node& key);

  // The pairs of the map `holder.value` in file order, with YAML 1.1 merge keys resolved: the
  // pairs of the map(s) named by `<<` take its place, except for keys the map writes itself
  // (those win wherever they stand) and, with a list `<<: [*a, *b]`, keys an earlier map of the
  // list gave already. Reports keys that are not plain text and keys given more than once
  // (yaml-cpp keeps both pairs); only the first of a repeated key is returned.
  std::vector<Entry> Entries(const Entry& holder, absl::string_view path, bool are_roles);

  // The pairs a merge key `<<` brings in, in precedence order, each reported at the `<<` line.
  std::vector<Entry> Merged(const Entry& merge, absl::string_view path, bool are_roles);

  // Reports keys outside `accepted`, with a hint when one is a likely misspelling.
  void CheckKnownKeys(const std::vector<Entry>& entries, absl::string_view path,
                      absl::Span<const absl::string_view> accepted);

  static const Entry* Find(const std::vector<Entry>& entries, absl::string_view key);

  // The scalar text of `e.value`, or nullopt after reporting that it must be `expected`.
  std::optional<std::string> Scalar(const Entry& e, absl::string_view key,
                                    absl::string_view expected);

  // An integer in [min, max] from `e.value`, or nullopt after reporting what was expected.
  std::optional<int64_t> Integer(const Entry& e, const std::string& key, int64_t min,
                                 int64_t max);

  // A duration (common/duration.h) from `e.value`, or nullopt after reporting.
  std::optional<std::chrono::milliseconds> Duration(const Entry& e, const std::string& key);

  // One of `values`, written as its name, or nullopt after reporting the accepted names.
  template <typename Enum, size_t N>
  std::optional<Enum> Choice(const Entry& e, const std::string& key, const Enum (&values)[N],
                             const char* (*name)(Enum)) {
    std::vector<absl::string_view> names;
    for (Enum v : values) names.push_back(name(v));
    std::string accepted = absl::StrJoin(names, ", ");
    if (!e.value.IsScalar()) {
      Error(e.line, key, absl::StrCat("must be one of ", accepted, ", got ", Describe(e.value)));
      return std::nullopt;
    }
    for (size_t i = 0; i < N; ++i) {
      if (e.value.Scalar() == names[i]) return values[i];
    }
    std::string hint;
    if (auto closest = Closest(e.value.Scalar(), names)) {
      hint = absl::StrCat(" did you mean '", *closest, "'?");
    }
    Error(e.line, key,
          absl::StrCat("unknown value ", Describe(e.value), ";", hint, " accepted values: ",
                       accepted));
    return std::nullopt;
  }

  // on_failure, restart, max_restarts and progress_timeout of the map at `path` ("" for the
  // job itself, "roles.<name>" for a role).
  void ParseFailureKeys(const std::vector<Entry>& entries, absl::string_view path,
                        FailureKeys& out);

  void ParseTop(const YAML::Node& root, JobSpec& spec);

  Role ParseRole(const Entry& r, RoleSite& site);

  // `instances: {min: 2, max: 4}`; whether the role may be elastic is checked once on_failure
  // is resolved (ResolveFailureHandling).
  void ParseInstancesRange(const Entry& e, const std::string& key, Role& role);

  void ParseBackoff(const Entry& e, Backoff& out);

  void ParseHeartbeat(const Entry& e, HeartbeatConfig& out);

  void ParseCheckpoint(const Entry& e, CheckpointConfig& out);
  void ParsePublish(const Entry& e, PublishConfig& out);

  void ParseMpi(const Entry& e, JobSpec& spec);

  // The shape of Kubeflow's MPIJob: one `launcher` that runs mpirun, and `worker` tasks that
  // only host ranks. The workers never end by themselves (untracked); the launcher starts once
  // they all run; an MPI world cannot change size, so neither role is elastic.
  void CheckMpiRoles(const Entry& roles_entry, std::vector<RoleSite>& sites, JobSpec& spec);

  void CheckMpiNotElastic(const JobSpec& spec);

  void ParseTensorBoard(const Entry& e, TensorBoardConfig& out);

  // A section read for its owner (`slurm:`): its parse function sees it through a SectionReader.
  void ParseOwnedSection(const Entry& e, const JobSection& section, JobSpec& spec);

  void ParseDataset(const Entry& e, DatasetConfig& out);

  void ParseShards(const Entry& e, const std::string& key, DatasetConfig& out);
  void ParseParquet(const Entry& e, const std::string& key, DatasetConfig& out);

  // Fills each role's failure handling from its own keys, else the job's, else the defaults, and
  // refuses combinations that cannot work. REQUIRES: ParseSuccess has run, since restart: always
  // depends on which roles decide success.
  void ResolveFailureHandling(const FailureKeys& job, const std::vector<RoleSite>& sites,
                              JobSpec& spec);

  // Refuses `restart` values that `on_failure` cannot honour. `origin` says where on_failure
  // was set when that is not beside the restart key, e.g. " (set on the job, line 2)".
  void CheckRestart(RestartMode restart, int line, const std::string& key, OnFailure on_failure,
                    absl::string_view origin);

  static bool DecidesSuccess(const JobSpec& spec, const std::string& role);

  // One argument of a task's command: no NUL, and within the kernel's limit for one string.
  bool CheckArgument(int line, const std::string& key, const std::string& text);

  void ParseCommand(const Entry& e, const std::string& key, Role& role);

  // Refuses a role whose env and command together would not fit what exec takes (ARG_MAX),
  // leaving kShoalEnvAllowance for what Shoal adds; reported at env, or at command without one.
  void CheckExecSize(const Entry* env, const Entry* command, const std::string& path,
                     const Role& role);

  void ParseEnv(const Entry& e, const std::string& key, Role& role);

  void ParseResources(const Entry& e, const std::string& path, Role& role);

  // Unknown names, self-dependencies and cycles among depends_on lists.
  void CheckDependencies(const JobSpec& spec, const std::vector<RoleSite>& sites);

  void ReportCycle(const JobSpec& spec, const std::vector<RoleSite>& sites,
                   std::vector<size_t> cycle, std::set<std::set<size_t>>& reported);

  void ParseSuccess(const Entry* success, const Entry* roles_entry, JobSpec& spec);

  void ParseSuccessRoles(const Entry& e, JobSpec& spec, const std::vector<std::string>& tracked);

  const std::string source_;
  const std::string base_dir_;  // absolute
  const JobSections& sections_;
  Framework framework_ = Framework::kNone;  // known before the roles are parsed
  std::vector<Problem> problems_;
  int merge_depth_ = 0;   // merge keys being resolved inside one another, now
  int merges_ = 0;        // merge keys resolved so far
  bool merge_refused_ = false;
};

}  // namespace shoal::spec
