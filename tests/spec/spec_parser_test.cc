#include "spec/spec_parser.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/slurm/slurm_section.h"
#include "backends/yarn/yarn_section.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::spec {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr char kBaseDir[] = "/jobs/demo";

// The job file as `shoal` reads it: with the backends' sections (cli/backends_registry.cc).
const JobSections& BackendSections() {
  static const JobSections sections = {backends::SlurmJobSection(), backends::YarnJobSection()};
  return sections;
}
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& source,
                                     const std::string& base_dir) {
  return spec::ParseJobSpec(yaml, source, base_dir, BackendSections());
}
absl::StatusOr<JobSpec> ParseJobSpecFile(const std::string& path) {
  return spec::ParseJobSpecFile(path, BackendSections());
}
absl::StatusOr<JobFile> ReadJobFile(const std::string& path) {
  return spec::ReadJobFile(path, BackendSections());
}

absl::StatusOr<JobSpec> Parse(const std::string& yaml) {
  return ParseJobSpec(yaml, "job.yaml", kBaseDir);
}

// The refusal message for `yaml`, after checking that it is a refusal.
std::string Refusal(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = Parse(yaml);
  EXPECT_FALSE(spec.ok()) << "accepted:\n" << yaml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

std::vector<std::string> Lines(const std::string& message) {
  return absl::StrSplit(message, '\n');
}

// A fresh directory under the test temp dir.
// Removes this binary's temporary root once every test has run.
class RemoveTempRoot : public ::testing::Environment {
 public:
  void TearDown() override {
    std::filesystem::remove_all(std::filesystem::path(::testing::TempDir()) /
                                ("spec_parser_test_" + std::to_string(::getpid())));
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempRoot =
    ::testing::AddGlobalTestEnvironment(new RemoveTempRoot);

std::filesystem::path MakeTempDir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              ("spec_parser_test_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

constexpr char kFullExample[] = R"yaml(name: digits-ddp
framework: pytorch
success:
  roles: [worker]
roles:
  ps:
    command: python3 -m ps --port 0
    untracked: true
    resources: {cpus: 0.5}
  worker:
    instances: 2
    command: ["python3", "train.py", "--epochs", "3"]
    env: {OMP_NUM_THREADS: 1, DEBUG: true, RATE: 1.50, NAME: "x y"}
    working_dir: ./src/../code
    resources:
      cpus: 2
      memory: 2GiB
      gpus: 1
    untracked: false
    depends_on: [ps]
)yaml";

TEST(SpecParserTest, ParsesFullExampleIntoExactStructs) {
  absl::StatusOr<JobSpec> spec = Parse(kFullExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "digits-ddp");
  EXPECT_EQ(spec->framework, Framework::kPyTorch);
  EXPECT_EQ(spec->source_path, "job.yaml");
  EXPECT_THAT(spec->success_roles, ElementsAre("worker"));
  ASSERT_EQ(spec->roles.size(), 2u);

  const Role& ps = spec->roles[0];
  EXPECT_EQ(ps.name, "ps");
  EXPECT_EQ(ps.line, 6);
  EXPECT_EQ(ps.instances, 1u);
  EXPECT_TRUE(ps.argv.empty());
  EXPECT_EQ(ps.shell, "python3 -m ps --port 0");
  EXPECT_TRUE(ps.env.empty());
  EXPECT_EQ(ps.working_dir, "/jobs/demo");
  EXPECT_DOUBLE_EQ(ps.resources.cpus, 0.5);
  EXPECT_EQ(ps.resources.memory_bytes, 0u);
  EXPECT_EQ(ps.resources.gpus, 0u);
  EXPECT_TRUE(ps.untracked);
  EXPECT_TRUE(ps.depends_on.empty());
  EXPECT_EQ(ps.resource_lines.cpus, 9);
  EXPECT_EQ(ps.resource_lines.memory, 0);

  const Role& worker = spec->roles[1];
  EXPECT_EQ(worker.name, "worker");
  EXPECT_EQ(worker.line, 10);
  EXPECT_EQ(worker.instances, 2u);
  EXPECT_THAT(worker.argv, ElementsAre("python3", "train.py", "--epochs", "3"));
  EXPECT_EQ(worker.shell, "");
  EXPECT_THAT(worker.env, ElementsAre(Pair("DEBUG", "true"), Pair("NAME", "x y"),
                                      Pair("OMP_NUM_THREADS", "1"), Pair("RATE", "1.50")));
  EXPECT_EQ(worker.working_dir, "/jobs/demo/code");
  EXPECT_DOUBLE_EQ(worker.resources.cpus, 2);
  EXPECT_EQ(worker.resources.memory_bytes, 2ull << 30);
  EXPECT_EQ(worker.resources.gpus, 1u);
  EXPECT_FALSE(worker.untracked);
  EXPECT_THAT(worker.depends_on, ElementsAre("ps"));
  EXPECT_EQ(worker.resource_lines.cpus, 16);
  EXPECT_EQ(worker.resource_lines.memory, 17);
  EXPECT_EQ(worker.resource_lines.gpus, 18);
  EXPECT_EQ(spec->TotalTasks(), 3u);
}

TEST(SpecParserTest, FillsDefaultsForOmittedOptionalKeys) {
  absl::StatusOr<JobSpec> spec = Parse("name: j\nroles:\n  main:\n    command: [./run]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->framework, Framework::kNone);
  const Role& role = spec->roles.at(0);
  EXPECT_EQ(role.instances, 1u);
  EXPECT_DOUBLE_EQ(role.resources.cpus, 1.0);
  EXPECT_EQ(role.resources.memory_bytes, 0u);
  EXPECT_EQ(role.resources.gpus, 0u);
  EXPECT_FALSE(role.untracked);
  EXPECT_EQ(role.working_dir, "/jobs/demo");
  EXPECT_EQ(role.resource_lines.cpus, 0);
}

TEST(SpecParserTest, AcceptsFrameworkNoneExplicitly) {
  absl::StatusOr<JobSpec> spec =
      Parse("name: j\nframework: none\nroles:\n  main:\n    command: [./run]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->framework, Framework::kNone);
}

TEST(SpecParserTest, KeepsRoleOrderOfTheFile) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  zeta: {command: [a]}
  alpha: {command: [b]}
  mid: {command: [c]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<std::string> names;
  for (const auto& r : spec->roles) names.push_back(r.name);
  EXPECT_THAT(names, ElementsAre("zeta", "alpha", "mid"));
  EXPECT_THAT(spec->success_roles, ElementsAre("zeta", "alpha", "mid"));
}

TEST(SpecParserTest, StoresCommandStringAsShellAndListAsArgv) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  a:
    command: "echo $HOME && sleep 1"
  b:
    command:
      - python3
      - -c
      - "print(1)"
      - 3
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles[0].shell, "echo $HOME && sleep 1");
  EXPECT_TRUE(spec->roles[0].argv.empty());
  EXPECT_THAT(spec->roles[1].argv, ElementsAre("python3", "-c", "print(1)", "3"));
  EXPECT_EQ(spec->roles[1].shell, "");
}

TEST(SpecParserTest, ConvertsEnvNumbersAndBoolsToTheirText) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  a:
    command: [x]
    env:
      THREADS: 4
      RATE: 0.10
      VERBOSE: false
      QUOTED: "007"
      EMPTY: ""
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->roles[0].env,
              ElementsAre(Pair("EMPTY", ""), Pair("QUOTED", "007"), Pair("RATE", "0.10"),
                          Pair("THREADS", "4"), Pair("VERBOSE", "false")));
}

TEST(SpecParserTest, ResolvesWorkingDirAgainstBaseDirAndKeepsAbsolutePaths) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  rel: {command: [x], working_dir: data/}
  dot: {command: [x], working_dir: .}
  up: {command: [x], working_dir: ../other}
  abs: {command: [x], working_dir: /srv/train/}
  none: {command: [x]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles[0].working_dir, "/jobs/demo/data");
  EXPECT_EQ(spec->roles[1].working_dir, "/jobs/demo");
  EXPECT_EQ(spec->roles[2].working_dir, "/jobs/other");
  EXPECT_EQ(spec->roles[3].working_dir, "/srv/train");
  EXPECT_EQ(spec->roles[4].working_dir, "/jobs/demo");
}

TEST(SpecParserTest, ResolvesRelativeBaseDirAgainstCurrentDirectory) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec("name: j\nroles:\n  a: {command: [x]}\n", "job.yaml", "sub");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles[0].working_dir, (std::filesystem::current_path() / "sub").string());
}

TEST(SpecParserTest, SuccessDefaultsToChiefWhenAChiefRoleExists) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  worker: {command: [w], instances: 3}
  chief: {command: [c]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->success_roles, ElementsAre("chief"));
}

TEST(SpecParserTest, SuccessDefaultsToEveryTrackedRoleWithoutChief) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  ps: {command: [p], untracked: true}
  worker: {command: [w]}
  evaluator: {command: [e]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->success_roles, ElementsAre("worker", "evaluator"));
}

TEST(SpecParserTest, SuccessRolesGivenExplicitlyOverrideTheChiefDefault) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
success:
  roles: [worker, chief, worker]
roles:
  chief: {command: [c]}
  worker: {command: [w]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->success_roles, ElementsAre("worker", "chief"));
}

TEST(SpecParserTest, UntrackedChiefDoesNotBecomeTheSuccessDefault) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  chief: {command: [c], untracked: true}
  worker: {command: [w]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->success_roles, ElementsAre("worker"));
}

TEST(SpecParserTest, ParseJobSpecFileResolvesAgainstTheFilesDirectory) {
  std::filesystem::path dir = MakeTempDir("file_ok");
  WriteText(dir / "job.yaml", "name: j\nroles:\n  a: {command: [x], working_dir: out}\n");
  std::string path = (dir / "job.yaml").string();
  absl::StatusOr<JobSpec> spec = ParseJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source_path, path);
  EXPECT_EQ(spec->roles[0].working_dir, (dir / "out").lexically_normal().string());
}

TEST(SpecParserTest, ParseJobSpecFileNamesTheFileInErrors) {
  std::filesystem::path dir = MakeTempDir("file_bad");
  WriteText(dir / "bad.yaml", "name: j\nroles:\n  a: {command: [x], instances: 0}\n");
  absl::StatusOr<JobSpec> spec = ParseJobSpecFile((dir / "bad.yaml").string());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr((dir / "bad.yaml").string() + ":3: roles.a.instances:"));
}

// --- Unknown keys -------------------------------------------------------------------------------

TEST(SpecParserTest, RejectsUnknownTopLevelKeyListingAcceptedKeys) {
  std::string msg = Refusal("name: j\nowner: me\nroles:\n  a: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:2: owner: unknown key;"));
  EXPECT_THAT(msg, HasSubstr("accepted keys: name, framework, success, roles, on_failure, "
                             "restart, max_restarts, progress_timeout, backoff, heartbeat, "
                             "checkpoint, dataset, slurm, yarn, tensorboard"));
  EXPECT_THAT(msg, Not(HasSubstr("did you mean")));
}

TEST(SpecParserTest, RejectsMisspelledRoleKeySuggestingTheClosest) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  worker:
    command: [x]
    instnaces: 2
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.worker.instnaces: unknown key; did you mean "
                             "'instances'? accepted keys: instances, command, env, working_dir, "
                             "resources, untracked, depends_on, on_failure, restart, "
                             "max_restarts, progress_timeout"));
}

TEST(SpecParserTest, RejectsUnknownResourcesKeySuggestingTheClosest) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  worker:
    command: [x]
    resources:
      cpu: 2
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:6: roles.worker.resources.cpu: unknown key; did you mean "
                             "'cpus'? accepted keys: cpus, memory, gpus"));
}

TEST(SpecParserTest, RejectsUnknownSuccessKeySuggestingTheClosest) {
  std::string msg = Refusal("name: j\nsuccess:\n  role: [a]\nroles:\n  a: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: success.role: unknown key; did you mean 'roles'? "
                             "accepted keys: roles"));
}

TEST(SpecParserTest, SuggestsTopLevelKeyDespiteCase) {
  std::string msg = Refusal("Name: j\nroles:\n  a: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:1: Name: unknown key; did you mean 'name'?"));
}

TEST(SpecParserTest, RejectsNonTextKey) {
  std::string msg = Refusal("name: j\nroles:\n  a:\n    ? [x, y]\n    : 1\n    command: [x]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.a: keys must be plain names, got a list"));
}

// --- Wrong types and values ---------------------------------------------------------------------

TEST(SpecParserTest, RejectsZeroInstancesNamingLineAndKey) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  worker:
    command: [x]
    instances: 0
)yaml");
  EXPECT_EQ(msg, "job.yaml:5: roles.worker.instances: must be an integer >= 1, got 0");
}

