#include "ui/ui_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/local_address.h"
#include "gtest/gtest.h"
#include "ui_test_support.h"

namespace shoal::ui {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::WriteJob;

struct RawReply {
  int status = 0;
  std::string head;
  std::string body;
  std::string Header(const std::string& name) const {
    size_t at = head.find("\r\n" + name + ": ");
    if (at == std::string::npos) return "";
    at += name.size() + 4;
    return head.substr(at, head.find("\r\n", at) - at);
  }
};

// One request on a fresh connection, read to its close.
RawReply Send(uint16_t port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string data;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) data.append(buf, static_cast<size_t>(n));
  ::close(fd);
  RawReply reply;
  size_t split = data.find("\r\n\r\n");
  reply.head = data.substr(0, split);
  reply.body = split == std::string::npos ? "" : data.substr(split + 4);
  if (data.size() > 12) reply.status = std::atoi(data.substr(9, 3).c_str());
  return reply;
}

RawReply Get(uint16_t port, const std::string& target, const std::string& extra = "") {
  return Send(port, absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                                 "\r\nConnection: close\r\n", extra, "\r\n"));
}

RawReply Post(uint16_t port, const std::string& target, const std::string& extra,
              const std::string& body = "") {
  return Send(port, absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                                 "\r\nConnection: close\r\nContent-Length: ", body.size(),
                                 "\r\n", extra, "\r\n", body));
}

class UiServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<UiServer> Start(const std::string& token = "", const std::string& host = "127.0.0.1") {
    UiServerOptions options;
    options.host = host;
    options.port = 0;
    options.jobs_root = root_.path();
    options.token = token;
    options.shoal_binary = SHOAL_BINARY;
    auto server = UiServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }
  TempDir root_;
};

TEST_F(UiServerTest, ListsJobsPageByPage) {
  for (int i = 0; i < 5; ++i) WriteJob(root_.path(), absl::StrCat("job-", i), "succeeded", i, i + 10);
  auto server = Start();
  RawReply reply = Get(server->port(), "/api/jobs?per_page=2&page=2&sort=created");
  ASSERT_EQ(reply.status, 200) << reply.body;
  json body = json::parse(reply.body);
  EXPECT_EQ(body["total"], 5);
  ASSERT_EQ(body["jobs"].size(), 2u);
  EXPECT_EQ(body["jobs"][0]["job_id"], "job-2");
  EXPECT_EQ(body["jobs"][0]["backend"], "local");
  EXPECT_EQ(body["jobs"][0]["duration_ms"], 10);
  EXPECT_EQ(body["states"]["succeeded"], 5);
}

TEST_F(UiServerTest, BadParametersAndUnknownJobsGetTheirOwnStatusAndSayWhy) {
  WriteJob(root_.path(), "job-1", "succeeded", 1, 2);
  auto server = Start();
  RawReply reply = Get(server->port(), "/api/jobs?per_page=0");
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(json::parse(reply.body)["error"].get<std::string>().find("per_page"), std::string::npos);
  EXPECT_EQ(Get(server->port(), "/api/jobs?page=two").status, 400);
  EXPECT_EQ(Get(server->port(), "/api/jobs?state=runing").status, 400);
  reply = Get(server->port(), "/api/jobs/nope");
  EXPECT_EQ(reply.status, 404);
  EXPECT_NE(reply.body.find("nope"), std::string::npos);
  EXPECT_EQ(Get(server->port(), "/api/jobs/..").status, 400);
  EXPECT_EQ(Get(server->port(), "/api/jobs/%2e%2e/timeline").status, 400);
  EXPECT_EQ(Get(server->port(), "/api/jobs/job-1/logs?before=-5").status, 400);
  EXPECT_EQ(Get(server->port(), "/api/nothing").status, 404);
  EXPECT_EQ(Get(server->port(), "/no/such/page").status, 404);
  EXPECT_EQ(Send(server->port(), "BLAH\r\n\r\n").status, 400);
  EXPECT_EQ(Post(server->port(), "/api/jobs", "X-Shoal-Request: 1\r\n").status, 405);
}

