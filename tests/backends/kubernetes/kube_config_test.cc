#include "backends/kubernetes/kube_config.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::backends {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kCert[] = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
constexpr char kKey[] = "-----BEGIN PRIVATE KEY-----\nMIIEsecretkey\n-----END PRIVATE KEY-----\n";
constexpr char kToken[] = "s3cr3t-token-value";

class KubeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "shoal-kubeconfig-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }

  // A kubeconfig with one context "test" whose cluster and user bodies are given.
  std::string WriteConfig(const std::string& cluster, const std::string& user,
                          const std::string& name = "config") {
    return Write(name,
                 "apiVersion: v1\nkind: Config\n"
                 "clusters:\n- name: c\n  cluster:\n" +
                     cluster + "users:\n- name: u\n  user:\n" + user +
                     "contexts:\n- name: test\n  context: {cluster: c, user: u}\n"
                     "current-context: test\n");
  }

  // Where LoadKubeConfig looks, all inside the temporary folder: nothing of the real machine.
  KubeConfigSearch EmptySearch() {
    KubeConfigSearch search;
    search.home = (dir_ / "home").string();
    search.service_account_dir = (dir_ / "serviceaccount").string();
    return search;
  }

  fs::path dir_;
};

constexpr char kServer[] = "    server: https://127.0.0.1:6443\n";

TEST_F(KubeConfigTest, ReadsTheCurrentContextWithCertificateFiles) {
  const std::string ca = Write("pki/ca.crt", kCert);
  const std::string cert = Write("pki/admin.crt", kCert);
  const std::string key = Write("pki/admin.key", kKey);
  const std::string path =
      WriteConfig(std::string(kServer) + "    certificate-authority: " + ca + "\n",
                  "    client-certificate: " + cert + "\n    client-key: " + key + "\n");
  absl::StatusOr<KubeConfig> config = ReadKubeConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://127.0.0.1:6443");
  EXPECT_EQ(config->certificate_authority.file, ca);
  EXPECT_EQ(config->client_certificate.file, cert);
  EXPECT_EQ(config->client_key.file, key);
  EXPECT_TRUE(config->certificate_authority.pem.empty());
  EXPECT_TRUE(config->token.empty());
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->namespace_, "");
  EXPECT_EQ(config->source, path + " (context test)");
}

TEST_F(KubeConfigTest, ResolvesRelativeFilesAgainstTheKubeconfigsFolder) {
  Write("conf/pki/ca.crt", kCert);
  Write("conf/pki/admin.crt", kCert);
  Write("conf/pki/admin.key", kKey);
  Write("conf/token", kToken);
  const std::string path =
      WriteConfig(std::string(kServer) + "    certificate-authority: pki/ca.crt\n",
                  "    client-certificate: pki/admin.crt\n    client-key: ./pki/admin.key\n"
                  "    tokenFile: token\n",
                  "conf/kubeconfig");
  absl::StatusOr<KubeConfig> config = ReadKubeConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->certificate_authority.file, (dir_ / "conf/pki/ca.crt").string());
  EXPECT_EQ(config->client_certificate.file, (dir_ / "conf/pki/admin.crt").string());
  EXPECT_EQ(config->client_key.file, (dir_ / "conf/pki/admin.key").string());
  EXPECT_EQ(config->token_file, (dir_ / "conf/token").string());
  EXPECT_TRUE(config->token.empty());
}

TEST_F(KubeConfigTest, DecodesBase64DataFields) {
  const std::string path = WriteConfig(
      std::string(kServer) + "    certificate-authority-data: " + absl::Base64Escape(kCert) + "\n",
      "    client-certificate-data: " + absl::Base64Escape(kCert) +
          "\n    client-key-data: " + absl::Base64Escape(kKey) + "\n    token: " + kToken + "\n");
  absl::StatusOr<KubeConfig> config = ReadKubeConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->certificate_authority.pem, kCert);
  EXPECT_EQ(config->client_certificate.pem, kCert);
  EXPECT_EQ(config->client_key.pem, kKey);
  EXPECT_TRUE(config->client_key.file.empty());
  EXPECT_EQ(config->token, kToken);
}