TEST(SpecParserTest, RejectsNegativeInstances) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [x], instances: -3}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.w.instances: must be an integer >= 1, got -3"));
}

TEST(SpecParserTest, RejectsFractionalInstances) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [x], instances: 2.5}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.w.instances: must be an integer >= 1, got 2.5"));
}

TEST(SpecParserTest, RejectsInstancesGivenAsWords) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [x], instances: \"two\"}\n");
  EXPECT_THAT(msg,
              HasSubstr("job.yaml:3: roles.w.instances: must be an integer >= 1, got 'two'"));
}

TEST(SpecParserTest, RejectsAbsurdlyManyInstances) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [x], instances: 99999999999}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.w.instances: must be at most 100000"));
}

TEST(SpecParserTest, RejectsEnvGivenAsList) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    env: [a]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.w.env: must be a map of NAME: value, e.g. "
                             "{OMP_NUM_THREADS: \"1\"}, got a list"));
}

TEST(SpecParserTest, RejectsEnvValueThatIsAListOrMissing) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  w:
    command: [x]
    env:
      PATHS: [a, b]
      NOTHING:
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:6: roles.w.env.PATHS: must be a string, number or bool"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:7: roles.w.env.NOTHING: must be a string, number or bool "
                             "(write \"\" for an empty value), got nothing"));
}

TEST(SpecParserTest, RejectsInvalidEnvName) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    env: {A=B: 1}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.w.env.A=B: variable names must hold only "
                             "letters, digits and '_'"));
}

// Issue 24: the agent set SHOAL_PROGRESS_FILE and friends after the role's env, so a value
// written in the job file was dropped without a word.
TEST(SpecParserTest, RejectsReservedShoalVariablesInEnvNamingEachAndWhy) {
  std::string msg = Refusal(
      "name: j\nroles:\n  w:\n    command: [x]\n    env:\n      SHOAL_RANK: 3\n"
      "      KEEP_ME: 1\n      SHOAL_PROGRESS_FILE: /tmp/p\n      SHOAL_CHECKPOINT_DIR: /ckpt\n");
  std::vector<std::string> lines = Lines(msg);
  ASSERT_EQ(lines.size(), 3u) << msg;
  EXPECT_EQ(lines[0],
            "job.yaml:6: roles.w.env.SHOAL_RANK: reserved: Shoal sets SHOAL_RANK itself "
            "(docs/environment.md), so a role's env cannot change it");
  EXPECT_THAT(lines[1], HasSubstr("job.yaml:8: roles.w.env.SHOAL_PROGRESS_FILE: reserved: "));
  EXPECT_THAT(lines[2], HasSubstr("job.yaml:9: roles.w.env.SHOAL_CHECKPOINT_DIR: reserved: "
                                  "Shoal sets SHOAL_CHECKPOINT_DIR itself"));
  EXPECT_THAT(lines[2], HasSubstr("; set checkpoint.dir instead"));
}

// Settings the SDK reads but Shoal does not set (SHOAL_WEBHDFS) are the user's to give.
TEST(SpecParserTest, AcceptsShoalNamesThatShoalDoesNotSet) {
  absl::StatusOr<JobSpec> spec = Parse(
      "name: j\nroles:\n  w:\n    command: [x]\n    env: {SHOAL_WEBHDFS: \"http://nn:9870\"}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->roles[0].env, ElementsAre(Pair("SHOAL_WEBHDFS", "http://nn:9870")));
}

TEST(SpecParserTest, RejectsNumberAsCommand) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: 5\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.w.command: must be a non-empty list of strings "
                             "(argv), e.g. [python3, train.py], or a non-empty string run by "
                             "/bin/sh -c, got 5"));
}

TEST(SpecParserTest, RejectsCommandAsMap) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: {run: x}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.w.command: must be a non-empty list of strings"));
  EXPECT_THAT(msg, HasSubstr("got a map"));
}

TEST(SpecParserTest, RejectsCommandListHoldingAListNamingTheItem) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command:\n      - python3\n      - [a]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:6: roles.w.command[1]: must be a string, got a list"));
}

TEST(SpecParserTest, RejectsEmptyProgramName) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [\"\", x]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.w.command[0]: the program must not be empty"));
}

TEST(SpecParserTest, RejectsNonNumericCpus) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  w:
    command: [x]
    resources:
      cpus: lots
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:6: roles.w.resources.cpus: must be a number > 0 "
                             "(fractions allowed, e.g. 0.5 or 4), got 'lots'"));
}

TEST(SpecParserTest, RejectsZeroAndInfiniteCpus) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  a: {command: [x], resources: {cpus: 0}}
  b: {command: [x], resources: {cpus: .inf}}
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.a.resources.cpus: must be a number > 0"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.b.resources.cpus: must be a number > 0"));
}

TEST(SpecParserTest, RejectsNonBoolUntracked) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    untracked: maybe\n");
  EXPECT_THAT(msg,
              HasSubstr("job.yaml:5: roles.w.untracked: must be true or false, got 'maybe'"));
}

TEST(SpecParserTest, RejectsMalformedMemorySize) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  worker:
    command: [x]
    resources:
      cpus: 1
      memory: 2GB?
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:7: roles.worker.resources.memory: '2GB?' is not a size; "
                             "expected a number with an optional unit, e.g. 512MiB, 2GiB, 1.5G, "
                             "4GB"));
}

TEST(SpecParserTest, RejectsMemoryGivenAsList) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [x], resources: {memory: [1]}}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.w.resources.memory: must be a size, e.g. 512MiB"));
}

TEST(SpecParserTest, RejectsNegativeOrFractionalGpus) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  a: {command: [x], resources: {gpus: -1}}
  b: {command: [x], resources: {gpus: 0.5}}
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.a.resources.gpus: must be an integer >= 0, got -1"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.b.resources.gpus: must be an integer >= 0, got 0.5"));
}

TEST(SpecParserTest, RejectsResourcesThatAreNotAMap) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    resources: 4\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.w.resources: must be a map with cpus, memory "
                             "and/or gpus"));
}

TEST(SpecParserTest, RejectsTildeInWorkingDir) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    working_dir: ~/data\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.w.working_dir: '~' is not expanded; must be a "
                             "directory path"));
}

TEST(SpecParserTest, RejectsRoleThatIsNotAMap) {
  std::string msg = Refusal("name: j\nroles:\n  worker: python3 train.py\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.worker: must be a map with at least 'command', "
                             "e.g. {command: [python3, train.py]}, got 'python3 train.py'"));
}

TEST(SpecParserTest, RejectsDependsOnThatIsNotAList) {
  std::string msg = Refusal("name: j\nroles:\n  ps: {command: [x]}\n  w: {command: [x], depends_on: ps}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.w.depends_on: must be a list of role names, e.g. "
                             "[ps], got 'ps'"));
}

// --- Missing or empty ---------------------------------------------------------------------------

TEST(SpecParserTest, RejectsMissingCommand) {
  std::string msg = Refusal("name: j\nroles:\n  worker:\n    instances: 2\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.worker.command: required; expected a non-empty "
                             "list of strings (argv)"));
}

TEST(SpecParserTest, RejectsEmptyCommandList) {
  std::string msg = Refusal("name: j\nroles:\n  worker:\n    command: []\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.worker.command: must not be empty; expected a "
                             "non-empty list of strings (argv)"));
}

TEST(SpecParserTest, RejectsEmptyCommandString) {
  std::string msg = Refusal("name: j\nroles:\n  worker:\n    command: \"  \"\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.worker.command: must not be empty; expected"));
}

TEST(SpecParserTest, RejectsNullCommand) {
  std::string msg = Refusal("name: j\nroles:\n  worker:\n    command:\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.worker.command: must be a non-empty list"));
  EXPECT_THAT(msg, HasSubstr("got nothing"));
}

TEST(SpecParserTest, RejectsMissingRoles) {
  std::string msg = Refusal("name: j\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:1: roles: required; expected a map of role name to role"));
}

TEST(SpecParserTest, RejectsEmptyRoles) {
  EXPECT_THAT(Refusal("name: j\nroles: {}\n"),
              HasSubstr("job.yaml:2: roles: must define at least one role"));
  EXPECT_THAT(Refusal("name: j\nroles:\n"),
              HasSubstr("job.yaml:2: roles: must define at least one role"));
}

TEST(SpecParserTest, RejectsRolesGivenAsList) {
  EXPECT_THAT(Refusal("name: j\nroles: [worker]\n"),
              HasSubstr("job.yaml:2: roles: must be a map of role name to role, got a list"));
}

TEST(SpecParserTest, RejectsMissingName) {
  std::string msg = Refusal("roles:\n  a: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:1: name: required; expected a job name such as digits-ddp"));
}

TEST(SpecParserTest, RejectsNameWithSpacesOrTooLong) {
  EXPECT_THAT(Refusal("name: my job\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:1: name: must be a name of letters, digits, '.', '_' and '-' "
                        "that starts with a letter or digit, at most 63 characters, e.g. "
                        "digits-ddp, got 'my job'"));
  EXPECT_THAT(Refusal("name: " + std::string(64, 'a') + "\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:1: name: must be"));
  EXPECT_TRUE(Parse("name: " + std::string(63, 'a') + "\nroles:\n  a: {command: [x]}\n").ok());
}

TEST(SpecParserTest, RejectsInvalidRoleName) {
  std::string msg = Refusal("name: j\nroles:\n  9lives: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.9lives: role names must start with a letter and "
                             "hold only letters, digits, '_' and '-'"));
}

TEST(SpecParserTest, RejectsEmptyFile) {
  EXPECT_EQ(Refusal(""),
            "job.yaml:1: the job file holds no job; expected a map with at least 'name' and "
            "'roles'");
  EXPECT_THAT(Refusal("# only a comment\n"), HasSubstr("job.yaml:1: the job file holds no job"));
  EXPECT_THAT(Refusal("~\n"), HasSubstr("job.yaml:1: the job file holds no job"));
}

// yaml-cpp 0.7's LoadAll never returns on a stray ',' (jbeder/yaml-cpp#1040): it fills memory
// with null documents until the process is killed.
TEST(SpecParserTest, RejectsStrayCommaWithoutRunningOutOfMemoryYamlCpp1040) {
  EXPECT_EQ(Refusal(","), "job.yaml:1:1: invalid YAML: unexpected ','");
  EXPECT_EQ(Refusal("- a\n,\n"), "job.yaml:2:1: invalid YAML: unexpected ','");
  EXPECT_EQ(Refusal("name: j\nroles:\n  a: {command: [x]}\n---\n,\n---\nname: k\n"),
            "job.yaml:5:1: invalid YAML: unexpected ','");
}

TEST(SpecParserTest, AcceptsEmptyDocumentsAroundTheJob) {
  absl::StatusOr<JobSpec> spec = Parse("---\nname: j\nroles:\n  a: {command: [x]}\n---\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "j");
}

TEST(SpecParserTest, RejectsTopLevelList) {
  EXPECT_THAT(Refusal("- name: j\n"),
              HasSubstr("job.yaml:1: the job file must be a map with at least 'name' and "
                        "'roles'; got a list"));
}

TEST(SpecParserTest, RejectsSeveralYamlDocuments) {
  std::string msg = Refusal("name: j\nroles:\n  a: {command: [x]}\n---\nname: k\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: the job file holds more than one YAML document"));
}

// --- Duplicates ---------------------------------------------------------------------------------

TEST(SpecParserTest, RejectsDuplicateRoleNamingBothLines) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  worker:
    command: [a]
  ps:
    command: [p]
  worker:
    command: [b]
)yaml");
  EXPECT_EQ(msg,
            "job.yaml:7: roles.worker: role defined twice, at lines 3 and 7; role names must be "
            "unique");
}

TEST(SpecParserTest, RejectsDuplicateKeyInsideRole) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [a]\n    command: [b]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.w.command: given twice, at lines 4 and 5"));
}

TEST(SpecParserTest, RejectsDuplicateTopLevelKey) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [a]}\nname: k\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: name: given twice, at lines 1 and 4"));
}

// --- Dependencies -------------------------------------------------------------------------------

TEST(SpecParserTest, RejectsDependencyOnUnknownRole) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  worker:
    command: [x]
    depends_on: [ps]
  chief:
    command: [x]
)yaml");
  EXPECT_EQ(msg, "job.yaml:5: roles.worker.depends_on: 'ps' is not a role of this job; roles "
                 "are: worker, chief");
}

TEST(SpecParserTest, RejectsRoleDependingOnItself) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    depends_on: [w]\n");
  EXPECT_EQ(msg, "job.yaml:5: roles.w.depends_on: role 'w' cannot depend on itself");
}

