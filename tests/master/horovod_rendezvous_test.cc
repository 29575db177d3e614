#include "master/horovod_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "common/http_client.h"
#include "gtest/gtest.h"

namespace shoal::master {
namespace {

class HorovodRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = HorovodRendezvous::Start("127.0.0.1");
    ASSERT_TRUE(started.ok()) << started.status();
    store_ = std::move(*started);
    ASSERT_NE(store_->port(), 0);
  }

  common::HttpReply Send(const std::string& method, const std::string& target,
                         const std::string& body = "") {
    common::HttpRequest request;
    request.method = method;
    request.base = "http://127.0.0.1:" + std::to_string(store_->port());
    request.target = target;
    request.body = body;
    request.content_type = "application/octet-stream";
    auto reply = common::SendHttp(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : common::HttpReply{};
  }

  std::unique_ptr<HorovodRendezvous> store_;
};

TEST_F(HorovodRendezvousTest, StoresOpaqueBytesPerScopeAndKey) {
  std::string value("10.0.0.7:4242\0\xff", 15);
  EXPECT_EQ(Send("GET", "/global/0").status, 404);  // absent: answered at once
  EXPECT_EQ(Send("PUT", "/global/0", value).status, 200);
  common::HttpReply got = Send("GET", "/global/0");
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.body, value);
  EXPECT_EQ(Send("GET", "/local_localhost/0").status, 404);  // scopes are apart
  EXPECT_EQ(Send("PUT", "/global/0", "again").status, 200);
  EXPECT_EQ(Send("GET", "/global/0").body, "again");
  EXPECT_EQ(Send("GET", "/global/0?ignored=1").body, "again");
  EXPECT_EQ(Send("PUT", "/cross_0/a%20b", "spaced").status, 200);
  EXPECT_EQ(Send("GET", "/cross_0/a%20b").body, "spaced");
}

TEST_F(HorovodRendezvousTest, DeleteForgetsAKeyAndIsIdempotent) {
  ASSERT_EQ(Send("PUT", "/global/1", "x").status, 200);
  EXPECT_EQ(Send("DELETE", "/global/1").status, 200);
  EXPECT_EQ(Send("GET", "/global/1").status, 404);
  EXPECT_EQ(Send("DELETE", "/global/1").status, 200);
  EXPECT_EQ(Send("DELETE", "/never/seen").status, 200);
}

TEST_F(HorovodRendezvousTest, RefusesAnythingButScopeSlashKey) {
  for (const char* target : {"/", "/global", "/global/", "//0", "/a/b/c", "/global/0/"}) {
    EXPECT_EQ(Send("GET", target).status, 400) << target;
    EXPECT_EQ(Send("PUT", target, "v").status, 400) << target;
  }
  EXPECT_EQ(Send("POST", "/global/0", "v").status, 405);
  EXPECT_EQ(Send("GET", "/global/0").status, 404);  // nothing was stored by the refused requests
}

TEST_F(HorovodRendezvousTest, AStalledClientDoesNotHoldUpTheOthers) {
  // Connects and sends half a request, then nothing: the ranks' requests are still answered.
  int stalled = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(store_->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(stalled, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string half = "PUT /global/9 HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc";
  ASSERT_EQ(::write(stalled, half.data(), half.size()), static_cast<ssize_t>(half.size()));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 8; ++rank) {
    ranks.emplace_back([this, rank] {
      std::string key = "/global/" + std::to_string(rank);
      EXPECT_EQ(Send("PUT", key, "addr-" + std::to_string(rank)).status, 200);
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(Send("GET", "/global/" + std::to_string(rank)).body, "addr-" + std::to_string(rank));
  }
  EXPECT_EQ(Send("GET", "/global/9").status, 404);  // the half request stored nothing
  ::close(stalled);
}

TEST(HorovodRendezvousStartTest, AnAddressNotOfThisMachineIsAnError) {
  auto started = HorovodRendezvous::Start("192.0.2.1");  // TEST-NET-1: never local
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("192.0.2.1"), std::string::npos) << started.status();
}

}  // namespace
}  // namespace shoal::master