TEST_F(KubeConfigTest, SelectsTheCurrentContextAmongSeveralOrTheOneAskedFor) {
  const std::string path = Write("config", R"(
clusters:
- {name: one, cluster: {server: "https://one.example:6443/", insecure-skip-tls-verify: true}}
- {name: two, cluster: {server: "https://two.example:443"}}
users:
- {name: alice, user: {token: alice-token}}
- {name: bob, user: {token: bob-token}}
contexts:
- {name: first, context: {cluster: one, user: alice, namespace: ns-one}}
- {name: second, context: {cluster: two, user: bob, namespace: ns-two}}
current-context: second
)");
  absl::StatusOr<KubeConfig> current = ReadKubeConfigFile(path);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(current->server, "https://two.example:443");
  EXPECT_EQ(current->token, "bob-token");
  EXPECT_EQ(current->namespace_, "ns-two");
  EXPECT_EQ(current->source, path + " (context second)");

  absl::StatusOr<KubeConfig> first = ReadKubeConfigFile(path, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->server, "https://one.example:6443");
  EXPECT_TRUE(first->insecure_skip_tls_verify);
  EXPECT_EQ(first->token, "alice-token");
  EXPECT_EQ(first->namespace_, "ns-one");
}

TEST_F(KubeConfigTest, AContextWithoutUserHasNoCredentials) {
  const std::string path = Write("config", R"(
clusters: [{name: c, cluster: {server: "http://127.0.0.1:8080"}}]
contexts: [{name: plain, context: {cluster: c}}]
current-context: plain
)");
  absl::StatusOr<KubeConfig> config = ReadKubeConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "http://127.0.0.1:8080");
  EXPECT_TRUE(config->client_certificate.empty());
  EXPECT_TRUE(config->token.empty());
}

// The error of reading `text` as a kubeconfig.
absl::Status ErrorOf(const absl::StatusOr<KubeConfig>& config) {
  EXPECT_FALSE(config.ok());
  return config.status();
}

TEST_F(KubeConfigTest, AFileThatCannotBeReadIsNamed) {
  const std::string path = (dir_ / "missing").string();
  const absl::Status status = ErrorOf(ReadKubeConfigFile(path));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), path + ": no such file " + path);
}

TEST_F(KubeConfigTest, BadYamlNamesTheFileAndLine) {
  const std::string path = Write("config", "clusters:\n- name: c\n  cluster: {server: [\n");
  const absl::Status status = ErrorOf(ReadKubeConfigFile(path));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":"));
  EXPECT_THAT(status.message(), HasSubstr("not a valid kubeconfig"));
}

TEST_F(KubeConfigTest, AnEmptyOrNonMapFileIsRefused) {
  EXPECT_EQ(ErrorOf(ReadKubeConfigFile(Write("empty", ""))).message(),
            (dir_ / "empty").string() + ": empty");
  EXPECT_THAT(ErrorOf(ReadKubeConfigFile(Write("list", "- a\n- b\n"))).message(),
              HasSubstr("its top level is not a map"));
}

TEST_F(KubeConfigTest, AMissingCurrentContextListsTheContexts) {
  const std::string path = Write("config", R"(
clusters: [{name: c, cluster: {server: "https://x:1"}}]
contexts: [{name: a, context: {cluster: c}}, {name: b, context: {cluster: c}}]
)");
  const absl::Status status = ErrorOf(ReadKubeConfigFile(path));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(path + ":"), HasSubstr(": current-context: not set"),
                    HasSubstr("contexts \"a\", \"b\"")));
}

