#include "serve/repository/model_repository.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace shoal::serve {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/shoal-repo-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }
  void Touch(const std::string& relative) {
    fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << "x";
  }
  fs::path root_;
};

TEST_F(ModelRepositoryTest, ListsModelsAndTheirVersionsInNumericOrder) {
  Touch("mlp/1/model.pt");
  Touch("mlp/10/model.pt");
  Touch("mlp/9/model.pt");
  Touch("mlp/config.yaml");
  Touch("identity/3/model.pt");
  auto scan = ScanModelRepository(root_.string());
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->models.size(), 2u);
  const ModelEntry& identity = scan->models[0];
  EXPECT_EQ(identity.name, "identity");
  EXPECT_FALSE(identity.config_path.has_value());
  ASSERT_EQ(identity.versions.size(), 1u);
  EXPECT_EQ(identity.versions[0].version, 3);
  EXPECT_EQ(identity.versions[0].model_path, (root_ / "identity/3/model.pt").string());
  const ModelEntry& mlp = scan->models[1];
  EXPECT_EQ(mlp.name, "mlp");
  EXPECT_EQ(mlp.config_path, (root_ / "mlp/config.yaml").string());
  std::vector<int64_t> versions;
  for (const auto& v : mlp.versions) versions.push_back(v.version);
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 9, 10}));
  EXPECT_TRUE(scan->ignored.empty());
}

TEST_F(ModelRepositoryTest, AVersionsFingerprintChangesWithAnyFileInItAndOnlyThen) {
  Touch("m/1/model.pt");
  Touch("m/1/extra/vocab.txt");
  auto fingerprint = [&] {
    auto scan = ScanModelRepository(root_.string());
    EXPECT_TRUE(scan.ok()) << scan.status();
    return scan.ok() && scan->models.size() == 1 && scan->models[0].versions.size() == 1
               ? scan->models[0].versions[0].fingerprint
               : std::string("no scan");
  };
  std::string first = fingerprint();
  EXPECT_THAT(first, ::testing::HasSubstr("model.pt 1 "));
  EXPECT_THAT(first, ::testing::HasSubstr("extra/vocab.txt 1 "));
  EXPECT_EQ(fingerprint(), first);
  std::ofstream(root_ / "m/1/extra/vocab.txt", std::ios::app) << "more";  // grows
  std::string grown = fingerprint();
  EXPECT_NE(grown, first);
  Touch("m/1/another");  // a new file
  EXPECT_NE(fingerprint(), grown);
}

TEST_F(ModelRepositoryTest, AVersionHoldingTheCompleteMarkerIsMarkedSo) {
  Touch("m/1/model.pt");
  Touch("m/2/model.pt");
  Touch(std::string("m/2/") + kVersionCompleteMarker);
  auto scan = ScanModelRepository(root_.string());
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->models.size(), 1u);
  ASSERT_EQ(scan->models[0].versions.size(), 2u);
  EXPECT_FALSE(scan->models[0].versions[0].marked_complete);
  EXPECT_TRUE(scan->models[0].versions[1].marked_complete);
}

TEST_F(ModelRepositoryTest, SkipsVersionDirectoriesThatCannotBeServed) {
  Touch("m/1/model.pt");
  Touch("m/2/weights.bin");   // no model.pt
  Touch("m/latest/model.pt"); // not a number
  Touch("m/0/model.pt");      // versions start at 1
  Touch("m/01/model.pt");     // a second spelling of 1
  Touch("m/.tmp/model.pt");   // hidden: silently
  auto scan = ScanModelRepository(root_.string());
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->models.size(), 1u);
  const ModelEntry& m = scan->models[0];
  ASSERT_EQ(m.versions.size(), 1u);
  EXPECT_EQ(m.versions[0].version, 1);
  const std::string dir = (root_ / "m").string();
  EXPECT_THAT(m.skipped_versions,
              ElementsAre(dir + "/0: not a version; version directories are integers >= 1 "
                                "without leading zeros",
                          dir + "/01: not a version; version directories are integers >= 1 "
                                "without leading zeros",
                          dir + "/2: no model.pt in it",
                          dir + "/latest: not a version; version directories are integers >= 1 "
                                "without leading zeros"));
}

TEST_F(ModelRepositoryTest, ListsAModelWithoutVersionsSoThatItCanBeRefused) {
  fs::create_directories(root_ / "empty");
  auto scan = ScanModelRepository(root_.string());
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->models.size(), 1u);
  EXPECT_EQ(scan->models[0].name, "empty");
  EXPECT_TRUE(scan->models[0].versions.empty());
}

TEST_F(ModelRepositoryTest, IgnoresFilesHiddenEntriesAndNamesThatCannotBeInAUrl) {
  Touch("README.md");
  Touch(".git/1/model.pt");
  Touch("my model/1/model.pt");
  Touch("ok/1/model.pt");
  auto scan = ScanModelRepository(root_.string());
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->models.size(), 1u);
  EXPECT_EQ(scan->models[0].name, "ok");
  EXPECT_THAT(scan->ignored,
              ElementsAre((root_ / "my model").string() +
                          ": not a model name; model names use letters, digits, '_', '-' and '.'"));
}

TEST_F(ModelRepositoryTest, FollowsSymlinkedModelDirectories) {
  Touch("real/1/model.pt");
  fs::create_directories(root_ / "repo");
  fs::create_directory_symlink(root_ / "real", root_ / "repo" / "linked");
  auto scan = ScanModelRepository((root_ / "repo").string());
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->models.size(), 1u);
  EXPECT_EQ(scan->models[0].name, "linked");
  EXPECT_EQ(scan->models[0].versions.size(), 1u);
}

TEST_F(ModelRepositoryTest, AMissingRepositoryIsNotFound) {
  auto scan = ScanModelRepository((root_ / "nope").string());
  ASSERT_FALSE(scan.ok());
  EXPECT_EQ(scan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scan.status().message(),
            "model repository " + (root_ / "nope").string() + " does not exist");
}

TEST_F(ModelRepositoryTest, AFileIsNotARepository) {
  Touch("file");
  auto scan = ScanModelRepository((root_ / "file").string());
  ASSERT_FALSE(scan.ok());
  EXPECT_EQ(scan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(scan.status().message(),
            "model repository " + (root_ / "file").string() + " is not a directory");
}

TEST_F(ModelRepositoryTest, APathThroughAFileIsRefusedWithTheReason) {
  Touch("file");
  auto scan = ScanModelRepository((root_ / "file" / "sub").string());
  ASSERT_FALSE(scan.ok());
  EXPECT_EQ(scan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scan.status().message(), "model repository " + (root_ / "file" / "sub").string() +
                                         " does not exist (Not a directory)");
}

}  // namespace
}  // namespace shoal::serve
