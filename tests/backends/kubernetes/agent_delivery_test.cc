// The agent delivered once per node: the DaemonSet's manifest (golden), and the install its
// init container runs, on real directories: complete, atomic to whoever holds the old copy,
// idempotent, and refusing what is not an agent.
#include "backends/kubernetes/agent_delivery.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "golden_files.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::backends {
namespace {
namespace fs = std::filesystem;

using ::testing::HasSubstr;

using golden::ExpectGolden;
using golden::GoldenPath;

TEST(AgentDaemonSet, Manifest) {
  AgentDaemonSetOptions options;
  options.agent_image = "registry.example.com/shoal-agent:0.1.0";
  options.agent_host_path = "/var/lib/shoal/agent";
  options.ns = "shoal-system";
  ExpectGolden("agent_daemonset", AgentDaemonSet(options));
}

TEST(AgentDaemonSet, InstallsBesideTheDirectoryInItsParent) {
  AgentDaemonSetOptions options;
  options.agent_image = "a:1";
  options.agent_host_path = "/tmp/shoal-agent-x";
  options.pause_image = "localhost/pause:test";
  nlohmann::json ds = AgentDaemonSet(options);
  EXPECT_FALSE(ds["metadata"].contains("namespace"));
  const nlohmann::json& spec = ds["spec"]["template"]["spec"];
  EXPECT_EQ(spec["volumes"][0]["hostPath"]["path"], "/tmp");
  EXPECT_EQ(spec["initContainers"][0]["command"].back(), "/host/shoal-agent-x");
  EXPECT_EQ(spec["containers"][0]["image"], "localhost/pause:test");
}

class InstallAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agent-delivery-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    MakeAgent(root_ / "image", "version 1");
  }
  void TearDown() override { fs::remove_all(root_); }

  static void MakeAgent(const fs::path& dir, const std::string& version) {
    fs::create_directories(dir / "bin");
    fs::create_directories(dir / "lib");
    fs::create_directories(dir / "python" / "shoal");
    ASSERT_TRUE(WriteFileAtomically((dir / "bin" / "shoal").string(), "#!" + version).ok());
    fs::permissions(dir / "bin" / "shoal", fs::perms::owner_all | fs::perms::group_read |
                                               fs::perms::group_exec | fs::perms::others_read |
                                               fs::perms::others_exec);
    ASSERT_TRUE(WriteFileAtomically((dir / "lib" / "libx.so.1").string(), version).ok());
    ASSERT_TRUE(
        WriteFileAtomically((dir / "python" / "shoal" / "__init__.py").string(), version).ok());
    fs::remove(dir / "lib" / "libx.so");
    fs::create_symlink("libx.so.1", dir / "lib" / "libx.so");
  }

  static std::string Read(const fs::path& path) {
    auto text = ReadFile(path.string());
    return text.ok() ? *text : "<missing>";
  }

  std::vector<std::string> Siblings() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_ / "node")) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path root_;
};

TEST_F(InstallAgentTest, InstallsAWholeCopy) {
  fs::create_directories(root_ / "node");
  const fs::path to = root_ / "node" / "agent";
  std::string what;
  ASSERT_TRUE(InstallAgent((root_ / "image").string(), to.string(), &what).ok());
  EXPECT_THAT(what, HasSubstr("installed the agent in"));
  EXPECT_EQ(Read(to / "bin" / "shoal"), "#!version 1");
  EXPECT_EQ(Read(to / "python" / "shoal" / "__init__.py"), "version 1");
  EXPECT_EQ(fs::read_symlink(to / "lib" / "libx.so"), "libx.so.1");
  EXPECT_EQ(fs::status(to / "bin" / "shoal").permissions(),
            fs::status(root_ / "image" / "bin" / "shoal").permissions());
  EXPECT_EQ(Siblings(), std::vector<std::string>{"agent"});
}

TEST_F(InstallAgentTest, TheSameAgentAgainChangesNothing) {
  fs::create_directories(root_ / "node");
  const fs::path to = root_ / "node" / "agent";
  ASSERT_TRUE(InstallAgent((root_ / "image").string(), to.string(), nullptr).ok());
  struct stat before {};
  ASSERT_EQ(::stat(to.c_str(), &before), 0);
  std::string what;
  ASSERT_TRUE(InstallAgent((root_ / "image").string(), to.string(), &what).ok());
  EXPECT_THAT(what, HasSubstr("already holds this agent"));
  struct stat after {};
  ASSERT_EQ(::stat(to.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(Siblings(), std::vector<std::string>{"agent"});
}

// A pod started before an upgrade holds the old directory (its bind mount, here an open
// descriptor): it keeps seeing the whole old agent, and a new opener the whole new one.
TEST_F(InstallAgentTest, AnUpgradeSwapsWholeCopiesAndKeepsThePreviousOne) {
  fs::create_directories(root_ / "node");
  const fs::path to = root_ / "node" / "agent";
  ASSERT_TRUE(InstallAgent((root_ / "image").string(), to.string(), nullptr).ok());
  int held = ::open(to.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  fs::remove_all(root_ / "image");
  MakeAgent(root_ / "image", "version 2");
  fs::remove(root_ / "image" / "lib" / "libx.so");  // a file the new version no longer has

  std::string what;
  ASSERT_TRUE(InstallAgent((root_ / "image").string(), to.string(), &what).ok());
  EXPECT_THAT(what, HasSubstr("replaced the agent in"));
  EXPECT_EQ(Read(to / "bin" / "shoal"), "#!version 2");
  EXPECT_FALSE(fs::is_symlink(to / "lib" / "libx.so"));
  const fs::path old = "/proc/self/fd/" + std::to_string(held);
  EXPECT_EQ(Read(old / "bin" / "shoal"), "#!version 1");
  EXPECT_EQ(Read(old / "lib" / "libx.so"), "version 1");
  ::close(held);
  EXPECT_EQ(Read(root_ / "node" / "agent.previous" / "bin" / "shoal"), "#!version 1");
  EXPECT_EQ(Siblings(), (std::vector<std::string>{"agent", "agent.previous"}));
}

TEST_F(InstallAgentTest, RefusesWhatIsNotAnAgentAndChangesNothing) {
  fs::create_directories(root_ / "node");
  fs::create_directories(root_ / "empty");
  const fs::path to = root_ / "node" / "agent";
  absl::Status st = InstallAgent((root_ / "empty").string(), to.string(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("holds no bin/shoal"));
  st = InstallAgent((root_ / "missing").string(), to.string(), nullptr);
  EXPECT_THAT(st.message(), HasSubstr("is not a directory"));
  ASSERT_TRUE(WriteFileAtomically(to.string(), "a file").ok());
  st = InstallAgent((root_ / "image").string(), to.string(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("exists and is not a directory"));
  EXPECT_EQ(Siblings(), std::vector<std::string>{"agent"});
  EXPECT_EQ(Read(to), "a file");
}

}  // namespace
}  // namespace shoal::backends