TEST_F(KubeConfigTest, AnUnknownContextClusterOrUserIsNamed) {
  const std::string head =
      "clusters: [{name: c, cluster: {server: \"https://x:1\"}}]\n"
      "users: [{name: u, user: {token: t}}]\n";
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(Write("a", head + "contexts: [{name: a, context: {cluster: c}}]\n"
                                                   "current-context: nope\n")))
          .message(),
      AllOf(HasSubstr(": contexts: no context named \"nope\""), HasSubstr("\"a\"")));
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(Write("b", head + "contexts: [{name: a, context: {cluster: d}}]\n"
                                                   "current-context: a\n")))
          .message(),
      HasSubstr(": clusters: no cluster named \"d\" (the file has clusters \"c\")"));
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(Write("c", head + "contexts: [{name: a, context: {cluster: c, "
                                                   "user: v}}]\ncurrent-context: a\n")))
          .message(),
      HasSubstr(": users: no user named \"v\" (the file has users \"u\")"));
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(Write("d", head + "contexts: [{name: a, context: {user: u}}]\n"
                                                   "current-context: a\n")))
          .message(),
      HasSubstr(":3: contexts[0].context.cluster: required"));
}

TEST_F(KubeConfigTest, TheServerIsRequiredAndMustBeAnHttpsUrl) {
  EXPECT_THAT(ErrorOf(ReadKubeConfigFile(
                          WriteConfig("    insecure-skip-tls-verify: true\n", "    token: t\n")))
                  .message(),
              HasSubstr(":6: clusters[0].cluster.server: required"));
  const absl::Status status =
      ErrorOf(ReadKubeConfigFile(WriteConfig("    server: 127.0.0.1:6443\n", "    token: t\n")));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr(":6: clusters[0].cluster.server: must be an https:// URL, got "
                        "\"127.0.0.1:6443\""));
}

TEST_F(KubeConfigTest, AMissingCertificateFileNamesTheKeyAndTheFile) {
  const std::string path = WriteConfig(std::string(kServer),
                                       "    client-certificate: /nonexistent/admin.crt\n"
                                       "    client-key: /nonexistent/admin.key\n");
  const absl::Status status = ErrorOf(ReadKubeConfigFile(path));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            path + ":10: users[0].user.client-certificate: no such file /nonexistent/admin.crt");

  const std::string relative = WriteConfig(
      std::string(kServer) + "    certificate-authority: pki/ca.crt\n", "    token: t\n", "rel");
  EXPECT_EQ(ErrorOf(ReadKubeConfigFile(relative)).message(),
            relative + ":7: clusters[0].cluster.certificate-authority: no such file " +
                (dir_ / "pki/ca.crt").string());
}

TEST_F(KubeConfigTest, AFileWithoutPemIsRefused) {
  const std::string not_pem = Write("ca.crt", "just text\n");
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(
                  WriteConfig(std::string(kServer) + "    certificate-authority: " + not_pem + "\n",
                              "    token: t\n")))
          .message(),
      HasSubstr("clusters[0].cluster.certificate-authority: " + not_pem + " holds no PEM block"));
}

TEST_F(KubeConfigTest, BadBase64AndNonPemDataAreRefusedWithoutShowingThem) {
  const absl::Status bad_base64 =
      ErrorOf(ReadKubeConfigFile(WriteConfig(std::string(kServer),
                                             "    client-certificate-data: '%%%notbase64'\n"
                                             "    client-key-data: " +
                                                 absl::Base64Escape(kKey) + "\n")));
  EXPECT_EQ(bad_base64.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_base64.message(),
              AllOf(HasSubstr(":10: users[0].user.client-certificate-data: not valid base64"),
                    Not(HasSubstr("notbase64"))));

  const std::string secret = "-not PEM- secret bytes";
  const absl::Status not_pem = ErrorOf(ReadKubeConfigFile(WriteConfig(
      std::string(kServer), "    client-certificate-data: " + absl::Base64Escape(kCert) +
                                "\n"
                                "    client-key-data: " +
                                absl::Base64Escape(secret) + "\n")));
  EXPECT_THAT(not_pem.message(),
              AllOf(HasSubstr(":11: users[0].user.client-key-data: holds no PEM block once "
                              "decoded from base64"),
                    Not(HasSubstr("secret")), Not(HasSubstr(absl::Base64Escape(secret)))));
}