TEST(SpecParserTest, RejectsDependencyCycleOnce) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  a:
    command: [x]
    depends_on: [b]
  b:
    command: [x]
    depends_on: [c]
  c:
    command: [x]
    depends_on: [a]
  d:
    command: [x]
    depends_on: [a]
)yaml");
  EXPECT_EQ(msg, "job.yaml:5: roles.a.depends_on: roles depend on each other in a cycle "
                 "(a -> b -> c -> a), so none of them could ever start");
}

TEST(SpecParserTest, AcceptsDiamondDependencies) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  top: {command: [x]}
  left: {command: [x], depends_on: [top]}
  right: {command: [x], depends_on: [top]}
  bottom: {command: [x], depends_on: [left, right, left]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->roles[3].depends_on, ElementsAre("left", "right"));
}

TEST(SpecParserTest, SurvivesAVeryLongDependencyChain) {
  std::string yaml = "name: j\nroles:\n";
  for (int i = 0; i < 5000; ++i) {
    yaml += "  r" + std::to_string(i) + ": {command: [x]" +
            (i > 0 ? ", depends_on: [r" + std::to_string(i - 1) + "]" : std::string()) + "}\n";
  }
  absl::StatusOr<JobSpec> spec = Parse(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles.size(), 5000u);
}

// --- Success ------------------------------------------------------------------------------------

TEST(SpecParserTest, RejectsSuccessRoleThatDoesNotExist) {
  std::string msg = Refusal(R"yaml(name: j
success:
  roles: [chief]
roles:
  worker: {command: [x]}
)yaml");
  EXPECT_EQ(msg, "job.yaml:3: success.roles: 'chief' is not a role of this job; roles are: worker");
}

TEST(SpecParserTest, RejectsUntrackedSuccessRole) {
  std::string msg = Refusal(R"yaml(name: j
success:
  roles:
    - ps
roles:
  ps: {command: [x], untracked: true}
  worker: {command: [x]}
)yaml");
  EXPECT_EQ(msg, "job.yaml:4: success.roles: 'ps' is untracked, so it cannot decide success; "
                 "tracked roles are: worker");
}

TEST(SpecParserTest, RejectsEmptySuccessRoles) {
  std::string msg = Refusal("name: j\nsuccess:\n  roles: []\nroles:\n  w: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: success.roles: must name at least one role"));
}

TEST(SpecParserTest, RejectsJobWhoseRolesAreAllUntracked) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  a: {command: [x], untracked: true}
  b: {command: [x], untracked: true}
)yaml");
  EXPECT_THAT(msg, HasSubstr("job.yaml:2: roles: every role is untracked, so nothing could "
                             "decide whether the job succeeded"));
}

// --- Framework ----------------------------------------------------------------------------------

TEST(SpecParserTest, AcceptsEveryAdaptedFramework) {
  for (const char* name : {"none", "pytorch", "tensorflow", "jax", "paddle", "horovod"}) {
    auto spec = ParseJobSpec(std::string("name: j\nframework: ") + name +
                                 "\nroles:\n  a: {command: [x]}\n",
                             "job.yaml", "/base");
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_STREQ(FrameworkName(spec->framework), name);
  }
}

// --- framework: mpi ------------------------------------------------------------------------------

constexpr char kMpiJob[] = R"yaml(name: mpi-job
framework: mpi
mpi: {slots_per_worker: 2}
roles:
  launcher:
    command: [python3, train.py]
  worker:
    instances: 3
)yaml";

TEST(SpecParserTest, MpiJobMakesWorkersUntrackedAndStartsTheLauncherAfterThem) {
  absl::StatusOr<JobSpec> spec = Parse(kMpiJob);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->framework, Framework::kMpi);
  EXPECT_EQ(spec->mpi.slots_per_worker, 2u);
  const Role* worker = spec->FindRole("worker");
  ASSERT_NE(worker, nullptr);
  EXPECT_TRUE(worker->untracked);
  EXPECT_TRUE(worker->argv.empty() && worker->shell.empty());
  EXPECT_THAT(spec->FindRole("launcher")->depends_on, ElementsAre("worker"));
  EXPECT_THAT(spec->success_roles, ElementsAre("launcher"));
}

TEST(SpecParserTest, MpiWorkerWithACommandIsRefused) {
  std::string msg = Refusal(std::string(kMpiJob) + "    command: [python3, train.py]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:9: roles.worker.command: framework: mpi runs Shoal's MPI "
                             "host in the worker tasks"));
}

TEST(SpecParserTest, MpiNeedsALauncherAndAWorkerRole) {
  std::string msg = Refusal("name: j\nframework: mpi\nroles:\n  trainer: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles: framework: mpi needs a 'launcher' role"));
}

TEST(SpecParserTest, MpiRunsExactlyOneLauncher) {
  std::string msg = Refusal(
      "name: j\nframework: mpi\nroles:\n  launcher: {command: [x], instances: 2}\n  worker: {}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: roles.launcher.instances: framework: mpi runs exactly "
                             "one launcher, got 2"));
}

TEST(SpecParserTest, MpiRolesCannotBeElastic) {
  std::string msg = Refusal(
      "name: j\nframework: mpi\nroles:\n  launcher: {command: [x]}\n"
      "  worker: {instances: {min: 1, max: 3}}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.worker: an MPI world cannot change size"));
}

TEST(SpecParserTest, MpiSectionNeedsFrameworkMpiAndPositiveSlots) {
  EXPECT_THAT(Refusal("name: j\nmpi: {slots_per_worker: 2}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: mpi: only applies to framework: mpi; this job's framework "
                        "is none"));
  std::string bad = kMpiJob;
  bad.replace(bad.find("slots_per_worker: 2"), 19, "slots_per_worker: 0");
  EXPECT_THAT(Refusal(bad), HasSubstr("job.yaml:3: mpi.slots_per_worker: must be"));
  bad = kMpiJob;
  bad.replace(bad.find("slots_per_worker: 2"), 19, "slots: 2");
  EXPECT_THAT(Refusal(bad), HasSubstr("job.yaml:3: mpi.slots: unknown key"));
}

TEST(SpecParserTest, RejectsUnknownFrameworkSuggestingTheClosest) {
  std::string msg = Refusal("name: j\nframework: pytroch\nroles:\n  a: {command: [x]}\n");
  EXPECT_EQ(msg, "job.yaml:2: framework: unknown framework 'pytroch'; did you mean 'pytorch'? "
                 "accepted values: none, pytorch, tensorflow, jax, paddle, horovod, mpi");
}

// --- Failure handling: accepted forms -----------------------------------------------------------

using std::chrono::milliseconds;

TEST(SpecParserTest, FillsFailureHandlingDefaultsWhenNothingIsWritten) {
  absl::StatusOr<JobSpec> spec = Parse("name: j\nroles:\n  main: {command: [x], instances: 2}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->on_failure, OnFailure::kFailJob);
  const Role& role = spec->roles[0];
  EXPECT_EQ(role.on_failure, OnFailure::kFailJob);
  EXPECT_EQ(role.restart, RestartMode::kNever);
  EXPECT_EQ(role.max_restarts, 3u);
  EXPECT_EQ(role.progress_timeout, milliseconds(0));
  EXPECT_EQ(role.instances, 2u);
  EXPECT_EQ(role.min_instances, 0u);
  EXPECT_EQ(role.max_instances, 0u);
  EXPECT_EQ(spec->backoff.initial, milliseconds(1000));
  EXPECT_EQ(spec->backoff.max, milliseconds(30000));
  EXPECT_EQ(spec->heartbeat.interval, milliseconds(1000));
  EXPECT_EQ(spec->heartbeat.misses, 3u);
  EXPECT_FALSE(spec->checkpoint.configured);
  EXPECT_EQ(spec->checkpoint.dir, "");
  EXPECT_EQ(spec->checkpoint.keep, 3u);
  EXPECT_FALSE(spec->dataset.configured);
  EXPECT_EQ(spec->dataset.NumShards(), 0u);
}

constexpr char kFailureExample[] = R"yaml(name: digits-ddp
on_failure: restart-group
restart: on-failure
max_restarts: 5
progress_timeout: 30s
backoff: {initial: 500ms, max: 1m}
heartbeat: {interval: 250ms, misses: 4}
checkpoint: {dir: ./ckpt/, keep: 2}
dataset:
  samples: 1797
  shard_size: 64
  epochs: 3
  lease_timeout: 90s
success:
  roles: [worker]
roles:
  ps:
    command: [ps]
    untracked: true
    on_failure: restart-task
    restart: always
    max_restarts: 0
  evaluator:
    command: [eval]
    on_failure: restart-task
    restart: always
    progress_timeout: 0
  worker:
    command: [train]
    instances: 4
)yaml";

TEST(SpecParserTest, ParsesJobFailureSettingsIntoExactStructs) {
  absl::StatusOr<JobSpec> spec = Parse(kFailureExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->on_failure, OnFailure::kRestartGroup);
  EXPECT_EQ(spec->backoff.initial, milliseconds(500));
  EXPECT_EQ(spec->backoff.max, milliseconds(60000));
  EXPECT_EQ(spec->heartbeat.interval, milliseconds(250));
  EXPECT_EQ(spec->heartbeat.misses, 4u);
  EXPECT_TRUE(spec->checkpoint.configured);
  EXPECT_EQ(spec->checkpoint.dir, "/jobs/demo/ckpt");
  EXPECT_EQ(spec->checkpoint.keep, 2u);
  EXPECT_TRUE(spec->dataset.configured);
  EXPECT_TRUE(spec->dataset.files.empty());
  EXPECT_EQ(spec->dataset.samples, 1797u);
  EXPECT_EQ(spec->dataset.shard_size, 64u);
  EXPECT_EQ(spec->dataset.epochs, 3u);
  EXPECT_EQ(spec->dataset.lease_timeout, milliseconds(90000));
  EXPECT_EQ(spec->dataset.NumShards(), 29u);
}

TEST(SpecParserTest, RolesInheritJobFailureSettingsUnlessTheySetTheirOwn) {
  absl::StatusOr<JobSpec> spec = Parse(kFailureExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Role* ps = spec->FindRole("ps");
  ASSERT_NE(ps, nullptr);
  EXPECT_EQ(ps->on_failure, OnFailure::kRestartTask);
  EXPECT_EQ(ps->restart, RestartMode::kAlways);
  EXPECT_EQ(ps->max_restarts, 0u);
  EXPECT_EQ(ps->progress_timeout, milliseconds(30000));

  const Role* evaluator = spec->FindRole("evaluator");
  ASSERT_NE(evaluator, nullptr);
  EXPECT_EQ(evaluator->on_failure, OnFailure::kRestartTask);
  EXPECT_EQ(evaluator->restart, RestartMode::kAlways);
  EXPECT_EQ(evaluator->max_restarts, 5u);
  EXPECT_EQ(evaluator->progress_timeout, milliseconds(0));

  const Role* worker = spec->FindRole("worker");
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ(worker->on_failure, OnFailure::kRestartGroup);
  EXPECT_EQ(worker->restart, RestartMode::kOnFailure);
  EXPECT_EQ(worker->max_restarts, 5u);
  EXPECT_EQ(worker->progress_timeout, milliseconds(30000));
  EXPECT_EQ(worker->instances, 4u);
  EXPECT_EQ(worker->min_instances, 0u);
  EXPECT_EQ(worker->max_instances, 0u);
}

TEST(SpecParserTest, RestartDefaultFollowsTheEffectiveOnFailure) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
on_failure: restart-task
roles:
  inherits: {command: [x]}
  fails_job: {command: [x], on_failure: fail-job}
  group: {command: [x], on_failure: restart-group}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles[0].on_failure, OnFailure::kRestartTask);
  EXPECT_EQ(spec->roles[0].restart, RestartMode::kOnFailure);
  EXPECT_EQ(spec->roles[1].on_failure, OnFailure::kFailJob);
  EXPECT_EQ(spec->roles[1].restart, RestartMode::kNever);
  EXPECT_EQ(spec->roles[2].on_failure, OnFailure::kRestartGroup);
  EXPECT_EQ(spec->roles[2].restart, RestartMode::kOnFailure);
}

TEST(SpecParserTest, RoleOnFailureAloneNeedsNoJobSettings) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  ps: {command: [x], on_failure: restart-task, restart: on-failure, max_restarts: 10}
  worker: {command: [x]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->on_failure, OnFailure::kFailJob);
  EXPECT_EQ(spec->roles[0].on_failure, OnFailure::kRestartTask);
  EXPECT_EQ(spec->roles[0].restart, RestartMode::kOnFailure);
  EXPECT_EQ(spec->roles[0].max_restarts, 10u);
  EXPECT_EQ(spec->roles[1].on_failure, OnFailure::kFailJob);
  EXPECT_EQ(spec->roles[1].restart, RestartMode::kNever);
  EXPECT_EQ(spec->roles[1].max_restarts, 3u);
}

