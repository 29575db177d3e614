// Tests of the header-only C++ SDK, sdk/cpp/shoal/sdk.h: checkpoint files (naming, atomic
// writes, retention, load fallbacks), files shared with the Python SDK, publishing models (with
// a Python publisher of the same model), and the reports sent to a fake agent on a real
// abstract Unix socket. Compiled as C++17 (see CMakeLists.txt).
#include "shoal/sdk.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace shoal::sdk {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteAll(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "shoal-sdk-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    ::unsetenv("SHOAL_AGENT_SOCKET");
    ::unsetenv(kTestWriteDelayEnv);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

using SdkCheckpointTest = TempDirTest;

TEST_F(SdkCheckpointTest, FileNamesAreStepZeroPaddedTo12Digits) {
  EXPECT_EQ(CheckpointFileName(200), "ckpt-000000000200.pt");
  EXPECT_EQ(CheckpointFileName(10000000000000ull), "ckpt-10000000000000.pt");
  EXPECT_EQ(CheckpointStep("ckpt-000000000200.pt"), std::optional<uint64_t>(200));
  EXPECT_EQ(CheckpointStep("ckpt-10000000000000.pt"), std::optional<uint64_t>(10000000000000ull));
  for (const char* other : {"ckpt-.pt", "ckpt-12.pth", ".tmp-ckpt-000000000001.pt.1.ab",
                            "ckpt-1a.pt", "ckpt-99999999999999999999999.pt"}) {
    EXPECT_FALSE(CheckpointStep(other).has_value()) << other;
  }
}

TEST_F(SdkCheckpointTest, SaveWritesTheFinalNameAndLeavesNoTemporary) {
  const std::string bytes("weights\0with\0nuls", 17);
  SaveResult saved = SaveCheckpoint(dir_.string(), 7, bytes, 3);
  ASSERT_TRUE(saved.ok) << saved.error;
  EXPECT_EQ(saved.path, (dir_ / "ckpt-000000000007.pt").string());
  EXPECT_EQ(Names(dir_), std::set<std::string>{"ckpt-000000000007.pt"});
  EXPECT_EQ(ReadAll(saved.path), bytes);
}

TEST_F(SdkCheckpointTest, SaveCreatesMissingDirectories) {
  fs::path nested = dir_ / "a" / "b";
  ASSERT_TRUE(SaveCheckpoint(nested.string(), 1, "x", 1).ok);
  EXPECT_EQ(Names(nested), std::set<std::string>{"ckpt-000000000001.pt"});
}

TEST_F(SdkCheckpointTest, AnUnsupportedUriDirectoryIsRefusedNotTakenForALocalPath) {
  // Run from dir_, so that a URI mistaken for a relative path would show up as s3:/ here.
  fs::path previous = fs::current_path();
  fs::current_path(dir_);
  SaveResult saved = SaveCheckpoint("s3://bucket/ckpt", 1, "x", 1);
  testing::internal::CaptureStderr();
  auto loaded = LoadLatestCheckpoint("s3://bucket/ckpt");
  std::string warning = testing::internal::GetCapturedStderr();
  fs::current_path(previous);
  EXPECT_FALSE(saved.ok);
  EXPECT_NE(saved.error.find("s3:// URI; the C++ SDK reads and writes local directories and "
                             "hdfs://namenode/path"),
            std::string::npos)
      << saved.error;
  EXPECT_FALSE(loaded.has_value());
  EXPECT_NE(warning.find("cannot load a checkpoint: checkpoint directory s3://bucket/ckpt"),
            std::string::npos)
      << warning;
  EXPECT_FALSE(fs::exists(dir_ / "s3:"));
  // Paths with "://" further in are still paths.
  EXPECT_TRUE(SaveCheckpoint((dir_ / "a://b").string(), 1, "x", 1).ok);
}

