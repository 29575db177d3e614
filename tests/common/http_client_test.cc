#include "common/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace shoal::common {
namespace {

// A listening loopback socket on a free port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    EXPECT_EQ(::listen(fd, 8), 0);
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port); }
};

// Reads one request (headers, then Content-Length bytes of body) from `fd`.
std::string ReadRequest(int fd) {
  std::string data;
  char buf[4096];
  size_t body_at = std::string::npos, want = 0;
  while (true) {
    if (body_at == std::string::npos) {
      size_t end = data.find("\r\n\r\n");
      if (end != std::string::npos) {
        body_at = end + 4;
        size_t cl = data.find("Content-Length: ");
        if (cl != std::string::npos && cl < end) want = std::stoul(data.substr(cl + 16));
      }
    }
    if (body_at != std::string::npos && data.size() >= body_at + want) return data;
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return data;
    data.append(buf, static_cast<size_t>(n));
  }
}

TEST(HttpClientTest, SendsTheRequestAndReturnsAReplyOfAnyStatus) {
  Listener server;
  std::string seen;
  std::thread peer([&] {
    int conn = ::accept(server.fd, nullptr, nullptr);
    seen = ReadRequest(conn);
    std::string reply = "HTTP/1.1 409 Conflict\r\nContent-Length: 7\r\n\r\nno, sir";
    ASSERT_EQ(::write(conn, reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
    ::close(conn);
  });
  HttpRequest request;
  request.method = "PUT";
  request.base = server.base();
  request.target = "/ws/v1/apps/7/state?user=x";
  request.body = R"({"state":"KILLED"})";
  request.headers = {{"Authorization", "Bearer t0k"}};
  auto reply = SendHttp(request);
  peer.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 409);
  EXPECT_EQ(reply->body, "no, sir");
  EXPECT_EQ(seen.rfind("PUT /ws/v1/apps/7/state?user=x HTTP/1.1\r\n", 0), 0u) << seen;
  EXPECT_NE(seen.find("Authorization: Bearer t0k\r\n"), std::string::npos) << seen;
  EXPECT_NE(seen.find("Content-Type: application/json\r\n"), std::string::npos) << seen;
  EXPECT_NE(seen.find("Content-Length: 18\r\n"), std::string::npos) << seen;
  EXPECT_EQ(seen.substr(seen.size() - 18), R"({"state":"KILLED"})");
}

TEST(HttpClientTest, AnInterimContinueIsSkippedForTheFinalReply) {
  // What a DataNode does with a WebHDFS PUT: "100 Continue" unasked, then its answer.
  Listener server;
  std::thread peer([&] {
    int conn = ::accept(server.fd, nullptr, nullptr);
    ReadRequest(conn);
    std::string reply =
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
    ASSERT_EQ(::write(conn, reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
    ::close(conn);
  });
  HttpRequest request;
  request.method = "PUT";
  request.base = server.base();
  request.target = "/webhdfs/v1/f?op=CREATE";
  request.body = "bytes";
  auto reply = SendHttp(request);
  peer.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 201);
}

TEST(HttpClientTest, ABodyFileIsSentAsTheBody) {
  std::string path = ::testing::TempDir() + "/http_client_body";
  std::string contents(300000, 'x');
  contents += "end";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(contents.data(), 1, contents.size(), f), contents.size());
  std::fclose(f);
  Listener server;
  std::string seen;
  std::thread peer([&] {
    int conn = ::accept(server.fd, nullptr, nullptr);
    seen = ReadRequest(conn);
    std::string reply = "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
    ASSERT_EQ(::write(conn, reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
    ::close(conn);
  });
  HttpRequest request;
  request.method = "PUT";
  request.base = server.base();
  request.target = "/f";
  request.body_file = path;
  auto reply = SendHttp(request);
  peer.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 201);
  EXPECT_NE(seen.find("Content-Length: 300003\r\n"), std::string::npos) << seen.substr(0, 300);
  ASSERT_GE(seen.size(), contents.size());
  EXPECT_EQ(seen.substr(seen.size() - contents.size()), contents);
  request.body_file = path + ".missing";
  EXPECT_EQ(SendHttp(request).status().code(), absl::StatusCode::kFailedPrecondition);
  std::remove(path.c_str());
}

TEST(HttpClientTest, NothingListeningIsUnavailable) {
  int port;
  {
    Listener closed;
    port = closed.port;
  }
  HttpRequest request;
  request.base = "http://127.0.0.1:" + std::to_string(port);
  request.target = "/";
  auto reply = SendHttp(request);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("GET " + request.base + "/"), std::string::npos)
      << reply.status();
}

TEST(HttpClientTest, APeerThatNeverAnswersTimesOut) {
  Listener server;  // accepted by the kernel, never read
  HttpRequest request;
  request.base = server.base();
  request.target = "/slow";
  request.timeout = std::chrono::milliseconds(200);
  auto reply = SendHttp(request);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("timed out"), std::string::npos) << reply.status();
}

TEST(HttpClientTest, ABadAddressOrMethodIsInvalidArgument) {
  for (const char* base : {"https://127.0.0.1:1", "127.0.0.1:80", "http://host", "http://h:0",
                           "http://h:99999", "http://:80"}) {
    HttpRequest request;
    request.base = base;
    auto reply = SendHttp(request);
    ASSERT_FALSE(reply.ok()) << base;
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << base;
  }
  HttpRequest request;
  request.method = "FETCH";
  request.base = "http://127.0.0.1:80";
  EXPECT_EQ(SendHttp(request).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::common