TEST(SpecParserTest, AcceptsRestartNeverWithFailJobAndOnFailureWithAnyAction) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
restart: never
roles:
  a: {command: [x]}
  b: {command: [x], on_failure: fail-job, restart: on-failure}
  c: {command: [x], on_failure: elastic, restart: on-failure}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles[0].restart, RestartMode::kNever);
  EXPECT_EQ(spec->roles[1].restart, RestartMode::kOnFailure);
  EXPECT_EQ(spec->roles[2].restart, RestartMode::kOnFailure);
}

TEST(SpecParserTest, AcceptsRestartAlwaysOnRoleThatDoesNotDecideSuccess) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
on_failure: restart-task
restart: always
roles:
  chief: {command: [x], restart: on-failure}
  evaluator: {command: [x]}
  ps: {command: [x], untracked: true}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->success_roles, ElementsAre("chief"));
  EXPECT_EQ(spec->roles[0].restart, RestartMode::kOnFailure);
  EXPECT_EQ(spec->roles[1].restart, RestartMode::kAlways);
  EXPECT_EQ(spec->roles[2].restart, RestartMode::kAlways);
}

TEST(SpecParserTest, ParsesElasticInstancesRange) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
on_failure: elastic
roles:
  worker:
    command: [x]
    instances: {min: 2, max: 4}
  fixed: {command: [x], instances: 3}
  one: {command: [x], instances: {min: 1, max: 1}}
  ps: {command: [x], instances: 2, on_failure: restart-task}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->on_failure, OnFailure::kElastic);
  const Role& worker = spec->roles[0];
  EXPECT_EQ(worker.on_failure, OnFailure::kElastic);
  EXPECT_EQ(worker.restart, RestartMode::kOnFailure);
  EXPECT_EQ(worker.min_instances, 2u);
  EXPECT_EQ(worker.max_instances, 4u);
  EXPECT_EQ(worker.instances, 4u);
  const Role& fixed = spec->roles[1];
  EXPECT_EQ(fixed.min_instances, 3u);
  EXPECT_EQ(fixed.max_instances, 3u);
  EXPECT_EQ(fixed.instances, 3u);
  EXPECT_EQ(spec->roles[2].min_instances, 1u);
  EXPECT_EQ(spec->roles[2].max_instances, 1u);
  const Role& ps = spec->roles[3];
  EXPECT_EQ(ps.on_failure, OnFailure::kRestartTask);
  EXPECT_EQ(ps.min_instances, 0u);
  EXPECT_EQ(ps.max_instances, 0u);
  EXPECT_EQ(spec->TotalTasks(), 10u);
}

TEST(SpecParserTest, AcceptsElasticRoleSetOnTheRoleItself) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  worker: {command: [x], on_failure: elastic, instances: {max: 8, min: 2}}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->on_failure, OnFailure::kFailJob);
  EXPECT_EQ(spec->roles[0].min_instances, 2u);
  EXPECT_EQ(spec->roles[0].max_instances, 8u);
  EXPECT_EQ(spec->roles[0].instances, 8u);
}

TEST(SpecParserTest, AcceptsElasticJobWithoutAnyInstancesRange) {
  absl::StatusOr<JobSpec> spec =
      Parse("name: j\non_failure: elastic\nroles:\n  w: {command: [x]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->roles[0].on_failure, OnFailure::kElastic);
  EXPECT_EQ(spec->roles[0].min_instances, 1u);
  EXPECT_EQ(spec->roles[0].max_instances, 1u);
}

TEST(SpecParserTest, ReadsEveryDurationForm) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  a: {command: [x], on_failure: restart-task, progress_timeout: 500ms}
  b: {command: [x], on_failure: restart-task, progress_timeout: 1.5s}
  c: {command: [x], on_failure: restart-task, progress_timeout: 2m}
  d: {command: [x], on_failure: restart-task, progress_timeout: 1h}
  e: {command: [x], on_failure: restart-task, progress_timeout: 30}
  f: {command: [x], on_failure: restart-task, progress_timeout: 0.25}
  g: {command: [x], on_failure: restart-task, progress_timeout: "45s"}
  h: {command: [x], on_failure: restart-task, progress_timeout: 0}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<milliseconds> got;
  for (const Role& r : spec->roles) got.push_back(r.progress_timeout);
  EXPECT_THAT(got, ElementsAre(milliseconds(500), milliseconds(1500), milliseconds(120000),
                               milliseconds(3600000), milliseconds(30000), milliseconds(250),
                               milliseconds(45000), milliseconds(0)));
}

TEST(SpecParserTest, AcceptsZeroInitialBackoffAndEmptySections) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
backoff: {initial: 0, max: 0}
heartbeat:
roles:
  a: {command: [x]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->backoff.initial, milliseconds(0));
  EXPECT_EQ(spec->backoff.max, milliseconds(0));
  EXPECT_EQ(spec->heartbeat.interval, milliseconds(1000));
  EXPECT_EQ(spec->heartbeat.misses, 3u);

  spec = Parse("name: j\nbackoff:\nheartbeat: {interval: 10ms}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->backoff.initial, milliseconds(1000));
  EXPECT_EQ(spec->backoff.max, milliseconds(30000));
  EXPECT_EQ(spec->heartbeat.interval, milliseconds(10));
}

TEST(SpecParserTest, BackoffKeepsTheDefaultOfTheKeyNotWritten) {
  absl::StatusOr<JobSpec> spec =
      Parse("name: j\nbackoff: {max: 2m}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->backoff.initial, milliseconds(1000));
  EXPECT_EQ(spec->backoff.max, milliseconds(120000));
}

TEST(SpecParserTest, CheckpointSectionTurnsCheckpointsOnWithDefaults) {
  for (const char* section : {"checkpoint:\n", "checkpoint: {}\n", "checkpoint: {keep: 3}\n"}) {
    absl::StatusOr<JobSpec> spec =
        Parse(std::string("name: j\n") + section + "roles:\n  a: {command: [x]}\n");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(spec->checkpoint.configured) << section;
    EXPECT_EQ(spec->checkpoint.dir, "") << section;
    EXPECT_EQ(spec->checkpoint.keep, 3u) << section;
  }
}

TEST(SpecParserTest, PublishSectionGivesTheRepositoryAndKeep) {
  absl::StatusOr<JobSpec> spec = Parse(
      "name: j\npublish: {repository: ./models/, keep: 4}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->publish.configured);
  EXPECT_EQ(spec->publish.repository, "/jobs/demo/models");
  EXPECT_EQ(spec->publish.keep, 4u);
  spec = Parse("name: j\npublish: {repository: /srv/models}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->publish.repository, "/srv/models");
  EXPECT_EQ(spec->publish.keep, 0u);  // every version kept
  spec = Parse(
      "name: j\npublish: {repository: 'hdfs://nn:8020/models'}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->publish.repository, "hdfs://nn:8020/models");  // as given, not resolved
  spec = Parse("name: j\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->publish.configured);
}

TEST(SpecParserTest, BadPublishSectionsAreRefusedByLineAndKey) {
  auto refusal = [](const std::string& section) {
    return Refusal("name: j\n" + section + "roles:\n  a: {command: [x]}\n");
  };
  EXPECT_THAT(refusal("publish:\n"), HasSubstr("job.yaml:2: publish: must be a map with repository"));
  EXPECT_THAT(refusal("publish: {keep: 2}\n"), HasSubstr("job.yaml:2: publish: needs repository"));
  EXPECT_THAT(refusal("publish: {repository: ''}\n"),
              HasSubstr("job.yaml:2: publish.repository: must be a directory"));
  EXPECT_THAT(refusal("publish: {repository: ~/models}\n"),
              HasSubstr("publish.repository: '~' is not expanded"));
  EXPECT_THAT(refusal("publish: {repository: s3://bucket/models}\n"),
              HasSubstr("publish.repository: models go to a directory or to hdfs://"));
  for (const char* no_place : {"hdfs://", "hdfs:///models", "hdfs://:8020/models", "hdfs://nn",
                               "hdfs://nn:8020/"}) {
    EXPECT_THAT(refusal(std::string("publish: {repository: '") + no_place + "'}\n"),
                HasSubstr("publish.repository: must be hdfs://namenode[:port]/path"))
        << no_place;
  }
  EXPECT_THAT(refusal("publish: {repository: ./m, keep: 0}\n"), HasSubstr("publish.keep:"));
  EXPECT_THAT(refusal("publish: {repository: ./m, kept: 2}\n"),
              HasSubstr("publish.kept: unknown key"));
}

TEST(SpecParserTest, ResolvesCheckpointDirLikeWorkingDirAndKeepsUris) {
  auto dir_of = [](const std::string& value) {
    absl::StatusOr<JobSpec> spec =
        Parse("name: j\ncheckpoint: {dir: " + value + "}\nroles:\n  a: {command: [x]}\n");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? spec->checkpoint.dir : std::string();
  };
  EXPECT_EQ(dir_of("./ckpt"), "/jobs/demo/ckpt");
  EXPECT_EQ(dir_of("../shared/ckpt/"), "/jobs/shared/ckpt");
  EXPECT_EQ(dir_of("/data/ckpt/./x/"), "/data/ckpt/x");
  EXPECT_EQ(dir_of("hdfs://namenode:8020/user/me/ckpt"), "hdfs://namenode:8020/user/me/ckpt");
  EXPECT_EQ(dir_of("s3://bucket/run-1/"), "s3://bucket/run-1/");
}

TEST(SpecParserTest, ParseJobSpecFileResolvesCheckpointDirAgainstTheFilesDirectory) {
  std::filesystem::path dir = MakeTempDir("ckpt_dir");
  WriteText(dir / "job.yaml", "name: j\ncheckpoint: {dir: ckpt}\nroles:\n  a: {command: [x]}\n");
  absl::StatusOr<JobSpec> spec = ParseJobSpecFile((dir / "job.yaml").string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint.dir, (dir / "ckpt").lexically_normal().string());
}

TEST(SpecParserTest, ParsesDatasetOfShardFilesKeptAsWritten) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
dataset:
  shards: [data/a.npz, /abs/b.npz, "c d.npz", 7]
roles:
  a: {command: [x]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->dataset.configured);
  EXPECT_THAT(spec->dataset.files, ElementsAre("data/a.npz", "/abs/b.npz", "c d.npz", "7"));
  EXPECT_EQ(spec->dataset.samples, 0u);
  EXPECT_EQ(spec->dataset.shard_size, 0u);
  EXPECT_EQ(spec->dataset.epochs, 1u);
  EXPECT_EQ(spec->dataset.lease_timeout, milliseconds(60000));
  EXPECT_EQ(spec->dataset.NumShards(), 4u);
}

// --- Failure handling: refusals -----------------------------------------------------------------

TEST(SpecParserTest, RejectsUnknownOnFailureSuggestingTheClosest) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: restart_group
roles:
  w: {command: [x], on_failure: elastik}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:2: on_failure: unknown value 'restart_group'; did you mean "
                          "'restart-group'? accepted values: fail-job, restart-task, "
                          "restart-group, elastic",
                          "job.yaml:4: roles.w.on_failure: unknown value 'elastik'; did you mean "
                          "'elastic'? accepted values: fail-job, restart-task, restart-group, "
                          "elastic"));
}

TEST(SpecParserTest, RejectsOnFailureThatIsNotAName) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n    command: [x]\n    on_failure: [a]\n");
  EXPECT_EQ(msg, "job.yaml:5: roles.w.on_failure: must be one of fail-job, restart-task, "
                 "restart-group, elastic, got a list");
}

TEST(SpecParserTest, RejectsUnknownRestartMode) {
  std::string msg = Refusal("name: j\nrestart: onfailure\nroles:\n  w: {command: [x]}\n");
  EXPECT_EQ(msg, "job.yaml:2: restart: unknown value 'onfailure'; did you mean 'on-failure'? "
                 "accepted values: never, on-failure, always");
}

TEST(SpecParserTest, RejectsRestartNeverWithOnFailureOnTheSameRole) {
  std::string msg = Refusal(R"yaml(name: j
roles:
  w:
    command: [x]
    on_failure: restart-group
    restart: never
)yaml");
  EXPECT_EQ(msg, "job.yaml:6: roles.w.restart: restart: never contradicts on_failure: "
                 "restart-group; drop one of them");
}

TEST(SpecParserTest, RejectsRoleRestartNeverAgainstInheritedOnFailure) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: restart-group
roles:
  w:
    command: [x]
    restart: never
)yaml");
  EXPECT_EQ(msg, "job.yaml:6: roles.w.restart: restart: never contradicts on_failure: "
                 "restart-group (set on the job, line 2); drop one of them");
}

TEST(SpecParserTest, RejectsJobRestartNeverWithJobOnFailureOnce) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: elastic
restart: never
roles:
  a: {command: [x]}
  b: {command: [x]}
)yaml");
  EXPECT_EQ(msg, "job.yaml:3: restart: restart: never contradicts on_failure: elastic; drop one "
                 "of them");
}