// The pure parts of the hdfs:// support (WebHDFS); tests/sdk/hdfs_cpp_test.py runs the rest
// against the HDFS mini-cluster.
class SdkHdfsTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"SHOAL_WEBHDFS", "HADOOP_USER_NAME"}) {
      if (const char* value = std::getenv(name)) saved_.emplace_back(name, value);
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    ::unsetenv("SHOAL_WEBHDFS");
    ::unsetenv("HADOOP_USER_NAME");
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(SdkHdfsTest, UriResolvesToTheNameNodesWebHdfsPortByDefault) {
  ::setenv("HADOOP_USER_NAME", "alice", 1);
  std::string error;
  auto dir = internal::ParseHdfsDir("hdfs://nn.example:8020/jobs/a/ckpt/", "", &error);
  ASSERT_TRUE(dir) << error;
  EXPECT_EQ(dir->base, "http://nn.example:9870");
  EXPECT_EQ(dir->path, "/jobs/a/ckpt");
  EXPECT_EQ(dir->uri, "hdfs://nn.example:8020/jobs/a/ckpt");
  EXPECT_EQ(dir->user, "alice");
}

TEST_F(SdkHdfsTest, WebHdfsAddressComesFromTheArgumentThenTheEnvironment) {
  std::string error;
  ::setenv("SHOAL_WEBHDFS", "http://127.0.0.1:50070/", 1);
  auto from_env = internal::ParseHdfsDir("hdfs://nn/ckpt", "", &error);
  ASSERT_TRUE(from_env) << error;
  EXPECT_EQ(from_env->base, "http://127.0.0.1:50070");
  auto from_arg = internal::ParseHdfsDir("hdfs://nn/ckpt", "http://gw:1234", &error);
  ASSERT_TRUE(from_arg) << error;
  EXPECT_EQ(from_arg->base, "http://gw:1234");
  auto root = internal::ParseHdfsDir("hdfs://nn/", "", &error);
  ASSERT_TRUE(root) << error;
  EXPECT_EQ(root->path, "/");
  EXPECT_EQ(internal::HdfsJoin(*root, "ckpt-000000000001.pt"), "/ckpt-000000000001.pt");
}

TEST_F(SdkHdfsTest, UrisWithoutAHostOrPathAreErrors) {
  for (const char* bad : {"hdfs:///ckpt", "hdfs://nn", "hdfs://:8020/x"}) {
    std::string error;
    EXPECT_FALSE(internal::ParseHdfsDir(bad, "", &error)) << bad;
    EXPECT_NE(error.find("not an hdfs://namenode/path URI"), std::string::npos) << error;
  }
  SaveResult saved = SaveCheckpoint("hdfs:///ckpt", 1, "x", 1);
  EXPECT_FALSE(saved.ok);
  EXPECT_NE(saved.error.find("not an hdfs://namenode/path URI"), std::string::npos);
}

TEST_F(SdkHdfsTest, PathsAndParametersArePercentEncoded) {
  EXPECT_EQ(internal::PercentEncode("/a b/c%d/ü", true), "/a%20b/c%25d/%C3%BC");
  EXPECT_EQ(internal::PercentEncode("/x/y&z=1+2", false), "%2Fx%2Fy%26z%3D1%2B2");
  ::setenv("HADOOP_USER_NAME", "bob smith", 1);
  std::string error;
  auto dir = internal::ParseHdfsDir("hdfs://nn/my ckpt", "", &error);
  ASSERT_TRUE(dir) << error;
  EXPECT_EQ(internal::WebHdfsUrl(*dir, dir->path + "/.tmp-x", "RENAME",
                                 {{"destination", "/my ckpt/x"}, {"renameoptions", "OVERWRITE"}}),
            "http://nn:9870/webhdfs/v1/my%20ckpt/.tmp-x?op=RENAME&user.name=bob%20smith"
            "&destination=%2Fmy%20ckpt%2Fx&renameoptions=OVERWRITE");
}

TEST_F(SdkHdfsTest, ChunkedBodiesDecodeAndIncompleteOnesAreErrors) {
  EXPECT_EQ(internal::DecodeChunked("4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks."
                                    "\r\n0\r\nTrailer: x\r\n\r\n"),
            std::optional<std::string>("Wikipedia in \r\n\r\nchunks."));
  EXPECT_EQ(internal::DecodeChunked("0\r\n\r\n"), std::optional<std::string>(""));
  EXPECT_FALSE(internal::DecodeChunked("4\r\nWi"));          // cut short
  EXPECT_FALSE(internal::DecodeChunked("4\r\nWiki\r\n"));  // no last chunk
  EXPECT_FALSE(internal::DecodeChunked("zz\r\nWiki\r\n0\r\n\r\n"));
}

TEST_F(SdkHdfsTest, InterimContinueAnswersAreSkipped) {
  const std::string raw = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
  EXPECT_EQ(raw.substr(internal::SkipInterimAnswers(raw)),
            "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(internal::SkipInterimAnswers("HTTP/1.1 200 OK\r\n\r\n"), 0u);
  EXPECT_EQ(internal::SkipInterimAnswers("HTTP/1.1 100 Contin"), 0u);  // not complete yet
}

TEST_F(SdkHdfsTest, ListStatusAnswersGiveNamesTypesAndTimes) {
  const std::string listing = R"json({"FileStatuses":{"FileStatus":[
    {"accessTime":1,"blockSize":134217728,"childrenNum":0,"fileId":16390,"group":"supergroup",
     "length":5,"modificationTime":1700000000123,"owner":"shoal","pathSuffix":"ckpt-000000000002.pt",
     "permission":"644","replication":1,"storagePolicy":0,"type":"FILE"},
    {"modificationTime":5,"pathSuffix":"sub \"dir\"","type":"DIRECTORY"},
    {"pathSuffix":".tmp-ckpt-000000000003.pt.h.1.ab","type":"FILE","modificationTime":7}
  ]}})json";
  std::vector<internal::HdfsEntry> entries = internal::ParseFileStatuses(listing);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name, "ckpt-000000000002.pt");
  EXPECT_TRUE(entries[0].is_file);
  EXPECT_EQ(entries[0].modification_time, 1700000000123LL);
  EXPECT_EQ(entries[1].name, "sub \"dir\"");
  EXPECT_FALSE(entries[1].is_file);
  EXPECT_EQ(entries[2].modification_time, 7);
  auto checkpoints = internal::HdfsCheckpoints(entries);
  ASSERT_EQ(checkpoints.size(), 1u);
  EXPECT_EQ(checkpoints[0].first, 2u);
  EXPECT_TRUE(internal::ParseFileStatuses(R"({"FileStatuses":{"FileStatus":[]}})").empty());
}