TEST_F(KubeConfigTest, AFileAndItsDataTogetherAreRefused) {
  const std::string ca = Write("ca.crt", kCert);
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(WriteConfig(
                  std::string(kServer) + "    certificate-authority: " + ca +
                      "\n    certificate-authority-data: " + absl::Base64Escape(kCert) + "\n",
                  "    token: t\n")))
          .message(),
      HasSubstr("clusters[0].cluster.certificate-authority-data: both "
                "certificate-authority and certificate-authority-data are set; keep one"));
}

TEST_F(KubeConfigTest, ACertificateWithoutKeyIsRefused) {
  const std::string cert = Write("admin.crt", kCert);
  EXPECT_THAT(ErrorOf(ReadKubeConfigFile(WriteConfig(std::string(kServer),
                                                     "    client-certificate: " + cert + "\n")))
                  .message(),
              HasSubstr("users[0].user: client-certificate without client-key"));
}

TEST_F(KubeConfigTest, InsecureTogetherWithACertificateAuthorityIsRefused) {
  const std::string ca = Write("ca.crt", kCert);
  EXPECT_THAT(
      ErrorOf(ReadKubeConfigFile(WriteConfig(std::string(kServer) + "    certificate-authority: " +
                                                 ca + "\n    insecure-skip-tls-verify: true\n",
                                             "    token: t\n")))
          .message(),
      HasSubstr(":8: clusters[0].cluster.insecure-skip-tls-verify: true together with "
                "a certificate-authority; keep one"));
  EXPECT_THAT(ErrorOf(ReadKubeConfigFile(WriteConfig(
                          std::string(kServer) + "    insecure-skip-tls-verify: maybe\n",
                          "    token: t\n")))
                  .message(),
              HasSubstr("clusters[0].cluster.insecure-skip-tls-verify: must be true or false"));
}

TEST_F(KubeConfigTest, ExecPluginsAndAuthProvidersAreRefusedByName) {
  const absl::Status exec = ErrorOf(ReadKubeConfigFile(WriteConfig(
      std::string(kServer),
      "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n"
      "      args: [eks, get-token]\n")));
  EXPECT_EQ(exec.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exec.message(),
              HasSubstr(":10: users[0].user.exec: exec credential plugins are not supported "
                        "(command \"aws\"); use a client certificate, token or tokenFile"));

  const absl::Status provider = ErrorOf(ReadKubeConfigFile(
      WriteConfig(std::string(kServer), "    auth-provider:\n      name: gcp\n")));
  EXPECT_THAT(provider.message(),
              HasSubstr(":10: users[0].user.auth-provider: auth provider \"gcp\" is not "
                        "supported"));

  const absl::Status basic = ErrorOf(ReadKubeConfigFile(
      WriteConfig(std::string(kServer), "    username: admin\n    password: hunter2\n")));
  EXPECT_THAT(basic.message(),
              AllOf(HasSubstr("users[0].user.username: basic authentication is not supported"),
                    Not(HasSubstr("hunter2"))));
}

TEST_F(KubeConfigTest, AMissingTokenFileIsNamed) {
  const std::string path = WriteConfig(std::string(kServer), "    tokenFile: secrets/token\n");
  EXPECT_EQ(
      ErrorOf(ReadKubeConfigFile(path)).message(),
      path + ":10: users[0].user.tokenFile: no such file " + (dir_ / "secrets/token").string());
}

TEST_F(KubeConfigTest, AnInlineTokenWinsOverATokenFileAndIsNeverInAMessage) {
  const std::string path = WriteConfig(
      std::string(kServer), std::string("    token: ") + kToken + "\n    tokenFile: /nowhere\n");
  absl::StatusOr<KubeConfig> config = ReadKubeConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->token, kToken);
  EXPECT_TRUE(config->token_file.empty());

  const absl::Status status = ErrorOf(ReadKubeConfigFile(
      WriteConfig("    server: nope\n", std::string("    token: ") + kToken + "\n", "bad")));
  EXPECT_THAT(status.message(), Not(HasSubstr(kToken)));
}