TEST_F(UiServerTest, PagesComeWithAPolicyThatForbidsInlineScript) {
  auto server = Start();
  for (const char* page : {"/", "/jobs/some-job", "/models"}) {
    RawReply reply = Get(server->port(), page);
    ASSERT_EQ(reply.status, 200) << page;
    EXPECT_TRUE(absl::StrContains(reply.body, "/assets/app.js"));
    EXPECT_TRUE(absl::StrContains(reply.Header("Content-Security-Policy"), "script-src 'self'"));
    EXPECT_EQ(reply.Header("X-Content-Type-Options"), "nosniff");
  }
  RawReply js = Get(server->port(), "/assets/app.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_TRUE(absl::StartsWith(js.Header("Content-Type"), "text/javascript"));
  EXPECT_FALSE(js.body.empty());
}

TEST_F(UiServerTest, TheTimelineOfAPartlyWrittenJournalIsServedAndMarked) {
  WriteJob(root_.path(), "job-1", "running", 1, 0);
  ASSERT_TRUE(WriteFileAtomically(root_.path() + "/job-1/events.jsonl",
                                  "{\"type\":\"job_submitted\",\"ts\":5}\n{\"type\":\"task_st")
                  .ok());
  auto server = Start();
  RawReply reply = Get(server->port(), "/api/jobs/job-1/timeline");
  ASSERT_EQ(reply.status, 200);
  json body = json::parse(reply.body);
  EXPECT_TRUE(body["truncated"].get<bool>());
  EXPECT_EQ(body["start_unix_ms"], 5);
  WriteJob(root_.path(), "job-2", "running", 1, 0);
  EXPECT_EQ(Get(server->port(), "/api/jobs/job-2/timeline").status, 404);
}

TEST_F(UiServerTest, StateChangesNeedTheUisOwnHeaderAndOrigin) {
  WriteJob(root_.path(), "job-1", "succeeded", 1, 2);
  auto server = Start();
  uint16_t port = server->port();
  EXPECT_EQ(Post(port, "/api/jobs/job-1/kill", "").status, 403);
  EXPECT_EQ(Post(port, "/api/jobs/job-1/kill", "X-Shoal-Request: 1\r\nOrigin: http://evil.example\r\n").status, 403);
  EXPECT_EQ(Post(port, "/api/jobs/job-1/kill", "X-Shoal-Request: 1\r\nSec-Fetch-Site: cross-site\r\n").status, 403);
  RawReply reply = Post(port, "/api/jobs/job-1/kill",
                        absl::StrCat("X-Shoal-Request: 1\r\nOrigin: http://127.0.0.1:", port, "\r\n"));
  EXPECT_EQ(reply.status, 409) << reply.body;  // past the guard: the job has ended
  EXPECT_NE(reply.body.find("already ended"), std::string::npos);
  EXPECT_EQ(Get(port, "/api/jobs/job-1/kill").status, 405);
}

TEST_F(UiServerTest, OffLoopbackWithoutATokenItRefusesToStart) {
  UiServerOptions options;
  options.host = "0.0.0.0";
  options.port = 0;
  options.jobs_root = root_.path();
  auto server = UiServer::Start(options);
  ASSERT_TRUE(absl::IsInvalidArgument(server.status()));
  EXPECT_NE(server.status().message().find("--token-file"), std::string::npos);
  EXPECT_TRUE(common::IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(common::IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(common::IsLoopbackHost("::1"));
  EXPECT_FALSE(common::IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(common::IsLoopbackHost("10.0.0.1"));
}

TEST_F(UiServerTest, WithATokenCallersSignInOrPresentIt) {
  WriteJob(root_.path(), "job-1", "succeeded", 1, 2);
  const std::string token = "0123456789abcdef0123";
  auto server = Start(token);
  uint16_t port = server->port();
  EXPECT_EQ(Get(port, "/api/jobs").status, 401);
  EXPECT_EQ(Get(port, "/metrics").status, 401);
  EXPECT_EQ(Get(port, "/api/jobs", "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(Get(port, "/api/jobs", absl::StrCat("Authorization: Bearer ", token, "\r\n")).status, 200);
  RawReply page = Get(port, "/");
  EXPECT_EQ(page.status, 303);
  EXPECT_EQ(page.Header("Location"), "/login");
  EXPECT_EQ(Get(port, "/login").status, 200);
  EXPECT_EQ(Get(port, "/assets/app.css").status, 200);  // the login page's style
  EXPECT_EQ(Get(port, "/assets/app.js").status, 303);
  RawReply wrong = Post(port, "/login", "Content-Type: application/x-www-form-urlencoded\r\n", "token=nope");
  EXPECT_EQ(wrong.status, 401);
  EXPECT_TRUE(wrong.Header("Set-Cookie").empty());
  RawReply login = Post(port, "/login", "Content-Type: application/x-www-form-urlencoded\r\n",
                        absl::StrCat("token=", token));
  EXPECT_EQ(login.status, 303);
  std::string cookie = login.Header("Set-Cookie");
  EXPECT_NE(cookie.find("HttpOnly"), std::string::npos);
  EXPECT_NE(cookie.find("SameSite=Strict"), std::string::npos);
  std::string pair = cookie.substr(0, cookie.find(';'));
  EXPECT_EQ(Get(port, "/api/jobs", absl::StrCat("Cookie: ", pair, "\r\n")).status, 200);
  EXPECT_EQ(Get(port, "/", absl::StrCat("Cookie: other=1; ", pair, "\r\n")).status, 200);
}

TEST_F(UiServerTest, FollowingTheLogOfAFinishedJobSendsItThenEnds) {
  WriteJob(root_.path(), "job-1", "succeeded", 1, 2);
  ASSERT_TRUE(WriteFileAtomically(root_.path() + "/job-1/logs.txt",
                                  "worker:0 | a\nworker:1 | <b>b</b>\nworker:0 | c\n")
                  .ok());
  auto server = Start();
  RawReply reply = Get(server->port(), "/api/jobs/job-1/logs/follow?from=0&task=worker:0");
  ASSERT_EQ(reply.status, 200);
  EXPECT_EQ(reply.Header("Content-Type"), "text/event-stream");
  EXPECT_NE(reply.body.find("event: lines\ndata: "), std::string::npos);
  EXPECT_NE(reply.body.find("\"text\":\"a\""), std::string::npos);
  EXPECT_NE(reply.body.find("\"text\":\"c\""), std::string::npos);
  EXPECT_EQ(reply.body.find("<b>"), std::string::npos);  // another task's line
  EXPECT_NE(reply.body.find("event: end"), std::string::npos);
  EXPECT_EQ(Get(server->port(), "/api/jobs/none/logs/follow").status, 404);
}

TEST_F(UiServerTest, StopEndsFollowersOfARunningJob) {
  WriteJob(root_.path(), "job-1", "running", 1, 0);
  // A live master: this process's pid stands in for it.
  ASSERT_TRUE(WriteFileAtomically(root_.path() + "/job-1/master.json",
                                  absl::StrCat("{\"address\":\"127.0.0.1:1\",\"pid\":", ::getpid(), "}"))
                  .ok());
  auto server = Start();
  uint16_t port = server->port();
  std::thread follower([port] {
    RawReply reply = Get(port, "/api/jobs/job-1/logs/follow");
    EXPECT_EQ(reply.status, 200);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server->Stop();  // must not hang on the follower
  follower.join();
}

}  // namespace
}  // namespace shoal::ui