TEST_F(SdkHdfsTest, RemoteExceptionMessagesAndBooleansAreRead) {
  EXPECT_EQ(internal::RemoteExceptionMessage(
                R"({"RemoteException":{"exception":"AccessControlException","javaClassName":)"
                R"("org.apache.hadoop.security.AccessControlException","message":)"
                R"("Permission denied: user=bob, access=WRITE, inode=\"/x\""}})"),
            "Permission denied: user=bob, access=WRITE, inode=\"/x\"");
  EXPECT_EQ(internal::RemoteExceptionMessage("<html>Bad\ngateway</html>"), "<html>Bad gateway</html>");
  EXPECT_EQ(internal::JsonBoolean(R"({"boolean":true})"), std::optional<bool>(true));
  EXPECT_EQ(internal::JsonBoolean(R"({"boolean": false})"), std::optional<bool>(false));
  EXPECT_FALSE(internal::JsonBoolean("{}").has_value());
}

TEST_F(SdkCheckpointTest, SaveErrorsAreValuesWithAReason) {
  SaveResult no_dir = SaveCheckpoint("", 1, "x", 1);
  EXPECT_FALSE(no_dir.ok);
  EXPECT_NE(no_dir.error.find("no checkpoint directory"), std::string::npos);
  SaveResult no_keep = SaveCheckpoint(dir_.string(), 1, "x", 0);
  EXPECT_FALSE(no_keep.ok);
  EXPECT_NE(no_keep.error.find("keep"), std::string::npos);
  WriteAll(dir_ / "file", "not a dir");
  SaveResult not_dir = SaveCheckpoint((dir_ / "file").string(), 1, "x", 1);
  EXPECT_FALSE(not_dir);
  EXPECT_NE(not_dir.error.find("not a directory"), std::string::npos) << not_dir.error;
}

TEST_F(SdkCheckpointTest, SavePrunesTheOldestCompleteCheckpointsBeyondKeep) {
  for (uint64_t step : {10, 20, 30, 40}) ASSERT_TRUE(SaveCheckpoint(dir_.string(), step, "s", 2));
  EXPECT_EQ(ListCheckpoints(dir_.string()), (std::vector<uint64_t>{30, 40}));
  EXPECT_EQ(Names(dir_), (std::set<std::string>{"ckpt-000000000030.pt", "ckpt-000000000040.pt"}));
}

TEST_F(SdkCheckpointTest, SaveNeverPrunesTheCheckpointJustWritten) {
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 50, "newer step", 1));
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 20, "just written", 1));
  EXPECT_EQ(ListCheckpoints(dir_.string()), (std::vector<uint64_t>{20}));
}

TEST_F(SdkCheckpointTest, SaveRemovesStaleTemporariesButNotFreshOnes) {
  fs::path stale = dir_ / ".tmp-ckpt-000000000001.pt.123.dead";
  // A writer still at work: a live process (our parent) whose file is newer than our save.
  fs::path fresh = dir_ / (".tmp-ckpt-000000000009.pt." + std::to_string(::getppid()) + ".beef");
  WriteAll(stale, "half");
  WriteAll(fresh, "in progress");
  auto now = fs::file_time_type::clock::now();
  fs::last_write_time(stale, now - std::chrono::hours(1));
  fs::last_write_time(fresh, now + std::chrono::hours(1));  // a writer still at work
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 2, "two", 3));
  EXPECT_EQ(Names(dir_), (std::set<std::string>{fresh.filename(), "ckpt-000000000002.pt"}));
}

TEST_F(SdkCheckpointTest, SaveRemovesTheTemporaryOfADeadWriterEvenWithACurrentTimestamp) {
  // File times tick coarsely: a writer killed a moment ago can share the new save's mtime.
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  fs::path leftover = dir_ / (".tmp-ckpt-000000000007.pt." + std::to_string(dead) + ".dead");
  WriteAll(leftover, "half");
  fs::last_write_time(leftover, fs::file_time_type::clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 8, "eight", 3));
  EXPECT_EQ(Names(dir_), (std::set<std::string>{"ckpt-000000000008.pt"}));
}

TEST_F(SdkCheckpointTest, LoadLatestReturnsNulloptWithoutCheckpoints) {
  EXPECT_FALSE(LoadLatestCheckpoint(dir_.string()).has_value());
  EXPECT_FALSE(LoadLatestCheckpoint((dir_ / "missing").string()).has_value());
}

TEST_F(SdkCheckpointTest, LoadLatestPicksTheHighestStep) {
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 300, "three hundred", 5));
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 2000, "two thousand", 5));
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 100, "one hundred, written last", 5));
  auto latest = LoadLatestCheckpoint(dir_.string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->first, 2000u);
  EXPECT_EQ(latest->second, "two thousand");
}