TEST_F(KubeConfigTest, LoadPrefersTheExplicitFile) {
  const std::string explicit_path =
      WriteConfig("    server: https://explicit:1\n", "    token: t\n", "explicit");
  KubeConfigSearch search = EmptySearch();
  search.kubeconfig_env = WriteConfig("    server: https://env:1\n", "    token: t\n", "env");
  absl::StatusOr<KubeConfig> config = LoadKubeConfig(explicit_path, search);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://explicit:1");

  const absl::Status missing = ErrorOf(LoadKubeConfig((dir_ / "nope").string(), search));
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr((dir_ / "nope").string() + ": no such file"));
}

TEST_F(KubeConfigTest, LoadTakesTheFirstExistingFileOfKubeconfig) {
  const std::string second = WriteConfig("    server: https://second:1\n", "    token: t\n", "b");
  const std::string third = WriteConfig("    server: https://third:1\n", "    token: t\n", "c");
  Write("home/.kube/config", "not: used\n");
  KubeConfigSearch search = EmptySearch();
  search.kubeconfig_env = (dir_ / "a").string() + "::" + second + ":" + third;
  absl::StatusOr<KubeConfig> config = LoadKubeConfig(std::nullopt, search);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://second:1");
}

TEST_F(KubeConfigTest, LoadFallsBackToTheHomeConfig) {
  const std::string home_config =
      WriteConfig("    server: https://home:1\n", "    token: t\n", "home/.kube/config");
  KubeConfigSearch search = EmptySearch();
  search.kubeconfig_env = (dir_ / "missing").string();
  absl::StatusOr<KubeConfig> config = LoadKubeConfig(std::nullopt, search);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://home:1");
  EXPECT_EQ(config->source, home_config + " (context test)");
}

TEST_F(KubeConfigTest, LoadFallsBackToTheInClusterServiceAccount) {
  Write("serviceaccount/token", std::string(kToken) + "\n");
  const std::string ca = Write("serviceaccount/ca.crt", kCert);
  Write("serviceaccount/namespace", "team-a");
  KubeConfigSearch search = EmptySearch();
  search.service_host = "10.0.0.1";
  search.service_port = "443";
  absl::StatusOr<KubeConfig> config = LoadKubeConfig(std::nullopt, search);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:443");
  EXPECT_EQ(config->token_file, (dir_ / "serviceaccount/token").string());
  EXPECT_TRUE(config->token.empty()) << "read on each request, never kept";
  EXPECT_EQ(config->certificate_authority.file, ca);
  EXPECT_EQ(config->namespace_, "team-a");
  EXPECT_THAT(config->source, HasSubstr("in-cluster service account"));

  search.service_host = "fd00::1";
  config = InClusterKubeConfig(search);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
}

TEST_F(KubeConfigTest, InClusterWithoutATokenIsAnError) {
  KubeConfigSearch search = EmptySearch();
  search.service_host = "10.0.0.1";
  search.service_port = "443";
  const absl::Status status = ErrorOf(LoadKubeConfig(std::nullopt, search));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("service account token: no such file " +
                                          (dir_ / "serviceaccount/token").string()));
}

TEST_F(KubeConfigTest, NoConfigurationAnywhereIsNotFoundAndSaysWhereItLooked) {
  KubeConfigSearch search = EmptySearch();
  search.kubeconfig_env = (dir_ / "x").string() + ":" + (dir_ / "y").string();
  const absl::Status status = ErrorOf(LoadKubeConfig(std::nullopt, search));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("no Kubernetes configuration found"), HasSubstr("--kubeconfig"),
                    HasSubstr("$KUBECONFIG (" + *search.kubeconfig_env + ")"),
                    HasSubstr((dir_ / "home/.kube/config").string()),
                    HasSubstr("KUBERNETES_SERVICE_HOST")));

  search.kubeconfig_env.reset();
  search.home.reset();
  EXPECT_THAT(ErrorOf(LoadKubeConfig(std::nullopt, search)).message(),
              AllOf(HasSubstr("$KUBECONFIG is not set"), HasSubstr("$HOME is not set")));
}

}  // namespace
}  // namespace shoal::backends
