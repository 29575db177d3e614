#include "backends/backend_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backends/local/local_provider.h"
#include "backends/slurm/slurm_provider.h"
#include "backends/yarn/yarn_provider.h"
#include "spec/spec_parser.h"

namespace shoal::backends {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A backend with a flag and a section of its own, as the next ones (Kubernetes) will have.
class FakeProvider final : public BackendProvider {
 public:
  FakeProvider(std::string name, std::string flag, std::string section)
      : name_(std::move(name)), flag_(std::move(flag)), section_(std::move(section)) {}
  std::string Name() const override { return name_; }
  std::vector<RunFlag> Flags() const override {
    if (flag_.empty()) return {};
    return {{flag_, "a flag"}};
  }
  std::optional<spec::JobSection> JobSection() const override {
    if (section_.empty()) return std::nullopt;
    return spec::JobSection{section_, [](spec::SectionReader& reader) {
                              reader.ExpectMap("namespace, e.g. {namespace: ml}");
                              reader.AcceptKeys({"namespace"});
                              return std::shared_ptr<const spec::SectionValue>();
                            }};
  }
  absl::StatusOr<Preflight> Check(const PreflightRequest&) const override { return Preflight{}; }
  absl::StatusOr<CreatedBackend> Create(const BackendContext&) const override {
    return absl::UnimplementedError("fake");
  }

 private:
  std::string name_, flag_, section_;
};

BackendRegistry BuiltIn() {
  BackendRegistry registry;
  EXPECT_TRUE(registry.Add(std::make_unique<LocalProvider>()).ok());
  EXPECT_TRUE(registry.Add(std::make_unique<SlurmProvider>()).ok());
  EXPECT_TRUE(registry.Add(std::make_unique<YarnProvider>()).ok());
  return registry;
}

TEST(BackendRegistryTest, ListsBackendsInRegistrationOrder) {
  BackendRegistry registry = BuiltIn();
  EXPECT_THAT(registry.Names(), ElementsAre("local", "slurm", "yarn"));
  EXPECT_EQ(registry.NamesForMessages(), "local, slurm or yarn");
  EXPECT_EQ(registry.NamesForMessages("local"), "local (default), slurm or yarn");
  ASSERT_NE(registry.Find("yarn"), nullptr);
  EXPECT_EQ(registry.Find("yarn")->Name(), "yarn");
  EXPECT_EQ(registry.Find("kubernetes"), nullptr);
  ASSERT_EQ(registry.JobSections().size(), 2u);
  EXPECT_EQ(registry.JobSections()[0].name, "slurm");
  EXPECT_EQ(registry.JobSections()[1].name, "yarn");
}

TEST(BackendRegistryTest, RefusesANameFlagOrSectionThatIsTaken) {
  BackendRegistry registry = BuiltIn();
  EXPECT_THAT(registry.Add(std::make_unique<FakeProvider>("slurm", "", "")).message(),
              HasSubstr("added twice"));
  EXPECT_THAT(registry.Add(std::make_unique<FakeProvider>("k8s", "--queue", "")).message(),
              HasSubstr("--queue"));
  EXPECT_THAT(registry.Add(std::make_unique<FakeProvider>("k8s", "", "yarn")).message(),
              HasSubstr("section yarn"));
  EXPECT_THAT(registry.Names(), ElementsAre("local", "slurm", "yarn"));
}

// A new backend's section is read in every job file, with the file's rules and messages.
TEST(BackendRegistryTest, ANewBackendsSectionIsReadWithTheJobFilesRules) {
  BackendRegistry registry = BuiltIn();
  ASSERT_TRUE(
      registry.Add(std::make_unique<FakeProvider>("kubernetes", "--namespace", "kubernetes"))
          .ok());
  auto job = spec::ParseJobSpec(
      "name: j\nkubernetes: {namespac: ml}\nroles:\n  a: {command: [x]}\n", "job.yaml", "/base",
      registry.JobSections());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "job.yaml:2: kubernetes.namespac: unknown key; did you mean 'namespace'? accepted "
            "keys: namespace");
  job = spec::ParseJobSpec("name: j\nkubernetess: {}\nroles:\n  a: {command: [x]}\n", "job.yaml",
                           "/base", registry.JobSections());
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(),
              HasSubstr("dataset, slurm, yarn, kubernetes, tensorboard, publish, mpi"));
}

TEST(SlurmFlagsTest, GivenFlagsBecomeSettingsWithTheSectionsRules) {
  auto settings = SlurmFlagSettings(
      {{"--partition", "gpu"}, {"--constraint", "a100&ib"}, {"--time-limit", "90m"}});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(*settings, nlohmann::json({{"partition", "gpu"},
                                       {"constraint", "a100&ib"},
                                       {"time_limit_ms", 90 * 60 * 1000}}));
  EXPECT_EQ(*SlurmFlagSettings({}), nlohmann::json::object());
}

TEST(SlurmFlagsTest, EveryBadFlagIsNamedOnItsOwnLine) {
  auto settings = SlurmFlagSettings({{"--account", "a b"}, {"--time-limit", "30s"}});
  ASSERT_FALSE(settings.ok());
  EXPECT_EQ(settings.status().message(),
            "invalid flag: --account: must be a Slurm name (letters, digits, -_.,:=), got 'a b'\n"
            "--time-limit: must be at least 1m (Slurm counts whole minutes), got '30s'");
  EXPECT_EQ(SlurmFlagSettings({{"--time-limit", "soon"}}).status().message(),
            "invalid flag: --time-limit: must be a duration such as 500ms, 30s or 2m, got 'soon'");
}

TEST(YarnFlagsTest, FlagsOverrideTheJobFilesSection) {
  auto job = spec::ParseJobSpec("name: j\nyarn: {queue: ml, node_label: gpu}\nroles:\n"
                                "  a: {command: [x]}\n",
                                "job.yaml", "/base", BuiltIn().JobSections());
  ASSERT_TRUE(job.ok()) << job.status();
  auto request = YarnFlagRequest(*job, {{"--queue", "root.batch"}});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->queue, "root.batch");
  EXPECT_EQ(request->node_label, "gpu");
  EXPECT_EQ(YarnFlagRequest(*job, {{"--node-label", "a'b"}}).status().message(),
            "invalid flag: --node-label: must be a YARN node label expression (letters, digits, "
            "-_. and &|!()), e.g. gpu, got 'a'b'");
}

}  // namespace
}  // namespace shoal::backends