TEST_F(SdkCheckpointTest, LoadLatestIgnoresTemporariesAndOtherFiles) {
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 5, "five", 3));
  WriteAll(dir_ / ".tmp-ckpt-000000000009.pt.1.aa", "partial nine");
  WriteAll(dir_ / "notes.txt", "not a checkpoint");
  fs::create_directory(dir_ / "ckpt-000000000010.pt");  // not a regular file
  auto latest = LoadLatestCheckpoint(dir_.string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->first, 5u);
  EXPECT_EQ(latest->second, "five");
  EXPECT_EQ(ListCheckpoints(dir_.string()), (std::vector<uint64_t>{5}));
}

TEST_F(SdkCheckpointTest, LoadLatestFallsBackPastCheckpointsTheCallerRejects) {
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 1, "VALID:one", 5));
  ASSERT_TRUE(SaveCheckpoint(dir_.string(), 2, "VALID:two", 5));
  WriteAll(dir_ / "ckpt-000000000003.pt", "VAL");  // truncated
  std::vector<uint64_t> tried;
  auto latest = LoadLatestCheckpoint(dir_.string(), [&](uint64_t step, std::string_view bytes) {
    tried.push_back(step);
    return bytes.substr(0, 6) == "VALID:";
  });
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->first, 2u);
  EXPECT_EQ(latest->second, "VALID:two");
  EXPECT_EQ(tried, (std::vector<uint64_t>{3, 2}));
}

// ---------------------------------------------------------------------------------------------
// Files shared with the Python SDK (sdk/python/shoal, its LocalDirStorage and raw serializer).

class SdkCrossLanguageTest : public TempDirTest {
 protected:
  // Runs a Python snippet with the Python SDK importable; returns its stdout, or fails.
  std::string RunPython(const std::string& code) {
    fs::path script = dir_ / "script.py";
    WriteAll(script, code);
    std::string command = std::string("env -u SHOAL_AGENT_SOCKET PYTHONPATH=") +
                          SHOAL_SDK_PYTHONPATH + " PYTHONDONTWRITEBYTECODE=1 " + SHOAL_SDK_PYTHON +
                          " " + script.string() + " " + (dir_ / "ckpt").string();
    FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) {
      ADD_FAILURE() << "cannot run " << command;
      return "";
    }
    std::string out;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    int status = ::pclose(pipe);
    EXPECT_EQ(status, 0) << command << "\n" << out;
    return out;
  }

  void SetUp() override {
    TempDirTest::SetUp();
    if (::access(SHOAL_SDK_PYTHON, X_OK) != 0) GTEST_SKIP() << SHOAL_SDK_PYTHON << " not found";
  }
};

TEST_F(SdkCrossLanguageTest, PythonListsAndLoadsACheckpointSavedByCpp) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_TRUE(SaveCheckpoint(ckpt, 41, "older", 3));
  ASSERT_TRUE(SaveCheckpoint(ckpt, 42, std::string("raw\0bytes", 9), 3));
  std::string out = RunPython(
      "import sys\n"
      "from shoal.checkpoint import Checkpointer, LocalDirStorage, checkpoint_step\n"
      "print(sorted(checkpoint_step(n) for n in LocalDirStorage(sys.argv[1]).list()))\n"
      "print(Checkpointer(sys.argv[1], serializer='raw').load_latest())\n");
  EXPECT_EQ(out, "[41, 42]\n(42, b'raw\\x00bytes')\n");
}

TEST_F(SdkCrossLanguageTest, CppLoadsACheckpointSavedByPython) {
  RunPython(
      "import sys\n"
      "from shoal.checkpoint import Checkpointer\n"
      "c = Checkpointer(sys.argv[1], keep=2, serializer='raw')\n"
      "for step in (7, 8, 9): c.save(step, b'from python %d' % step)\n");
  const std::string ckpt = (dir_ / "ckpt").string();
  EXPECT_EQ(ListCheckpoints(ckpt), (std::vector<uint64_t>{8, 9}));
  auto latest = LoadLatestCheckpoint(ckpt);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->first, 9u);
  EXPECT_EQ(latest->second, "from python 9");
}

// ---------------------------------------------------------------------------------------------
// Publishing models (publish.h): the Python SDK's protocol, in C++.

// A TorchScript archive is a zip file: PublishModel checks only the "PK" magic, as publish.py.
std::string FakeTorchScript(const std::string& tag) { return "PK\x03\x04 model " + tag; }

std::vector<uint64_t> Versions(const fs::path& model_dir) {
  return internal::ListVersions(model_dir.string());
}

class SdkPublishTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    for (const char* name : {kModelRepositoryEnv, kModelKeepEnv, kTestPublishWriteDelayEnv}) {
      ::unsetenv(name);
    }
    repo_ = dir_ / "repo";
    fs::create_directory(repo_);
    model_file_ = dir_ / "saved.pt";
    WriteAll(model_file_, FakeTorchScript("one"));
  }
  void TearDown() override {
    for (const char* name : {kModelRepositoryEnv, kModelKeepEnv, kTestPublishWriteDelayEnv}) {
      ::unsetenv(name);
    }
    TempDirTest::TearDown();
  }
  PublishOptions InRepo() {
    PublishOptions options;
    options.repository = repo_.string();
    return options;
  }

  fs::path repo_;
  fs::path model_file_;
};

TEST_F(SdkPublishTest, VersionsCountUpAndHoldTheModelAsSaved) {
  for (uint64_t expected = 1; expected <= 3; ++expected) {
    PublishResult published = PublishModel(model_file_.string(), "mlp", InRepo());
    ASSERT_TRUE(published.ok) << published.error;
    EXPECT_EQ(published.version, expected);
    EXPECT_EQ(published.path, (repo_ / "mlp" / std::to_string(expected)).string());
    EXPECT_EQ(ReadAll(repo_ / "mlp" / std::to_string(expected) / "model.pt"),
              FakeTorchScript("one"));
  }
  // Nothing but the versions and the lock is left in the model's directory.
  EXPECT_EQ(Names(repo_ / "mlp"), (std::set<std::string>{".publish.lock", "1", "2", "3"}));
}

TEST_F(SdkPublishTest, TheRepositoryComesFromTheEnvironment) {
  ::setenv(kModelRepositoryEnv, repo_.string().c_str(), 1);
  PublishResult published = PublishModel(model_file_.string(), "m");
  ASSERT_TRUE(published.ok) << published.error;
  EXPECT_TRUE(fs::is_regular_file(repo_ / "m" / "1" / "model.pt"));
}

TEST_F(SdkPublishTest, ADirectoryIsPublishedWholeAndTheConfigIsRewrittenOnlyWhenItChanges) {
  fs::path export_dir = dir_ / "export";
  fs::create_directory(export_dir);
  WriteAll(export_dir / "model.pt", FakeTorchScript("dir"));
  WriteAll(export_dir / "vocab.txt", "a\nb\n");
  PublishOptions options = InRepo();
  options.config = "max_batch_size: 8";
  ASSERT_TRUE(PublishModel(export_dir.string(), "text", options));
  // The marker that lets shoal serve load the version without waiting for it to settle.
  EXPECT_EQ(Names(repo_ / "text" / "1"),
            (std::set<std::string>{".shoal-complete", "model.pt", "vocab.txt"}));
  EXPECT_EQ(ReadAll(repo_ / "text" / "1" / "vocab.txt"), "a\nb\n");
  fs::path config = repo_ / "text" / "config.yaml";
  EXPECT_EQ(ReadAll(config), "max_batch_size: 8\n");
  auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(1);
  fs::last_write_time(config, old_time);
  ASSERT_TRUE(PublishModel(export_dir.string(), "text", options));
  EXPECT_EQ(fs::last_write_time(config), old_time) << "an unchanged config was rewritten";
  options.config = "max_batch_size: 16\n";
  ASSERT_TRUE(PublishModel(export_dir.string(), "text", options));
  EXPECT_EQ(ReadAll(config), "max_batch_size: 16\n");
  EXPECT_EQ(Versions(repo_ / "text"), (std::vector<uint64_t>{1, 2, 3}));
}

TEST_F(SdkPublishTest, BadArgumentsAreNamedAndPublishNothing) {
  fs::path not_model = dir_ / "bad.pt";
  WriteAll(not_model, "not a model");
  fs::path no_model_pt = dir_ / "empty-export";
  fs::create_directory(no_model_pt);
  WriteAll(no_model_pt / "vocab.txt", "x");
  auto with = [&](auto change) {
    PublishOptions options = InRepo();
    change(options);
    return options;
  };
  struct Case {
    std::string model;
    std::string name;
    PublishOptions options;
    std::string message;
  };
  std::vector<Case> cases = {
      {model_file_.string(), "m", PublishOptions{}, "no repository"},
      {model_file_.string(), "m", with([](PublishOptions& o) { o.repository = "hdfs:///models"; }),
       "must be hdfs://namenode[:port]/path"},
      {model_file_.string(), "m", with([](PublishOptions& o) { o.repository = "s3://b/models"; }),
       "s3:// URI"},
      {model_file_.string(), ".hidden", InRepo(), "model name '.hidden'"},
      {model_file_.string(), "a/b", InRepo(), "model name 'a/b'"},
      {model_file_.string(), "m", with([&](PublishOptions& o) { o.repository += "/missing"; }),
       "is not a directory"},
      {(dir_ / "none.pt").string(), "m", InRepo(), "cannot read the model"},
      {not_model.string(), "m", InRepo(), "is not a TorchScript archive"},
      {no_model_pt.string(), "m", InRepo(), "has no model.pt"},
      {model_file_.string(), "m", with([](PublishOptions& o) { o.metrics["loss"] = std::nan(""); }),
       "metric 'loss' must be a finite number"},
      {model_file_.string(), "m", with([](PublishOptions& o) { o.metrics[""] = 1; }),
       "metric name '' must be 1 to 128 bytes"},
      {model_file_.string(), "m",
       with([](PublishOptions& o) {
         for (int i = 0; i < 65; ++i) o.metrics["m" + std::to_string(i)] = i;
       }),
       "metrics has 65 entries; at most 64"},
  };
  for (const Case& c : cases) {
    PublishResult published = PublishModel(c.model, c.name, c.options);
    EXPECT_FALSE(published.ok) << c.message;
    EXPECT_NE(published.error.find(c.message), std::string::npos) << published.error;
  }
  ::setenv(kModelKeepEnv, "0", 1);
  PublishResult no_keep = PublishModel(model_file_.string(), "m", InRepo());
  EXPECT_NE(no_keep.error.find("SHOAL_MODEL_KEEP='0' must be an integer >= 1"), std::string::npos)
      << no_keep.error;
  EXPECT_FALSE(fs::exists(repo_ / "m"));
}