TEST(SpecParserTest, RejectsJobRestartNeverInheritedByRoleWithOwnOnFailure) {
  std::string msg = Refusal(R"yaml(name: j
restart: never
roles:
  main: {command: [x]}
  ps:
    command: [x]
    on_failure: restart-task
)yaml");
  EXPECT_EQ(msg, "job.yaml:2: restart: restart: never contradicts on_failure: restart-task "
                 "(roles.ps.on_failure, line 7); drop one of them");
}

TEST(SpecParserTest, RejectsRestartAlwaysWithoutRestartTask) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: restart-group
roles:
  w: {command: [x], restart: always, untracked: true}
  v: {command: [x], restart: always, untracked: true, on_failure: fail-job}
  main: {command: [x]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:4: roles.w.restart: restart: always needs on_failure: "
                          "restart-task, got on_failure: restart-group (set on the job, line 2); "
                          "only a task restarted on its own may start again after exiting 0 (a "
                          "service such as an evaluator loop); use restart: on-failure",
                          "job.yaml:5: roles.v.restart: restart: always needs on_failure: "
                          "restart-task, got on_failure: fail-job; only a task restarted on its "
                          "own may start again after exiting 0 (a service such as an evaluator "
                          "loop); use restart: on-failure"));
}

TEST(SpecParserTest, RejectsJobRestartAlwaysWithTheDefaultOnFailure) {
  std::string msg = Refusal("name: j\nrestart: always\nroles:\n  w: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:2: restart: restart: always needs on_failure: "
                             "restart-task, got on_failure: fail-job (the default);"));
  EXPECT_EQ(Lines(msg).size(), 1u);
}

TEST(SpecParserTest, RejectsRestartAlwaysOnASuccessRole) {
  std::string msg = Refusal(R"yaml(name: j
success:
  roles: [worker]
roles:
  worker:
    command: [x]
    on_failure: restart-task
    restart: always
)yaml");
  EXPECT_EQ(msg, "job.yaml:8: roles.worker.restart: restart: always cannot apply to role worker, "
                 "which decides whether the job succeeded (success roles: worker): a task that "
                 "always restarts never finishes, so it could not decide success; use restart: "
                 "on-failure for it");
}

TEST(SpecParserTest, RejectsJobRestartAlwaysInheritedByDefaultSuccessRoles) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: restart-task
restart: always
roles:
  a: {command: [x]}
  b: {command: [x]}
  helper: {command: [x], untracked: true}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre(HasSubstr("job.yaml:3: restart: restart: always cannot apply to role "
                                    "a, which decides whether the job succeeded (success roles: "
                                    "a, b)"),
                          HasSubstr("job.yaml:3: restart: restart: always cannot apply to role "
                                    "b,")));
}

TEST(SpecParserTest, RejectsInstancesRangeWithoutElastic) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: restart-group
roles:
  w:
    command: [x]
    instances: {min: 2, max: 4}
  v:
    command: [x]
    instances: {min: 1, max: 2}
    on_failure: restart-task
  u:
    command: [x]
    instances: {min: 1, max: 2}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:6: roles.w.instances: {min, max} is only allowed with "
                          "on_failure: elastic, got on_failure: restart-group (set on the job, "
                          "line 2); write a plain integer, or set on_failure: elastic",
                          "job.yaml:9: roles.v.instances: {min, max} is only allowed with "
                          "on_failure: elastic, got on_failure: restart-task "
                          "(roles.v.on_failure, line 10); write a plain integer, or set "
                          "on_failure: elastic",
                          HasSubstr("job.yaml:13: roles.u.instances: {min, max} is only allowed "
                                    "with on_failure: elastic, got on_failure: restart-group")));
}

TEST(SpecParserTest, RejectsInstancesRangeWithTheDefaultOnFailure) {
  std::string msg = Refusal("name: j\nroles:\n  w: {command: [x], instances: {min: 1, max: 2}}\n");
  EXPECT_EQ(msg, "job.yaml:3: roles.w.instances: {min, max} is only allowed with on_failure: "
                 "elastic, got on_failure: fail-job (the default); write a plain integer, or set "
                 "on_failure: elastic");
}

TEST(SpecParserTest, RejectsBadInstancesRanges) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: elastic
roles:
  a: {command: [x], instances: {min: 5, max: 4}}
  b: {command: [x], instances: {min: 0, max: 4}}
  c: {command: [x], instances: {min: 1, max: 2, step: 1}}
  d: {command: [x], instances: {min: 2}}
  e: {command: [x], instances: {min: 1, max: 999999999}}
  f: {command: [x], instances: [1, 2]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:4: roles.a.instances.min: must not be more than max (4), "
                          "got 5",
                          "job.yaml:5: roles.b.instances.min: must be an integer >= 1, got 0",
                          "job.yaml:6: roles.c.instances.step: unknown key; accepted keys: min, "
                          "max",
                          "job.yaml:7: roles.d.instances.max: required; expected an integer >= 1, "
                          "e.g. {min: 2, max: 4}",
                          "job.yaml:8: roles.e.instances.max: must be at most 100000, got "
                          "999999999",
                          "job.yaml:9: roles.f.instances: must be an integer >= 1, or {min: 2, "
                          "max: 4} for an elastic role, got a list"));
}

TEST(SpecParserTest, BadOnFailureDoesNotCascadeIntoOtherRefusals) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: elastc
restart: never
roles:
  w: {command: [x], instances: {min: 1, max: 2}, restart: always}
)yaml");
  EXPECT_THAT(Lines(msg), ElementsAre(HasSubstr("job.yaml:2: on_failure: unknown value")));
}

TEST(SpecParserTest, RejectsBadMaxRestarts) {
  std::string msg = Refusal(R"yaml(name: j
max_restarts: -1
roles:
  a: {command: [x], max_restarts: 1.5}
  b: {command: [x], max_restarts: lots}
  c: {command: [x], max_restarts: 5000000}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:2: max_restarts: must be an integer >= 0, got -1",
                          "job.yaml:4: roles.a.max_restarts: must be an integer >= 0, got 1.5",
                          "job.yaml:5: roles.b.max_restarts: must be an integer >= 0, got 'lots'",
                          "job.yaml:6: roles.c.max_restarts: must be at most 1000000, got "
                          "5000000"));
}

TEST(SpecParserTest, RejectsNegativeOrMalformedDurations) {
  std::string msg = Refusal(R"yaml(name: j
progress_timeout: -5s
roles:
  a: {command: [x], progress_timeout: -3}
  b: {command: [x], progress_timeout: 5x}
  c: {command: [x], progress_timeout: [1s]}
  d: {command: [x], progress_timeout: 1h30m}
  e: {command: [x], progress_timeout:}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:2: progress_timeout: must be a duration such as 500ms, 30s "
                          "or 2m, got '-5s'",
                          "job.yaml:4: roles.a.progress_timeout: must be a duration such as "
                          "500ms, 30s or 2m, got -3",
                          "job.yaml:5: roles.b.progress_timeout: must be a duration such as "
                          "500ms, 30s or 2m, got '5x'",
                          "job.yaml:6: roles.c.progress_timeout: must be a duration such as "
                          "500ms, 30s or 2m, got a list",
                          "job.yaml:7: roles.d.progress_timeout: must be a duration such as "
                          "500ms, 30s or 2m, got '1h30m'",
                          "job.yaml:8: roles.e.progress_timeout: must be a duration such as "
                          "500ms, 30s or 2m, got nothing"));
}

TEST(SpecParserTest, RejectsBackoffMaxBelowInitial) {
  std::string msg = Refusal(R"yaml(name: j
backoff:
  initial: 30s
  max: 1s
roles:
  a: {command: [x]}
)yaml");
  EXPECT_EQ(msg, "job.yaml:4: backoff.max: must be at least initial (30s), got 1s");
}

