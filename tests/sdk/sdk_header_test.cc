// Tests of the header-only C++ SDK, sdk/cpp/shoal/sdk.h: checkpoint files (naming, atomic
// writes, retention, load fallbacks), files shared with the Python SDK, and the reports sent to
// a fake agent on a real abstract Unix socket. Compiled as C++17 (see CMakeLists.txt).
#include "shoal/sdk.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
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
// Reports, against a fake agent listening on an abstract Unix socket.

// Records every request line; answers `resumed` with `resumed_reply`, nothing to the others.
class FakeAgent {
 public:
  explicit FakeAgent(std::string resumed_reply) : resumed_reply_(std::move(resumed_reply)) {
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
        std::lock_guard<std::mutex> lock(mu_);
        lines_.push_back(line);
        cv_.notify_all();
      }
    }
  }

  std::string name_;
  std::string resumed_reply_;
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