TEST_F(SdkPublishTest, KeepLeavesTheNewestVersions) {
  ::setenv(kModelKeepEnv, "2", 1);
  for (uint64_t expected = 1; expected <= 5; ++expected) {
    PublishResult published = PublishModel(model_file_.string(), "m", InRepo());
    ASSERT_TRUE(published.ok) << published.error;
    ASSERT_EQ(published.version, expected);
    std::vector<uint64_t> left;
    for (uint64_t v = expected > 1 ? expected - 1 : 1; v <= expected; ++v) left.push_back(v);
    EXPECT_EQ(Versions(repo_ / "m"), left);
  }
  EXPECT_EQ(Names(repo_ / "m"), (std::set<std::string>{".publish.lock", "4", "5"}));
}

TEST_F(SdkPublishTest, APublisherKilledMidWriteLeavesNoVersionAndTheNextClearsItsLeftovers) {
  ASSERT_TRUE(PublishModel(model_file_.string(), "m", InRepo()));
  std::string big(4 << 20, 'w');
  big.replace(0, 2, "PK");
  WriteAll(dir_ / "big.pt", big);
  pid_t writer = ::fork();
  if (writer == 0) {
    ::setenv(kTestPublishWriteDelayEnv, "30", 1);
    PublishModel((dir_ / "big.pt").string(), "m", InRepo());
    ::_exit(0);
  }
  ASSERT_GT(writer, 0);
  // Wait for the writer to be half-way: its hidden directory holds part of model.pt.
  fs::path model_dir = repo_ / "m";
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool half_written = false;
  while (!half_written && std::chrono::steady_clock::now() < deadline) {
    for (const auto& entry : fs::directory_iterator(model_dir)) {
      std::string name = entry.path().filename();
      std::error_code ec;
      if (name.rfind(kIncomingPrefix, 0) == 0 &&
          fs::file_size(entry.path() / "model.pt", ec) > 0 && !ec) {
        half_written = true;
      }
    }
    if (!half_written) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(half_written) << "the publisher never started writing";
  EXPECT_EQ(Versions(model_dir), (std::vector<uint64_t>{1})) << "a half-written version is visible";
  ::kill(writer, SIGKILL);
  ASSERT_EQ(::waitpid(writer, nullptr, 0), writer);
  EXPECT_EQ(Versions(model_dir), (std::vector<uint64_t>{1}));
  PublishResult next = PublishModel(model_file_.string(), "m", InRepo());
  ASSERT_TRUE(next.ok) << next.error;
  EXPECT_EQ(next.version, 2u);
  EXPECT_EQ(Names(model_dir), (std::set<std::string>{".publish.lock", "1", "2"}));
}

TEST_F(SdkPublishTest, CppAndPythonPublishersOfOneModelNeverShareANumber) {
  if (::access(SHOAL_SDK_PYTHON, X_OK) != 0) GTEST_SKIP() << SHOAL_SDK_PYTHON << " not found";
  // Python publishes more, and C++ starts once Python's first version is there, so that the
  // two take turns on the lock rather than one finishing before the other starts.
  constexpr int kCpp = 12;
  constexpr int kPython = 40;
  WriteAll(dir_ / "python.pt", FakeTorchScript("from python"));
  WriteAll(dir_ / "cpp.pt", FakeTorchScript("from c++"));
  WriteAll(dir_ / "publisher.py",
           "import sys\n"
           "from shoal.publish import publish_model\n"
           "print(' '.join(str(publish_model(sys.argv[1], 'shared', repository=sys.argv[2]))\n"
           "               for _ in range(" + std::to_string(kPython) + ")))\n");
  std::string command = std::string("env -u SHOAL_AGENT_SOCKET -u SHOAL_MODEL_KEEP PYTHONPATH=") +
                        SHOAL_SDK_PYTHONPATH + " PYTHONDONTWRITEBYTECODE=1 " + SHOAL_SDK_PYTHON +
                        " " + (dir_ / "publisher.py").string() + " " +
                        (dir_ / "python.pt").string() + " " + repo_.string();
  FILE* python = ::popen(command.c_str(), "r");
  ASSERT_NE(python, nullptr);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(repo_ / "shared" / "1") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<uint64_t> cpp_versions;
  for (int i = 0; i < kCpp; ++i) {
    PublishResult published = PublishModel((dir_ / "cpp.pt").string(), "shared", InRepo());
    ASSERT_TRUE(published.ok) << published.error;
    cpp_versions.push_back(published.version);
  }
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), python)) > 0) out.append(buffer, n);
  ASSERT_EQ(::pclose(python), 0) << out;
  std::vector<uint64_t> python_versions;
  std::istringstream words(out);
  for (uint64_t v; words >> v;) python_versions.push_back(v);
  ASSERT_EQ(python_versions.size(), static_cast<size_t>(kPython)) << out;
  EXPECT_TRUE(std::is_sorted(cpp_versions.begin(), cpp_versions.end()));
  EXPECT_TRUE(std::is_sorted(python_versions.begin(), python_versions.end()));
  std::set<uint64_t> all(cpp_versions.begin(), cpp_versions.end());
  all.insert(python_versions.begin(), python_versions.end());
  std::vector<uint64_t> expected;
  for (uint64_t v = 1; v <= kCpp + kPython; ++v) expected.push_back(v);
  EXPECT_EQ(std::vector<uint64_t>(all.begin(), all.end()), expected) << "a number was shared";
  EXPECT_EQ(Versions(repo_ / "shared"), expected);
  // Every version is whole, and is the model of the publisher that got its number.
  for (uint64_t v : cpp_versions) {
    EXPECT_EQ(ReadAll(repo_ / "shared" / std::to_string(v) / "model.pt"), FakeTorchScript("from c++"));
  }
  for (uint64_t v : python_versions) {
    EXPECT_EQ(ReadAll(repo_ / "shared" / std::to_string(v) / "model.pt"),
              FakeTorchScript("from python"));
  }
}