TEST(SpecParserTest, RejectsBackoffBoundBeyondTheOtherDefault) {
  EXPECT_EQ(Refusal("name: j\nbackoff: {max: 500ms}\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: backoff.max: must be at least initial (1s, the default), got 500ms");
  EXPECT_EQ(Refusal("name: j\nbackoff: {initial: 1m}\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: backoff.initial: must be at most max (30s, the default), got 1m");
}

TEST(SpecParserTest, RejectsBadBackoffSection) {
  std::string msg = Refusal(R"yaml(name: j
backoff:
  initial: soon
  maxx: 30s
roles:
  a: {command: [x]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:3: backoff.initial: must be a duration such as 500ms, 30s or "
                          "2m, got 'soon'",
                          "job.yaml:4: backoff.maxx: unknown key; did you mean 'max'? "
                          "accepted keys: initial, max"));
  EXPECT_EQ(Refusal("name: j\nbackoff: 5s\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: backoff: must be a map with initial and/or max, e.g. {initial: 1s, max: "
            "30s}, got '5s'");
}

TEST(SpecParserTest, RejectsBadHeartbeat) {
  std::string msg = Refusal(R"yaml(name: j
heartbeat:
  interval: 5ms
  misses: 0
  timeout: 3s
roles:
  a: {command: [x]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:3: heartbeat.interval: must be at least 10ms, got 5ms",
                          "job.yaml:4: heartbeat.misses: must be an integer >= 1, got 0",
                          "job.yaml:5: heartbeat.timeout: unknown key; accepted keys: interval, "
                          "misses"));
  EXPECT_THAT(Refusal("name: j\nheartbeat: {interval: 0}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: heartbeat.interval: must be at least 10ms, got 0s"));
  EXPECT_THAT(Refusal("name: j\nheartbeat: [1s]\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: heartbeat: must be a map with interval and/or misses"));
}

TEST(SpecParserTest, RejectsBadCheckpoint) {
  std::string msg = Refusal(R"yaml(name: j
checkpoint:
  dir: ""
  keep: 0
  every: 100
roles:
  a: {command: [x]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:3: checkpoint.dir: must be a directory path, absolute or "
                          "relative to the job file, or a URI such as hdfs://nn/ckpt (leave it "
                          "out for the default), got ''",
                          "job.yaml:4: checkpoint.keep: must be an integer >= 1, got 0",
                          "job.yaml:5: checkpoint.every: unknown key; accepted keys: dir, keep"));
  EXPECT_THAT(Refusal("name: j\ncheckpoint: {dir: ~/ckpt}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: checkpoint.dir: '~' is not expanded;"));
  EXPECT_THAT(Refusal("name: j\ncheckpoint: {dir: [a]}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: checkpoint.dir: must be a directory path"));
  EXPECT_THAT(Refusal("name: j\ncheckpoint: ./ckpt\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: checkpoint: must be a map with dir and/or keep, e.g. {dir: "
                        "./ckpt, keep: 3}, got './ckpt'"));
}

TEST(SpecParserTest, RejectsDatasetWithBothShardsAndSamples) {
  std::string msg = Refusal(R"yaml(name: j
dataset:
  shards: [a.npz]
  samples: 100
  shard_size: 10
roles:
  a: {command: [x]}
)yaml");
  EXPECT_EQ(msg, "job.yaml:4: dataset.samples: cannot be given together with dataset.shards "
                 "(line 3); a dataset is either shards (a list of files, e.g. [a.npz, b.npz]), "
                 "samples and shard_size (e.g. samples: 1797, shard_size: 64) or parquet (a "
                 "Parquet dataset, e.g. parquet: ./digits.parquet)");
}

TEST(SpecParserTest, RejectsDatasetWithNeitherShardsNorSamples) {
  EXPECT_EQ(Refusal("name: j\ndataset: {epochs: 2}\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: dataset: needs either shards (a list of files, e.g. [a.npz, b.npz]), "
            "samples and shard_size (e.g. samples: 1797, shard_size: 64) or parquet (a Parquet "
            "dataset, e.g. parquet: ./digits.parquet)");
  EXPECT_EQ(Refusal("name: j\ndataset:\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: dataset: must be a map with either shards (a list of files, e.g. "
            "[a.npz, b.npz]), samples and shard_size (e.g. samples: 1797, shard_size: 64) or "
            "parquet (a Parquet dataset, e.g. parquet: ./digits.parquet), got nothing");
}

TEST(SpecParserTest, RejectsSamplesAndShardSizeWithoutEachOther) {
  EXPECT_EQ(Refusal("name: j\ndataset:\n  samples: 100\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: dataset.shard_size: required with samples; expected an integer >= 1, "
            "e.g. shard_size: 64");
  EXPECT_EQ(Refusal("name: j\ndataset:\n  shard_size: 10\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: dataset.samples: required with shard_size; expected an integer >= 1, "
            "e.g. samples: 1797");
  EXPECT_EQ(Refusal("name: j\ndataset:\n  shards: [a]\n  shard_size: 10\nroles:\n  a: {command: "
                    "[x]}\n"),
            "job.yaml:4: dataset.shard_size: only goes with samples; with shards each file is "
            "one shard, so drop it");
}

TEST(SpecParserTest, RejectsBadDatasetValues) {
  std::string msg = Refusal(R"yaml(name: j
dataset:
  samples: 0
  shard_size: -4
  epochs: 0
  lease_timeout: 0
  lease_timout: 60s
roles:
  a: {command: [x]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:3: dataset.samples: must be an integer >= 1, got 0",
                          "job.yaml:4: dataset.shard_size: must be an integer >= 1, got -4",
                          "job.yaml:5: dataset.epochs: must be an integer >= 1, got 0",
                          "job.yaml:6: dataset.lease_timeout: must be longer than 0, e.g. 60s, "
                          "got 0s",
                          "job.yaml:7: dataset.lease_timout: unknown key; did you mean "
                          "'lease_timeout'? "
                          "accepted keys: shards, samples, shard_size, epochs, lease_timeout, "
                          "parquet"));
}

TEST(SpecParserTest, RejectsBadShardLists) {
  EXPECT_EQ(Refusal("name: j\ndataset: {shards: []}\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: dataset.shards: must name at least one file, e.g. [a.npz, b.npz]");
  EXPECT_EQ(Refusal("name: j\ndataset: {shards: a.npz}\nroles:\n  a: {command: [x]}\n"),
            "job.yaml:2: dataset.shards: must be a list of files, e.g. [a.npz, b.npz], got "
            "'a.npz'");
  std::string msg = Refusal(R"yaml(name: j
dataset:
  shards:
    - a.npz
    - ""
    - [b.npz]
roles:
  a: {command: [x]}
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre("job.yaml:5: dataset.shards[1]: must not be empty; expected a file "
                          "name such as a.npz",
                          "job.yaml:6: dataset.shards[2]: must be a file name, got a list"));
}

TEST(SpecParserTest, ParsesParquetDatasetResolvedAgainstTheJobFile) {
  auto spec = Parse(R"yaml(name: j
dataset:
  parquet: data/../digits.parquet/
  epochs: 2
  lease_timeout: 30s
roles:
  a: {command: [x]}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->dataset.configured);
  EXPECT_EQ(spec->dataset.parquet, "/jobs/demo/digits.parquet");
  EXPECT_EQ(spec->dataset.parquet_line, 3);
  // Filled from the listing fixed at submission, not by the parser.
  EXPECT_TRUE(spec->dataset.files.empty());
  EXPECT_EQ(spec->dataset.epochs, 2u);
  EXPECT_EQ(spec->dataset.lease_timeout, milliseconds(30000));

  auto absolute = Parse("name: j\ndataset: {parquet: /data/d}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_EQ(absolute->dataset.parquet, "/data/d");
  auto hdfs = Parse(
      "name: j\ndataset: {parquet: 'hdfs://nn:8020/data/digits'}\nroles:\n  a: {command: [x]}\n");
  ASSERT_TRUE(hdfs.ok()) << hdfs.status();
  EXPECT_EQ(hdfs->dataset.parquet, "hdfs://nn:8020/data/digits");
}

TEST(SpecParserTest, RejectsParquetWithAnotherDatasetForm) {
  EXPECT_EQ(Refusal("name: j\ndataset:\n  shards: [a.npz]\n  parquet: d\nroles:\n  a: "
                    "{command: [x]}\n"),
            "job.yaml:4: dataset.parquet: cannot be given together with dataset.shards (line 3); "
            "a dataset is either shards (a list of files, e.g. [a.npz, b.npz]), samples and "
            "shard_size (e.g. samples: 1797, shard_size: 64) or parquet (a Parquet dataset, e.g. "
            "parquet: ./digits.parquet)");
  EXPECT_THAT(Refusal("name: j\ndataset:\n  parquet: d\n  samples: 10\n  shard_size: 2\nroles:\n"
                      "  a: {command: [x]}\n"),
              HasSubstr("job.yaml:4: dataset.samples: cannot be given together with "
                        "dataset.parquet (line 3); a dataset is either"));
  EXPECT_EQ(Refusal("name: j\ndataset:\n  parquet: d\n  shard_size: 2\nroles:\n  a: {command: "
                    "[x]}\n"),
            "job.yaml:4: dataset.shard_size: only goes with samples; with parquet each Parquet "
            "file is one shard, so drop it");
}

TEST(SpecParserTest, RejectsBadParquetLocations) {
  auto refusal = [](const std::string& value) {
    return Refusal("name: j\ndataset:\n  parquet: " + value + "\nroles:\n  a: {command: [x]}\n");
  };
  constexpr char kForm[] =
      "a Parquet file or a directory of them (as Spark writes it), absolute or relative to the "
      "job file, or hdfs://namenode[:port]/path, e.g. ./digits.parquet";
  EXPECT_EQ(refusal("''"),
            absl::StrCat("job.yaml:3: dataset.parquet: must be ", kForm, ", got ''"));
  EXPECT_EQ(refusal("[a, b]"),
            absl::StrCat("job.yaml:3: dataset.parquet: must be ", kForm, ", got a list"));
  EXPECT_EQ(refusal("~/digits"),
            absl::StrCat("job.yaml:3: dataset.parquet: '~' is not expanded; must be ", kForm,
                         ", got '~/digits'"));
  EXPECT_EQ(refusal("'s3://bucket/digits'"),
            "job.yaml:3: dataset.parquet: a Parquet dataset is read from a local path or from "
            "hdfs://namenode[:port]/path, got 's3://bucket/digits'");
  for (const char* uri : {"'hdfs:///data'", "'hdfs://nn'", "'hdfs://nn/'", "'hdfs://:8020/d'"}) {
    EXPECT_THAT(refusal(uri),
                HasSubstr("job.yaml:3: dataset.parquet: must be hdfs://namenode[:port]/path, a "
                          "NameNode host and a path below it"))
        << uri;
  }
  EXPECT_EQ(refusal("\"a\\0b\""),
            "job.yaml:3: dataset.parquet: must not contain a NUL byte (\\x00): paths, "
            "arguments and environment variables end at the first one");
}

TEST(SpecParserTest, ReportsEveryFailureHandlingErrorInFileOrder) {
  std::string msg = Refusal(R"yaml(name: j
on_failure: restart-group
max_restarts: many
heartbeat: {interval: 1ms}
dataset: {shards: [a], samples: 3}
roles:
  worker:
    command: [x]
    restart: never
    instances: {min: 3, max: 2}
    progress_timeout: forever
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre(HasSubstr("job.yaml:3: max_restarts: must be an integer >= 0"),
                          HasSubstr("job.yaml:4: heartbeat.interval: must be at least 10ms"),
                          HasSubstr("job.yaml:5: dataset.samples: cannot be given together"),
                          HasSubstr("job.yaml:9: roles.worker.restart: restart: never "
                                    "contradicts on_failure: restart-group"),
                          HasSubstr("job.yaml:10: roles.worker.instances.min: must not be more "
                                    "than max (2), got 3"),
                          HasSubstr("job.yaml:10: roles.worker.instances: {min, max} is only "
                                    "allowed with on_failure: elastic"),
                          HasSubstr("job.yaml:11: roles.worker.progress_timeout: must be a "
                                    "duration")));
}

// --- YAML and files -----------------------------------------------------------------------------

TEST(SpecParserTest, ReportsYamlSyntaxErrorWithLineAndColumn) {
  std::string msg = Refusal("name: j\nroles:\n  a: {command: [x, y}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3:"));
  EXPECT_THAT(msg, HasSubstr("invalid YAML: "));
}

TEST(SpecParserTest, ReportsUndefinedAliasAsYamlError) {
  EXPECT_THAT(Refusal("name: *nope\n"), HasSubstr("job.yaml:1:7: invalid YAML: "));
}

TEST(SpecParserTest, RejectsMissingFileNamingThePath) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecFile("/nonexistent/dir/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "/nonexistent/dir/job.yaml: cannot read the job file: No such file or directory");
}

// Issue 24: the client validated one read of the job file and stored another as spec.yaml.
// ReadJobFile hands back the very bytes it validated, whatever they hold.
TEST(SpecParserTest, ReadJobFileReturnsTheBytesItValidated) {
  std::filesystem::path dir = MakeTempDir("read_once");
  std::string text = "# kept\r\nname: j\r\nroles:\r\n  a: {command: [x]}  # no newline at end";
  WriteText(dir / "job.yaml", text);
  absl::StatusOr<JobFile> file = ReadJobFile((dir / "job.yaml").string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->text, text);
  EXPECT_EQ(file->spec.name, "j");
  EXPECT_EQ(file->spec.source_path, (dir / "job.yaml").string());
}

// A pipe can be read only once: `shoal run <(generate-job)` works only if nothing reads the
// job file a second time.
TEST(SpecParserTest, ReadJobFileReadsAPipeOnce) {
  std::filesystem::path dir = MakeTempDir("pipe");
  std::string fifo = (dir / "job.yaml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string text = "name: piped\nroles:\n  a: {command: [x]}\n";
  ::signal(SIGPIPE, SIG_IGN);  // a reader that gives up must fail the test, not kill it
  std::thread writer([&] {
    int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
    ::close(fd);
  });
  absl::StatusOr<JobFile> file = ReadJobFile(fifo);
  // Lets the writer go should the reader never have opened the pipe.
  if (int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); fd >= 0) ::close(fd);
  writer.join();
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->text, text);
  EXPECT_EQ(file->spec.name, "piped");
}

TEST(SpecParserTest, RejectsDirectoryGivenAsJobFile) {
  std::filesystem::path dir = MakeTempDir("a_dir");
  absl::StatusOr<JobSpec> spec = ParseJobSpecFile(dir.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              AllOf(HasSubstr(dir.string()), HasSubstr("not a regular file")));
}

// Root reads any file whatever its mode, so a directory stands in for an unreadable file: the
// read fails for every user and the message must still name the path.
TEST(SpecParserTest, RejectsUnreadableFileNamingThePath) {
  std::filesystem::path dir = MakeTempDir("unreadable");
  std::filesystem::create_directories(dir / "job.yaml");
  absl::StatusOr<JobSpec> spec = ParseJobSpecFile((dir / "job.yaml").string());
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr((dir / "job.yaml").string()));
}

// --- All errors at once -------------------------------------------------------------------------

TEST(SpecParserTest, ReportsEveryErrorInFileOrder) {
  std::string msg = Refusal(R"yaml(name: bad name
framework: mpich
roles:
  worker:
    instances: 0
    command: []
    resources: {cpus: lots, gpu: 1, memory: "2GB?"}
    depends_on: [ghost]
  ps:
    untracked: maybe
)yaml");
  EXPECT_THAT(Lines(msg),
              ElementsAre(HasSubstr("job.yaml:1: name: must be"),
                          HasSubstr("job.yaml:2: framework: unknown framework 'mpich'"),
                          HasSubstr("job.yaml:5: roles.worker.instances: must be an integer"),
                          HasSubstr("job.yaml:6: roles.worker.command: must not be empty"),
                          HasSubstr("job.yaml:7: roles.worker.resources.gpu: unknown key"),
                          HasSubstr("job.yaml:7: roles.worker.resources.cpus: must be a number"),
                          HasSubstr("job.yaml:7: roles.worker.resources.memory: '2GB?'"),
                          HasSubstr("job.yaml:8: roles.worker.depends_on: 'ghost'"),
                          HasSubstr("job.yaml:9: roles.ps.command: required"),
                          HasSubstr("job.yaml:10: roles.ps.untracked: must be true or false")));
}

// --- Issue 23: job files that validated but could not run ---------------------------------------

TEST(SpecParserTest, RejectsEnvVariableOverTheKernelsLimitForOneString) {
  std::string yaml = "name: j\nroles:\n  w:\n    command: [x]\n    env:\n      BIG: \"" +
                     std::string(200 * 1024, 'a') + "\"\n";
  std::string msg = Refusal(yaml);
  EXPECT_THAT(msg, HasSubstr("job.yaml:6: roles.w.env.BIG: NAME=value is 204804 bytes"));
  EXPECT_THAT(msg, HasSubstr("MAX_ARG_STRLEN"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(32 * ::sysconf(_SC_PAGESIZE) - 1)));
}

TEST(SpecParserTest, RejectsCommandArgumentOverTheKernelsLimitForOneString) {
  std::string yaml = "name: j\nroles:\n  w:\n    command: [x, \"" +
                     std::string(200 * 1024, 'a') + "\"]\n";
  EXPECT_THAT(Refusal(yaml), HasSubstr("job.yaml:4: roles.w.command[1]: is 204800 bytes"));
}

TEST(SpecParserTest, RejectsEnvAndCommandOverArgMax) {
  // 48 variables of 64 KiB: each within MAX_ARG_STRLEN, 3 MiB in all.
  std::string yaml = "name: j\nroles:\n  w:\n    command: [x]\n    env:\n";
  for (int i = 0; i < 48; ++i) {
    yaml += "      V" + std::to_string(i) + ": \"" + std::string(64 * 1024, 'a') + "\"\n";
  }
  std::string msg = Refusal(yaml);
  ASSERT_EQ(Lines(msg).size(), 1u) << msg;
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: roles.w.env: the role's env and command take "));
  EXPECT_THAT(msg, HasSubstr("64KiB kept for the variables Shoal adds"));
  EXPECT_THAT(msg, HasSubstr("(ARG_MAX)"));
}

TEST(SpecParserTest, AcceptsEnvWellWithinArgMax) {
  std::string yaml = "name: j\nroles:\n  w:\n    command: [x]\n    env:\n      V: \"" +
                     std::string(100 * 1024, 'a') + "\"\n";
  ASSERT_TRUE(Parse(yaml).ok()) << Parse(yaml).status();
}

TEST(SpecParserTest, RejectsNulBytesInPathsCommandsAndEnv) {
  std::string msg = Refusal(R"(name: j
roles:
  w:
    command: ["py\0thon"]
    working_dir: "/tmp\0/x"
    env: {A: "x\0y"}
  v:
    command: "echo \0"
checkpoint: {dir: "ck\0pt"}
)");
  auto lines = Lines(msg);
  ASSERT_EQ(lines.size(), 5u) << msg;
  EXPECT_THAT(lines[0], HasSubstr("job.yaml:4: roles.w.command[0]: must not contain a NUL byte"));
  EXPECT_THAT(lines[1], HasSubstr("job.yaml:5: roles.w.working_dir: must not contain a NUL"));
  EXPECT_THAT(lines[2], HasSubstr("job.yaml:6: roles.w.env.A: must not contain a NUL"));
  EXPECT_THAT(lines[3], HasSubstr("job.yaml:8: roles.v.command: must not contain a NUL"));
  EXPECT_THAT(lines[4], HasSubstr("job.yaml:9: checkpoint.dir: must not contain a NUL"));
}

TEST(SpecParserTest, RejectsAFractionOfAByteAsMemory) {
  EXPECT_THAT(Refusal("name: j\nroles:\n  w:\n    command: [x]\n    resources: {memory: 1.5B}\n"),
              HasSubstr("job.yaml:5: roles.w.resources.memory: '1.5B' is not a whole number of "
                        "bytes"));
}

TEST(SpecParserTest, RejectsZeroMemorySayingToOmitTheKey) {
  EXPECT_THAT(Refusal("name: j\nroles:\n  w:\n    command: [x]\n    resources: {memory: 0}\n"),
              HasSubstr("job.yaml:5: roles.w.resources.memory: must be more than 0, got 0; leave "
                        "the key out for no memory limit"));
}

TEST(SpecParserTest, RejectsCheckpointUriWithoutHostOrPath) {
  for (const char* dir : {"hdfs://", "hdfs:///", "s3://"}) {
    EXPECT_THAT(Refusal(absl::StrCat("name: j\ncheckpoint: {dir: \"", dir,
                                     "\"}\nroles:\n  w: {command: [x]}\n")),
                HasSubstr("job.yaml:2: checkpoint.dir: must name a place after"))
        << dir;
  }
  ASSERT_TRUE(Parse("name: j\ncheckpoint: {dir: \"hdfs:///ckpt\"}\nroles:\n  w: {command: [x]}\n")
                  .ok());
}

TEST(SpecParserTest, RejectsBlankProgramName) {
  EXPECT_THAT(Refusal("name: j\nroles:\n  w:\n    command: [\" \", a]\n"),
              HasSubstr("job.yaml:4: roles.w.command[0]: the program must not be empty or blank"));
}

TEST(CheckPortsFitTest, RefusesMoreTasksThanTheAgentHasPortsNamingTheNumbers) {
  absl::StatusOr<JobSpec> spec = Parse(
      "name: j\nroles:\n  ps: {command: [x]}\n  worker:\n    instances: 100000\n"
      "    command: [x]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::Status st = CheckPortsFit(*spec, 38232, "22768-32767 for tasks and 32768-60999");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(),
              HasSubstr("job.yaml:5: roles.worker.instances: the job's 100001 tasks need one "
                        "port each on this machine, and its agent can hand out at most 38232 "
                        "(ports 22768-32767 for tasks and 32768-60999)"));
  EXPECT_TRUE(CheckPortsFit(*spec, 100001, "x").ok());
}

// --- Issue 23: YAML merge keys and aliases -----------------------------------------------------

TEST(SpecParserTest, MergeKeyBringsInAnAnchoredRoleAndOwnKeysWin) {
  absl::StatusOr<JobSpec> spec = Parse(R"(name: j
roles:
  worker: &common
    instances: 2
    command: [python3, train.py]
    env: {A: "1"}
    resources: {cpus: 0.5}
  evaluator:
    <<: *common
    instances: 1
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Role* ev = spec->FindRole("evaluator");
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->instances, 1u);
  EXPECT_THAT(ev->argv, ElementsAre("python3", "train.py"));
  EXPECT_THAT(ev->env, ElementsAre(Pair("A", "1")));
  EXPECT_DOUBLE_EQ(ev->resources.cpus, 0.5);
}

TEST(SpecParserTest, MergeKeyTakesAListWhereEarlierMapsWin) {
  absl::StatusOr<JobSpec> spec = Parse(R"(name: j
roles:
  a: &a {command: [a], instances: 3, resources: &ra {cpus: 0.25}}
  b: &b {command: [b], untracked: true, resources: {cpus: 0.5, memory: 1GiB}}
  c:
    <<: [*a, *b]
    resources: {<<: *ra, memory: 2GiB}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Role* c = spec->FindRole("c");
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->argv, ElementsAre("a"));
  EXPECT_EQ(c->instances, 3u);
  EXPECT_TRUE(c->untracked);
  EXPECT_DOUBLE_EQ(c->resources.cpus, 0.25);
  EXPECT_EQ(c->resources.memory_bytes, 2ull << 30);
}

TEST(SpecParserTest, ExplicitKeyWinsOverAMergeWrittenAfterIt) {
  absl::StatusOr<JobSpec> spec = Parse(
      "name: j\nx: &x {instances: 4}\nroles:\n  w: {instances: 2, <<: *x, command: [y]}\n");
  // x is an unknown top-level key: the anchor must live on a key the file may hold.
  ASSERT_FALSE(spec.ok());
  spec = Parse("name: j\nroles:\n  v: &x {instances: 4, command: [v]}\n"
               "  w: {instances: 2, <<: *x, command: [y]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->FindRole("w")->instances, 2u);
  EXPECT_THAT(spec->FindRole("w")->argv, ElementsAre("y"));
}

TEST(SpecParserTest, ErrorsInsideAMergedMapPointAtTheMerge) {
  std::string msg = Refusal(R"(name: j
roles:
  worker: &common
    command: [x]
    resources: {cpus: lots}
  evaluator:
    <<: *common
)");
  auto lines = Lines(msg);
  ASSERT_EQ(lines.size(), 2u) << msg;
  EXPECT_THAT(lines[0], HasSubstr("job.yaml:5: roles.worker.resources.cpus: must be a number"));
  EXPECT_THAT(lines[1], HasSubstr("job.yaml:7: roles.evaluator.resources.cpus: must be a number"));
}

TEST(SpecParserTest, ErrorsInsideAnAliasPointAtTheAlias) {
  std::string msg = Refusal(R"(name: j
roles:
  worker:
    command: [x]
    env: &env {A: [1]}
  evaluator:
    command: [x]
    env: *env
    depends_on: &deps [worker, nobody]
  ps:
    command: [x]
    depends_on: *deps
)");
  auto lines = Lines(msg);
  ASSERT_EQ(lines.size(), 4u) << msg;
  EXPECT_THAT(lines[0], HasSubstr("job.yaml:5: roles.worker.env.A: must be a string"));
  EXPECT_THAT(lines[1], HasSubstr("job.yaml:8: roles.evaluator.env.A: must be a string"));
  EXPECT_THAT(lines[2], HasSubstr("job.yaml:9: roles.evaluator.depends_on: 'nobody'"));
  EXPECT_THAT(lines[3], HasSubstr("job.yaml:12: roles.ps.depends_on: 'nobody'"));
}

TEST(SpecParserTest, RejectsAMergeOfSomethingOtherThanAMap) {
  EXPECT_THAT(Refusal("name: j\nroles:\n  w:\n    <<: [x]\n    command: [y]\n"),
              HasSubstr("job.yaml:4: roles.w.<<[0]: must be a map to merge in"));
  EXPECT_THAT(Refusal("name: j\nroles:\n  w:\n    '<<': {a: 1}\n    command: [y]\n"),
              HasSubstr("job.yaml:4: roles.w.<<: unknown key"));
}

TEST(SpecParserTest, AMapThatMergesItselfIsRefusedNotLooped) {
  std::string msg = Refusal("name: j\nroles:\n  w: &w {<<: *w, command: [y]}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: roles.w"));
}

// --- Issue 23: messages that did not say what was wrong ----------------------------------------

TEST(SpecParserTest, TabsInIndentationAreNamedAsSuch) {
  std::string msg = Refusal("name: j\nroles:\n  w:\n\tcommand: [x]\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:4:1: invalid YAML: a tab is used for indentation; YAML "
                             "allows only spaces there, so indent with spaces"));
}

TEST(SpecParserTest, DeepNestingIsRefusedBeforeTheYamlParserRecurses) {
  for (size_t depth : {size_t{101}, size_t{100000}, size_t{1000000}}) {
    std::string flow = "name: j\nroles: " + std::string(depth, '[') + std::string(depth, ']');
    EXPECT_THAT(Refusal(flow), HasSubstr("job.yaml:2:" + std::to_string(8 + 100 - 1) +
                                         ": invalid job file: maps and lists nest more than "
                                         "100 levels deep"))
        << depth;
    std::string dashes = "name: j\nroles:\n";
    for (size_t i = 0; i < depth; ++i) dashes += "- ";
    dashes += "x\n";
    EXPECT_THAT(Refusal(dashes), HasSubstr("invalid job file: maps and lists nest more than"))
        << depth;
  }
  std::string maps = "name: j\nroles:\n";
  for (int i = 0; i < 200; ++i) maps += std::string(i + 1, ' ') + "a:\n";
  EXPECT_THAT(Refusal(maps), HasSubstr("job.yaml:102:"));
}

TEST(SpecParserTest, NestingOfAnOrdinaryJobFileIsAccepted) {
  absl::StatusOr<JobSpec> spec = Parse(R"yaml(name: j
roles:
  w:
    command: ["python3", "-c", "print([[[[1]]]], '[[[[')"]
    env: {A: "[[[[[[", B: '{{{{'}   # [[[[ in a comment
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
}

TEST(SpecParserTest, EscapesControlBytesInMessages) {
  std::string msg = Refusal("name: \"a\\0b\\tc\\x1b\"\nroles:\n  w: {command: [x]}\n");
  EXPECT_THAT(msg, HasSubstr("got 'a\\x00b\\tc\\x1b'"));
  EXPECT_EQ(msg.find('\0'), std::string::npos);
  EXPECT_EQ(msg.find('\t'), std::string::npos);
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec("name: j\nroles:\n  \"w\\x01\": {command: [x]}\n", "a\tb.yaml", kBaseDir);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("a\\tb.yaml:3: roles.w\\x01: role names"));
}

// --- CheckFitsMachine ---------------------------------------------------------------------------

machine::MachineInventory SmallMachine() {
  machine::MachineInventory m;
  m.hostname = "box";
  m.cpus = 2;
  m.memory_bytes = 8ull << 30;
  m.gpus = {"0", "1"};
  return m;
}

Role MakeRole(const std::string& name, uint32_t instances, double cpus, uint64_t memory,
              uint32_t gpus, int line) {
  Role r;
  r.name = name;
  r.instances = instances;
  r.argv = {"x"};
  r.resources = {cpus, memory, gpus};
  r.line = line;
  return r;
}

JobSpec MakeSpec(std::vector<Role> roles) {
  JobSpec spec;
  spec.name = "j";
  spec.source_path = "job.yaml";
  spec.roles = std::move(roles);
  return spec;
}

TEST(CheckFitsMachineTest, AcceptsJobThatFitsExactly) {
  JobSpec spec = MakeSpec({MakeRole("worker", 2, 1, 4ull << 30, 1, 5)});
  EXPECT_TRUE(CheckFitsMachine(spec, SmallMachine()).ok());
}

TEST(CheckFitsMachineTest, SumsFractionalCpusWithoutRoundingErrors) {
  JobSpec spec = MakeSpec({MakeRole("worker", 10, 0.1, 0, 0, 5), MakeRole("ps", 1, 1, 0, 0, 9)});
  EXPECT_TRUE(CheckFitsMachine(spec, SmallMachine()).ok());
}

TEST(CheckFitsMachineTest, RejectsTotalCpusAboveTheMachineWithBreakdown) {
  JobSpec spec = MakeSpec({MakeRole("worker", 32, 2, 0, 0, 5)});
  machine::MachineInventory machine = SmallMachine();
  machine.cpus = 2;
  absl::Status st = CheckFitsMachine(spec, machine);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "job.yaml:5: roles.worker.resources.cpus: the job needs 64 CPUs in total (32 x worker "
            "at 2), this machine has 2");
}

TEST(CheckFitsMachineTest, NamesEveryContributingRoleAndPointsAtTheResourceKey) {
  JobSpec spec = MakeSpec({MakeRole("ps", 1, 0.5, 0, 0, 3), MakeRole("worker", 3, 1, 0, 0, 6)});
  spec.roles[0].resource_lines.cpus = 4;
  absl::Status st = CheckFitsMachine(spec, SmallMachine());
  EXPECT_EQ(st.message(),
            "job.yaml:4: roles.ps.resources.cpus: the job needs 3.5 CPUs in total (1 x ps at 0.5 "
            "+ 3 x worker at 1), this machine has 2");
}

TEST(CheckFitsMachineTest, RejectsTotalMemoryAboveTheMachine) {
  JobSpec spec = MakeSpec({MakeRole("worker", 2, 1, 6ull << 30, 0, 5)});
  spec.roles[0].resource_lines.memory = 8;
  absl::Status st = CheckFitsMachine(spec, SmallMachine());
  EXPECT_EQ(st.message(),
            "job.yaml:8: roles.worker.resources.memory: the job needs 12GiB of memory in total "
            "(2 x worker at 6GiB), this machine has 8GiB");
}

TEST(CheckFitsMachineTest, RejectsGpusOnAMachineWithoutGpus) {
  JobSpec spec = MakeSpec({MakeRole("worker", 2, 1, 0, 1, 5)});
  machine::MachineInventory machine = SmallMachine();
  machine.gpus.clear();
  absl::Status st = CheckFitsMachine(spec, machine);
  EXPECT_EQ(st.message(),
            "job.yaml:5: roles.worker.resources.gpus: one worker task needs 1 GPU, this machine "
            "has 0");
}

TEST(CheckFitsMachineTest, RejectsTotalGpusAboveTheMachine) {
  JobSpec spec = MakeSpec({MakeRole("worker", 3, 0.5, 0, 1, 5)});
  absl::Status st = CheckFitsMachine(spec, SmallMachine());
  EXPECT_EQ(st.message(),
            "job.yaml:5: roles.worker.resources.gpus: the job needs 3 GPUs in total (3 x worker "
            "at 1), this machine has 2");
}

TEST(CheckFitsMachineTest, RejectsSingleTaskLargerThanTheMachineWithoutRepeatingTheTotal) {
  JobSpec spec = MakeSpec({MakeRole("worker", 4, 3, 0, 0, 5)});
  spec.roles[0].resource_lines.cpus = 7;
  absl::Status st = CheckFitsMachine(spec, SmallMachine());
  EXPECT_EQ(st.message(),
            "job.yaml:7: roles.worker.resources.cpus: one worker task needs 3 CPUs, this machine "
            "has 2");
}

TEST(CheckFitsMachineTest, ReportsEveryResourceThatDoesNotFit) {
  JobSpec spec = MakeSpec({MakeRole("worker", 4, 1, 4ull << 30, 1, 5)});
  absl::Status st = CheckFitsMachine(spec, SmallMachine());
  EXPECT_THAT(Lines(std::string(st.message())),
              ElementsAre(HasSubstr("resources.cpus: the job needs 4 CPUs"),
                          HasSubstr("resources.memory: the job needs 16GiB of memory"),
                          HasSubstr("resources.gpus: the job needs 4 GPUs")));
}

TEST(CheckFitsMachineTest, WorksOnParsedSpecs) {
  absl::StatusOr<JobSpec> spec = Parse(kFullExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  machine::MachineInventory machine = SmallMachine();
  machine.cpus = 4.5;
  EXPECT_TRUE(CheckFitsMachine(*spec, machine).ok());
  machine.cpus = 4;
  EXPECT_EQ(CheckFitsMachine(*spec, machine).message(),
            "job.yaml:9: roles.ps.resources.cpus: the job needs 4.5 CPUs in total (1 x ps at 0.5 "
            "+ 2 x worker at 2), this machine has 4");
}

TEST(CheckFitsMachineTest, OmitsTheLineForHandBuiltSpecs) {
  JobSpec spec = MakeSpec({MakeRole("worker", 1, 8, 0, 0, 0)});
  spec.source_path = "";
  EXPECT_EQ(CheckFitsMachine(spec, SmallMachine()).message(),
            "job: roles.worker.resources.cpus: one worker task needs 8 CPUs, this machine has 2");
}

// --- Robustness ---------------------------------------------------------------------------------

// Feeds random and mutated documents; the only claim is that the parser returns, whatever it says.
TEST(SpecParserFuzzTest, ReturnsForRandomAndMutatedDocuments) {
  std::mt19937 rng(20240611);
  const std::string seeds[] = {
      kFullExample,
      "name: j\nroles:\n  a: {command: [x], depends_on: [b]}\n  b: {command: y, depends_on: [a]}\n",
      "name: j\nsuccess: {roles: [a]}\nroles:\n  a: &r {command: [x], env: {A: 1}}\n  b: *r\n",
      kFailureExample,
      "name: j\non_failure: elastic\nrestart: never\nbackoff: {initial: 0, max: 1s}\n"
      "heartbeat: {interval: 10ms, misses: 2}\ncheckpoint:\ndataset: {shards: [a, b], epochs: 2}\n"
      "roles:\n  w: {command: [x], instances: {min: 1, max: 3}, restart: always}\n",
  };
  const std::string alphabet = "abcxyz019 :-[]{},&*!|>'\"#?%@`\n\t.~";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int returned = 0;
  for (int round = 0; round < 200; ++round) {
    std::string doc;
    if (round % 4 == 0) {
      // Pure noise.
      size_t len = pick(200);
      for (size_t i = 0; i < len; ++i) doc += alphabet[pick(alphabet.size())];
    } else {
      doc = seeds[pick(std::size(seeds))];
      size_t edits = 1 + pick(8);
      for (size_t e = 0; e < edits && !doc.empty(); ++e) {
        size_t at = pick(doc.size());
        switch (pick(5)) {
          case 0:
            doc.erase(at, 1);
            break;
          case 1:
            doc.insert(at, 1, alphabet[pick(alphabet.size())]);
            break;
          case 2:
            doc[at] = alphabet[pick(alphabet.size())];
            break;
          case 3: {  // duplicate a slice, e.g. a whole line
            size_t len = 1 + pick(40);
            doc.insert(at, doc.substr(at, len));
            break;
          }
          case 4: {  // cut a slice
            doc.erase(at, 1 + pick(20));
            break;
          }
        }
      }
    }
    absl::StatusOr<JobSpec> spec = ParseJobSpec(doc, "fuzz.yaml", "/tmp");
    if (spec.ok()) {
      (void)CheckFitsMachine(*spec, SmallMachine());
    } else {
      EXPECT_FALSE(spec.status().message().empty()) << doc;
    }
    ++returned;
  }
  EXPECT_EQ(returned, 200);
}

TEST(SpecParserFuzzTest, ReturnsForDeeplyNestedDocuments) {
  std::string deep = "name: j\nroles: " + std::string(100000, '[');
  EXPECT_FALSE(Parse(deep).ok());
  std::string deep_maps = "name: j\nroles:\n  a:\n    command: [x]\n    env: ";
  for (int i = 0; i < 5000; ++i) deep_maps += "{a: ";
  EXPECT_FALSE(Parse(deep_maps).ok());
}

// --- slurm -------------------------------------------------------------------------------------

TEST(SpecParserTest, ReadsSlurmSection) {
  auto spec = ParseJobSpec(
      "name: j\nslurm: {partition: gpu, account: ml-team, time_limit: 90m, constraint: "
      "\"a100&ib\"}\nroles:\n  a: {command: [x]}\n",
      "job.yaml", "/base");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(backends::SlurmConfigOf(*spec).partition, "gpu");
  EXPECT_EQ(backends::SlurmConfigOf(*spec).account, "ml-team");
  EXPECT_EQ(backends::SlurmConfigOf(*spec).time_limit, std::chrono::minutes(90));
  EXPECT_EQ(backends::SlurmConfigOf(*spec).constraint, "a100&ib");
}

TEST(SpecParserTest, SlurmDefaultsAreEmpty) {
  auto spec = ParseJobSpec("name: j\nroles:\n  a: {command: [x]}\n", "job.yaml", "/base");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(backends::SlurmConfigOf(*spec).partition, "");
  EXPECT_EQ(backends::SlurmConfigOf(*spec).time_limit.count(), 0);
}

TEST(SpecParserTest, RejectsBadSlurmValues) {
  EXPECT_THAT(Refusal("name: j\nslurm: gpu\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: slurm: must be a map"));
  EXPECT_THAT(Refusal("name: j\nslurm: {partition: \"gpu; rm\"}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: slurm.partition: must be a Slurm name"));
  EXPECT_THAT(Refusal("name: j\nslurm: {time_limit: 30s}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("slurm.time_limit: must be at least 1m"));
  EXPECT_THAT(Refusal("name: j\nslurm: {queue: a}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("slurm.queue: unknown key"));
}

// --- yarn --------------------------------------------------------------------------------------

TEST(SpecParserTest, ReadsYarnSection) {
  auto spec = ParseJobSpec("name: j\nyarn: {queue: root.ml, node_label: \"gpu&&ib\"}\nroles:\n"
                           "  a: {command: [x]}\n",
                           "job.yaml", "/base");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(backends::YarnConfigOf(*spec).queue, "root.ml");
  EXPECT_EQ(backends::YarnConfigOf(*spec).node_label, "gpu&&ib");
}

TEST(SpecParserTest, RejectsBadYarnValues) {
  EXPECT_THAT(Refusal("name: j\nyarn: ml\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: yarn: must be a map"));
  EXPECT_THAT(Refusal("name: j\nyarn: {queue: \"ml; rm\"}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: yarn.queue: must be a YARN queue name"));
  EXPECT_THAT(Refusal("name: j\nyarn: {node_label: \"a'b\"}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("yarn.node_label: must be a YARN node label expression"));
  EXPECT_THAT(Refusal("name: j\nyarn: {partition: a}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("yarn.partition: unknown key"));
}

// --- tensorboard -------------------------------------------------------------------------------

TEST(SpecParserTest, TensorBoardSectionAloneTurnsItOnWithDefaults) {
  auto spec = ParseJobSpec("name: j\ntensorboard:\nroles:\n  a: {command: [x]}\n", "job.yaml",
                           "/base");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->tensorboard.configured);
  EXPECT_EQ(spec->tensorboard.logdir, "");
  EXPECT_TRUE(spec->tensorboard.command.empty());
  auto none = ParseJobSpec("name: j\nroles:\n  a: {command: [x]}\n", "job.yaml", "/base");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->tensorboard.configured);
}

TEST(SpecParserTest, TensorBoardLogdirIsResolvedAgainstTheJobFile) {
  auto spec = ParseJobSpec(
      "name: j\ntensorboard: {logdir: runs/x, command: [/opt/tb/bin/tensorboard, --reload_interval, "
      "\"1\"]}\nroles:\n  a: {command: [x]}\n",
      "job.yaml", "/base");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tensorboard.logdir, "/base/runs/x");
  EXPECT_EQ(spec->tensorboard.command,
            (std::vector<std::string>{"/opt/tb/bin/tensorboard", "--reload_interval", "1"}));
}

TEST(SpecParserTest, RejectsBadTensorBoardValues) {
  EXPECT_THAT(Refusal("name: j\ntensorboard: yes\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: tensorboard: must be a map with logdir and/or command"));
  EXPECT_THAT(Refusal("name: j\ntensorboard: {logdir: ~/runs}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: tensorboard.logdir: must be a directory path"));
  EXPECT_THAT(Refusal("name: j\ntensorboard: {command: tensorboard}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("job.yaml:2: tensorboard.command: must be a non-empty list of strings"));
  EXPECT_THAT(Refusal("name: j\ntensorboard: {port: 6006}\nroles:\n  a: {command: [x]}\n"),
              HasSubstr("tensorboard.port: unknown key"));
}

}  // namespace
}  // namespace shoal::spec

