// What KubeClient does without an API server; kube_client_cluster_test.cc covers the rest
// against the real test cluster.
#include "backends/kubernetes/kube_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::backends {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A loopback port where nothing listens: bound, never listened on, so connecting is refused.
class ClosedPort {
 public:
  ClosedPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~ClosedPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

KubeConfig ConfigFor(int port) {
  KubeConfig config;
  config.server = "https://127.0.0.1:" + std::to_string(port);
  config.token = "s3cr3t-token";
  config.source = "/test/kubeconfig (context test)";
  return config;
}

TEST(KubeClientTest, RefusesAServerThatIsNotAnHttpsUrl) {
  KubeConfig config = ConfigFor(1);
  config.server = "127.0.0.1:6443";
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(config);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(),
              HasSubstr("/test/kubeconfig (context test): the API server must be an https:// URL"));
}

TEST(KubeClientTest, APathMustBeginWithASlash) {
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(ConfigFor(1));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<nlohmann::json> reply = (*client)->Get("api/v1/namespaces");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->requests(), 0);
}

TEST(KubeClientTest, NoServerIsUnavailableNamingTheServerAndTheConfigButNotTheToken) {
  ClosedPort port;
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(ConfigFor(port.port()));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string server = "https://127.0.0.1:" + std::to_string(port.port());

  absl::StatusOr<nlohmann::json> reply = (*client)->Get("/api/v1/namespaces");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reply.status().message(),
              AllOf(HasSubstr("GET /api/v1/namespaces: " + server + ": "),
                    HasSubstr("(configuration from /test/kubeconfig (context test))"),
                    Not(HasSubstr("s3cr3t"))));

  absl::StatusOr<std::string> watched = (*client)->Watch(
      "/api/v1/configmaps", "", [](absl::string_view, const nlohmann::json&) {},
      [] { return false; });
  EXPECT_EQ(watched.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*client)->requests(), 2);
}

TEST(KubeClientTest, AnUnreadableTokenFileIsUnauthenticatedAndSendsNothing) {
  KubeConfig config = ConfigFor(1);
  config.token.clear();
  config.token_file = "/nonexistent/token";
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(config);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<nlohmann::json> reply = (*client)->Get("/api/v1/namespaces");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(reply.status().message(), HasSubstr("cannot read the token file /nonexistent/token"));
  EXPECT_EQ((*client)->requests(), 0);
}

TEST(KubeClientTest, ResourceVersionTooOldHasACodeOfItsOwn) {
  EXPECT_TRUE(IsResourceVersionTooOld(absl::Status(kResourceVersionTooOld, "gone")));
  for (absl::StatusCode other :
       {absl::StatusCode::kNotFound, absl::StatusCode::kUnavailable, absl::StatusCode::kAborted,
        absl::StatusCode::kAlreadyExists, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kUnknown, absl::StatusCode::kInternal}) {
    EXPECT_FALSE(IsResourceVersionTooOld(absl::Status(other, "x")));
  }
}

}  // namespace
}  // namespace shoal::backends