// ---------------------------------------------------------------------------------------------
// Reports, against a fake agent listening on an abstract Unix socket.

// Records every request line; answers `resumed` with `resumed_reply`, `published` with
// `published_reply` when one is given (as an agent older than that op does), nothing to the
// others.
class FakeAgent {
 public:
  explicit FakeAgent(std::string resumed_reply, std::string published_reply = "")
      : resumed_reply_(std::move(resumed_reply)), published_reply_(std::move(published_reply)) {
    static int counter = 0;
    name_ = "shoal-sdk-cc-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name_.data(), name_.size());
    socklen_t len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name_.size());
    if (::bind(listen_fd_, reinterpret_cast<struct sockaddr*>(&addr), len) != 0 ||
        ::listen(listen_fd_, 8) != 0) {
      ADD_FAILURE() << "cannot listen on @" << name_ << ": " << std::strerror(errno);
    }
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeAgent() {
    Close();
    accept_thread_.join();
    for (std::thread& t : conn_threads_) t.join();
  }

  std::string address() const { return "@" + name_; }

  // Stops listening and closes every connection, as a dead agent would.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : conn_fds_) ::shutdown(fd, SHUT_RDWR);
  }

  // Waits until `count` lines arrived; returns them all.
  std::vector<std::string> WaitForLines(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return lines_.size() >= count; });
    return lines_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) {
        ::close(fd);
        break;
      }
      conn_fds_.push_back(fd);
      conn_threads_.emplace_back([this, fd] { Serve(fd); });
    }
    ::close(listen_fd_);
  }

  void Serve(int fd) {
    std::string buffer;
    char chunk[4096];
    while (true) {
      ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) break;
      buffer.append(chunk, static_cast<size_t>(n));
      size_t end;
      while ((end = buffer.find('\n')) != std::string::npos) {
        std::string line = buffer.substr(0, end);
        buffer.erase(0, end + 1);
        if (line.find("\"op\":\"resumed\"") != std::string::npos) {
          std::string reply = resumed_reply_ + "\n";
          ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
        if (!published_reply_.empty() &&
            line.find("\"op\":\"published\"") != std::string::npos) {
          std::string reply = published_reply_ + "\n";
          ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
        std::lock_guard<std::mutex> lock(mu_);
        lines_.push_back(line);
        cv_.notify_all();
      }
    }
  }

  std::string name_;
  std::string resumed_reply_;
  std::string published_reply_;
  int listen_fd_ = -1;
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<int> conn_fds_;
  std::vector<std::thread> conn_threads_;
  std::vector<std::string> lines_;
};

class SdkReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("SHOAL_ROLE", "worker", 1);
    ::setenv("SHOAL_INDEX", "1", 1);
    ::setenv("SHOAL_RESTART_COUNT", "2", 1);
  }
  void TearDown() override {
    for (const char* name : {"SHOAL_AGENT_SOCKET", "SHOAL_ROLE", "SHOAL_INDEX",
                             "SHOAL_RESTART_COUNT"}) {
      ::unsetenv(name);
    }
  }
};

TEST_F(SdkReportTest, WithoutAnAgentReportsAreNoOps) {
  ::unsetenv("SHOAL_AGENT_SOCKET");
  ReportProgress(1);
  ReportCheckpointed(1);
  ReportResult resumed = ReportResumed(1);
  EXPECT_TRUE(resumed.ok) << resumed.error;
}

TEST_F(SdkReportTest, ReportsAreOneJsonLineEachWithTaskAndAttempt) {
  FakeAgent agent(R"({"ok":true})");
  ::setenv("SHOAL_AGENT_SOCKET", agent.address().c_str(), 1);
  ReportProgress(120);
  ReportCheckpointed(200);
  ReportResult resumed = ReportResumed(200);
  EXPECT_TRUE(resumed.ok) << resumed.error;
  EXPECT_EQ(agent.WaitForLines(3),
            (std::vector<std::string>{
                R"({"op":"progress","task":"worker:1","attempt":2,"step":120})",
                R"({"op":"checkpointed","task":"worker:1","attempt":2,"step":200})",
                R"({"op":"resumed","task":"worker:1","attempt":2,"step":200})"}));
}

TEST_F(SdkReportTest, APublicationIsReportedWithItsStepAndMetrics) {
  FakeAgent agent(R"({"ok":true})");
  ::setenv("SHOAL_AGENT_SOCKET", agent.address().c_str(), 1);
  std::string pattern = (fs::temp_directory_path() / "shoal-sdk-publish-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  fs::path dir = pattern;
  fs::create_directory(dir / "repo");
  WriteAll(dir / "model.pt", "PK model");
  PublishOptions options;
  options.repository = (dir / "repo").string();
  options.step = 1200;
  options.metrics = {{"loss", 0.12}, {"accuracy", 0.875}, {"samples", 64000}};
  PublishResult published = PublishModel((dir / "model.pt").string(), "mlp", options);
  ASSERT_TRUE(published.ok) << published.error;
  PublishOptions bare;
  bare.repository = options.repository;
  ASSERT_TRUE(PublishModel((dir / "model.pt").string(), "mlp", bare));
  fs::remove_all(dir);
  // Each on a connection of its own, so they may arrive in either order.
  std::vector<std::string> lines = agent.WaitForLines(2);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines,
            (std::vector<std::string>{
                R"({"op":"published","task":"worker:1","attempt":2,"model":"mlp","version":1,)"
                R"("repository":")" + (dir / "repo").string() +
                    R"(","metrics":{"accuracy":0.875,"loss":0.12,"samples":64000},"step":1200})",
                R"({"op":"published","task":"worker:1","attempt":2,"model":"mlp","version":2,)"
                R"("repository":")" + (dir / "repo").string() + R"(","metrics":{}})"}));
}

TEST_F(SdkReportTest, AnOlderAgentsErrorAnswerToAPublicationIsNotTakenForTheNextReply) {
  // An agent that does not know `published` answers it although the op wants no reply; on the
  // process's connection that answer would be read as the reply to its next ReportResumed.
  FakeAgent agent(R"({"ok":true})", R"({"ok":false,"error":"unknown op 'published'"})");
  ::setenv("SHOAL_AGENT_SOCKET", agent.address().c_str(), 1);
  std::string pattern = (fs::temp_directory_path() / "shoal-sdk-publish-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  fs::path dir = pattern;
  fs::create_directory(dir / "repo");
  WriteAll(dir / "model.pt", "PK model");
  ReportProgress(1);  // the process's connection is open before the publication
  PublishOptions options;
  options.repository = (dir / "repo").string();
  PublishResult published = PublishModel((dir / "model.pt").string(), "mlp", options);
  fs::remove_all(dir);
  ASSERT_TRUE(published.ok) << published.error;
  agent.WaitForLines(2);
  ReportResult resumed = ReportResumed(3);
  EXPECT_TRUE(resumed.ok) << resumed.error;
}

TEST_F(SdkReportTest, ARefusedResumedReturnsTheAgentsReason) {
  FakeAgent agent(R"json({"ok": false, "error": "stale attempt 2 (current is 3)"})json");
  ::setenv("SHOAL_AGENT_SOCKET", agent.address().c_str(), 1);
  ReportResult resumed = ReportResumed(5);
  EXPECT_FALSE(resumed.ok);
  EXPECT_NE(resumed.error.find("stale attempt 2 (current is 3)"), std::string::npos)
      << resumed.error;
}

TEST_F(SdkReportTest, ReportsToADeadAgentNeitherFailNorBlock) {
  FakeAgent agent(R"({"ok":true})");
  ::setenv("SHOAL_AGENT_SOCKET", agent.address().c_str(), 1);
  ReportProgress(1);
  agent.WaitForLines(1);
  agent.Close();
  for (uint64_t step = 2; step < 50; ++step) ReportProgress(step);  // warns once, then no-op
  ReportResult resumed = ReportResumed(3);
  EXPECT_FALSE(resumed.ok);
  EXPECT_NE(resumed.error.find("cannot get an answer"), std::string::npos) << resumed.error;
}

}  // namespace
}  // namespace shoal::sdk
