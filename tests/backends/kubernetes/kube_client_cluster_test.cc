// KubeClient against the real one-node test cluster (tests/kubernetes/cluster.sh), whose
// admin kubeconfig $KUBECONFIG names. ctest brings the cluster up first (the
// kubernetes_cluster fixture); run by hand, set KUBECONFIG yourself. One test also talks to the
// cluster's etcd, at $SHOAL_KUBERNETES_ETCD (default http://127.0.0.1:2379).
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kube_config.h"
#include "common/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::backends {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr char kConfigMaps[] = "/api/v1/namespaces/default/configmaps";
// How long a test waits for the cluster to show something it must show: generous, so a
// loaded machine does not fail the test; it bounds a hang, it measures nothing.
constexpr auto kPatience = std::chrono::seconds(60);

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A name no other run of this test uses.
std::string UniqueName(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return absl::StrCat(prefix, "-", getpid(), "-",
                      std::chrono::steady_clock::now().time_since_epoch().count() % 1000000, "-",
                      counter++);
}

class KubeClientClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* kubeconfig = std::getenv("KUBECONFIG");
    ASSERT_NE(kubeconfig, nullptr)
        << "KUBECONFIG is not set: this test needs the Kubernetes test cluster "
           "(tests/kubernetes/cluster.sh up prints it; ctest sets it)";
    absl::StatusOr<KubeConfig> config = LoadKubeConfig(std::string(kubeconfig));
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(config_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    std::string pattern = (fs::temp_directory_path() / "shoal-kube-client-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }

  void TearDown() override {
    for (const std::string& path : cleanup_) (void)client_->Delete(path);
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Creates a ConfigMap in "default" with `labels`, deleted after the test.
  nlohmann::json CreateConfigMap(const std::string& name, const nlohmann::json& labels = {}) {
    nlohmann::json object = {{"apiVersion", "v1"},
                             {"kind", "ConfigMap"},
                             {"metadata", {{"name", name}}},
                             {"data", {{"step", "1"}}}};
    if (!labels.is_null()) object["metadata"]["labels"] = labels;
    absl::StatusOr<nlohmann::json> created = client_->Create(kConfigMaps, object);
    EXPECT_TRUE(created.ok()) << created.status();
    cleanup_.push_back(absl::StrCat(kConfigMaps, "/", name));
    return created.ok() ? *created : nlohmann::json();
  }

  // A client for the same server and CA as the admin, with other credentials.
  std::unique_ptr<KubeClient> ClientWith(KubeConfig config) {
    absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(std::move(config));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  KubeConfig ServerOnly() const {
    KubeConfig config;
    config.server = config_.server;
    config.certificate_authority = config_.certificate_authority;
    config.source = "test credentials";
    return config;
  }

  // A self-signed certificate and key, in `dir_`/<name>.{crt,key}: valid TLS material the
  // cluster's CA never signed.
  void MakeSelfSigned(const std::string& name) {
    const std::string command =
        absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=", name,
                     " -keyout ", (dir_ / (name + ".key")).string(), " -out ",
                     (dir_ / (name + ".crt")).string(), " 2>/dev/null");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }

  KubeConfig config_;
  std::unique_ptr<KubeClient> client_;
  fs::path dir_;
  std::vector<std::string> cleanup_;
};

TEST_F(KubeClientClusterTest, ListsNamespaces) {
  const int64_t before = client_->requests();
  absl::StatusOr<nlohmann::json> list = client_->Get("/api/v1/namespaces");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(client_->requests(), before + 1);
  EXPECT_EQ((*list)["kind"], "NamespaceList");
  std::vector<std::string> names;
  for (const nlohmann::json& item : (*list)["items"]) names.push_back(item["metadata"]["name"]);
  EXPECT_THAT(names, testing::IsSupersetOf({"default", "kube-system"}));
  EXPECT_FALSE((*list)["metadata"]["resourceVersion"].get<std::string>().empty());
}

TEST_F(KubeClientClusterTest, AConfigMapIsCreatedReadPatchedAndDeleted) {
  const std::string name = UniqueName("shoal-cm");
  const std::string path = absl::StrCat(kConfigMaps, "/", name);
  const nlohmann::json created = CreateConfigMap(name);
  ASSERT_EQ(created["metadata"]["name"], name);

  absl::StatusOr<nlohmann::json> read = client_->Get(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)["data"]["step"], "1");

  absl::StatusOr<nlohmann::json> patched =
      client_->Patch(path, {{"data", {{"step", "2"}, {"extra", "x"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["data"]["step"], "2");
  read = client_->Get(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)["data"]["extra"], "x");

  absl::StatusOr<nlohmann::json> again = client_->Create(
      kConfigMaps, {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", name}}}});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(),
              AllOf(HasSubstr(absl::StrCat("POST ", kConfigMaps, ": HTTP 409: ")),
                    HasSubstr(absl::StrCat("configmaps \"", name, "\" already exists"))));

  // An update from a stale copy is a conflict, not "already exists".
  nlohmann::json stale = created;
  stale["data"]["step"] = "3";
  absl::StatusOr<nlohmann::json> replaced = client_->Replace(path, stale);
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(replaced.status().message(),
              AllOf(HasSubstr(absl::StrCat("PUT ", path, ": HTTP 409: ")),
                    HasSubstr("the object has been modified")));

  absl::StatusOr<nlohmann::json> deleted =
      client_->Delete(path, nlohmann::json{{"propagationPolicy", "Background"}});
  ASSERT_TRUE(deleted.ok()) << deleted.status();

  read = client_->Get(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(),
              AllOf(HasSubstr(absl::StrCat("GET ", path, ": HTTP 404: ")),
                    HasSubstr(absl::StrCat("configmaps \"", name, "\" not found"))));
  EXPECT_EQ(client_->Delete(path).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KubeClientClusterTest, AnInvalidObjectIsInvalidArgumentWithTheServersReason) {
  absl::StatusOr<nlohmann::json> created = client_->Create(
      kConfigMaps,
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "Not_A_Name"}}}});
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(created.status().message(),
              AllOf(HasSubstr("HTTP 422"), HasSubstr("\"Not_A_Name\" is invalid")));
}

// Events of one watch as the test sees them, while the watch runs.
struct SeenEvents {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::pair<std::string, std::string>> events;  // type, object name

  void Add(absl::string_view type, const nlohmann::json& object) {
    std::lock_guard<std::mutex> lock(mutex);
    events.emplace_back(std::string(type), object["metadata"]["name"].get<std::string>());
    changed.notify_all();
  }
  // Whether `count` events arrived before the deadline.
  bool WaitFor(size_t count) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, kPatience, [&] { return events.size() >= count; });
  }
};

TEST_F(KubeClientClusterTest, AWatchDeliversEachEventWhileTheStreamRuns) {
  const std::string selector_value = UniqueName("w");
  const std::string watched =
      absl::StrCat(kConfigMaps, "?labelSelector=shoal-test%3D", selector_value);
  absl::StatusOr<nlohmann::json> list = client_->Get(watched);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE((*list)["items"].empty());
  const std::string listed_version = (*list)["metadata"]["resourceVersion"];

  SeenEvents seen;
  std::atomic<bool> stop{false};
  std::atomic<bool> watch_returned{false};
  auto watch = std::async(std::launch::async, [&] {
    absl::StatusOr<std::string> version = client_->Watch(
        watched, listed_version,
        [&](absl::string_view type, const nlohmann::json& object) { seen.Add(type, object); },
        [&] { return stop.load(); });
    watch_returned = true;
    return version;
  });

  const std::string name = UniqueName("shoal-watched");
  const std::string path = absl::StrCat(kConfigMaps, "/", name);
  CreateConfigMap(name, {{"shoal-test", selector_value}});
  ASSERT_TRUE(seen.WaitFor(1)) << "no ADDED event";
  EXPECT_FALSE(watch_returned) << "the event must come while the watch runs, not after";

  ASSERT_TRUE(client_->Patch(path, {{"data", {{"step", "2"}}}}).ok());
  ASSERT_TRUE(seen.WaitFor(2)) << "no MODIFIED event";
  EXPECT_FALSE(watch_returned);

  absl::StatusOr<nlohmann::json> deleted = client_->Delete(path);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  ASSERT_TRUE(seen.WaitFor(3)) << "no DELETED event";
  EXPECT_FALSE(watch_returned);

  stop = true;
  ASSERT_EQ(watch.wait_for(kPatience), std::future_status::ready);
  absl::StatusOr<std::string> version = watch.get();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_THAT(seen.events,
              ElementsAre(Pair("ADDED", name), Pair("MODIFIED", name), Pair("DELETED", name)));
  // The version to resume from is the last event's, past the list's.
  EXPECT_NE(*version, listed_version);
  EXPECT_FALSE(version->empty());

  // Resuming from it sees nothing that was already seen.
  SeenEvents resumed;
  std::atomic<bool> resumed_stop{false};
  auto again = std::async(std::launch::async, [&] {
    return client_->Watch(
        watched, *version,
        [&](absl::string_view type, const nlohmann::json& object) { resumed.Add(type, object); },
        [&] { return resumed_stop.load(); });
  });
  const std::string later = UniqueName("shoal-watched");
  CreateConfigMap(later, {{"shoal-test", selector_value}});
  ASSERT_TRUE(resumed.WaitFor(1));
  resumed_stop = true;
  ASSERT_EQ(again.wait_for(kPatience), std::future_status::ready);
  EXPECT_TRUE(again.get().ok());
  EXPECT_THAT(resumed.events, ElementsAre(Pair("ADDED", later)));
}

TEST_F(KubeClientClusterTest, ShouldStopEndsAWatchLongBeforeTheServerWould) {
  KubeClientOptions options;
  options.watch_timeout = std::chrono::seconds(600);
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(config_, options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::atomic<bool> stop{false};
  std::atomic<int> asked{0};
  auto watch = std::async(std::launch::async, [&] {
    return (*client)->Watch(
        absl::StrCat(kConfigMaps, "?labelSelector=shoal-test%3D", UniqueName("nothing")), "",
        [](absl::string_view, const nlohmann::json&) {},
        [&] {
          ++asked;
          return stop.load();
        });
  });
  // Once should_stop has been asked a few times the stream is open and idle.
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (asked < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(asked, 3);
  ASSERT_EQ(watch.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  stop = true;
  // Far less than the 600 s the server would keep the stream open.
  ASSERT_EQ(watch.wait_for(kPatience), std::future_status::ready);
  EXPECT_TRUE(watch.get().ok());
}

// The watch cache answers old versions of most kinds from memory; Events have none, so their
// watch reads etcd, where a compaction (which the API server itself runs every 5 minutes) has
// dropped old revisions. The test compacts at once instead of waiting.
TEST_F(KubeClientClusterTest, AWatchFromAVersionTheServerNoLongerHasIsTooOld) {
  const std::string events = "/api/v1/namespaces/default/events";
  absl::StatusOr<nlohmann::json> list = client_->Get(events);
  ASSERT_TRUE(list.ok()) << list.status();
  const std::string revision = (*list)["metadata"]["resourceVersion"];
  const char* etcd = std::getenv("SHOAL_KUBERNETES_ETCD");
  common::HttpRequest compact;
  compact.method = "POST";
  compact.base = etcd != nullptr ? etcd : "http://127.0.0.1:2379";
  compact.target = "/v3/kv/compaction";
  compact.body = nlohmann::json{{"revision", revision}}.dump();
  absl::StatusOr<common::HttpReply> compacted = common::SendHttp(compact);
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  // Already compacted further is as good.
  ASSERT_TRUE(compacted->status == 200 || absl::StrContains(compacted->body, "compacted"))
      << compacted->status << " " << compacted->body;

  absl::StatusOr<std::string> version = client_->Watch(
      events, "1", [](absl::string_view, const nlohmann::json&) {}, [] { return false; });
  ASSERT_FALSE(version.ok());
  EXPECT_TRUE(IsResourceVersionTooOld(version.status())) << version.status();
  EXPECT_THAT(version.status().message(), AllOf(HasSubstr("code 410"), HasSubstr("too old")));
}

TEST_F(KubeClientClusterTest, CredentialsGivenAsBytesWork) {
  KubeConfig config = config_;
  auto in_memory = [](PemSource& source) {
    if (!source.file.empty()) source = PemSource{"", ReadText(source.file)};
  };
  in_memory(config.certificate_authority);
  in_memory(config.client_certificate);
  in_memory(config.client_key);
  ASSERT_FALSE(config.client_key.pem.empty()) << "the admin kubeconfig has no client key";
  std::unique_ptr<KubeClient> client = ClientWith(config);
  absl::StatusOr<nlohmann::json> list = client->Get("/api/v1/namespaces");
  EXPECT_TRUE(list.ok()) << list.status();
}

TEST_F(KubeClientClusterTest, ACertificateTheClusterNeverSignedIsUnauthenticated) {
  MakeSelfSigned("stranger");
  KubeConfig config = ServerOnly();
  config.client_certificate.file = (dir_ / "stranger.crt").string();
  config.client_key.file = (dir_ / "stranger.key").string();
  std::unique_ptr<KubeClient> client = ClientWith(config);
  absl::StatusOr<nlohmann::json> list = client->Get("/api/v1/namespaces");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnauthenticated) << list.status();
  EXPECT_THAT(list.status().message(),
              AllOf(HasSubstr("GET /api/v1/namespaces: HTTP 401: "),
                    HasSubstr("(credentials from test credentials)"), Not(HasSubstr("BEGIN"))));

  // The same bytes in memory.
  config.client_certificate = PemSource{"", ReadText((dir_ / "stranger.crt").string())};
  config.client_key = PemSource{"", ReadText((dir_ / "stranger.key").string())};
  list = ClientWith(config)->Get("/api/v1/namespaces");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnauthenticated) << list.status();
}

TEST_F(KubeClientClusterTest, AServerCertificateTheCaDidNotSignIsUnavailable) {
  MakeSelfSigned("other-ca");
  KubeConfig config = config_;
  config.certificate_authority = PemSource{(dir_ / "other-ca.crt").string(), ""};
  absl::StatusOr<nlohmann::json> list = ClientWith(config)->Get("/api/v1/namespaces");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnavailable) << list.status();
  EXPECT_THAT(list.status().message(), HasSubstr(config_.server));
}

TEST_F(KubeClientClusterTest, AnUnknownTokenIsUnauthenticatedAndNotShown) {
  KubeConfig config = ServerOnly();
  config.token = "not-a-real-token-4242";
  absl::StatusOr<nlohmann::json> list = ClientWith(config)->Get("/api/v1/namespaces");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnauthenticated) << list.status();
  EXPECT_THAT(list.status().message(), Not(HasSubstr("4242")));
}

TEST_F(KubeClientClusterTest, AServiceAccountWithoutRightsIsPermissionDeniedNamingTheResource) {
  const std::string account = UniqueName("shoal-nobody");
  const std::string accounts = "/api/v1/namespaces/default/serviceaccounts";
  absl::StatusOr<nlohmann::json> created = client_->Create(
      accounts,
      {{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", {{"name", account}}}});
  ASSERT_TRUE(created.ok()) << created.status();
  cleanup_.push_back(absl::StrCat(accounts, "/", account));
  absl::StatusOr<nlohmann::json> token_request = client_->Create(
      absl::StrCat(accounts, "/", account, "/token"), {{"apiVersion", "authentication.k8s.io/v1"},
                                                       {"kind", "TokenRequest"},
                                                       {"spec", {{"expirationSeconds", 600}}}});
  ASSERT_TRUE(token_request.ok()) << token_request.status();
  const std::string token = (*token_request)["status"]["token"];
  ASSERT_FALSE(token.empty());

  // From a token file, as in a pod.
  const std::string token_file = (dir_ / "token").string();
  std::ofstream(token_file) << token << "\n";
  KubeConfig config = ServerOnly();
  config.token_file = token_file;
  std::unique_ptr<KubeClient> nobody = ClientWith(config);
  absl::StatusOr<nlohmann::json> denied = nobody->Create(
      kConfigMaps,
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", UniqueName("no")}}}});
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(denied.status().message(),
              AllOf(HasSubstr(absl::StrCat("POST ", kConfigMaps, ": HTTP 403: ")),
                    HasSubstr(absl::StrCat("configmaps is forbidden: User "
                                           "\"system:serviceaccount:default:",
                                           account, "\" cannot create resource \"configmaps\"")),
                    Not(HasSubstr(token))));

  // The file is read on each request: a rotated (here: broken) token is seen at once.
  std::ofstream(token_file) << "rotated-garbage\n";
  EXPECT_EQ(nobody->Get(kConfigMaps).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(KubeClientClusterTest, ManyThreadsShareOneClient) {
  constexpr int kThreads = 8;
  constexpr int kCallsEach = 5;
  const int64_t before = client_->requests();
  std::vector<std::future<int>> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.push_back(std::async(std::launch::async, [&] {
      int ok = 0;
      for (int i = 0; i < kCallsEach; ++i) ok += client_->Get("/api/v1/namespaces/default").ok();
      return ok;
    }));
  }
  int ok = 0;
  for (auto& thread : threads) ok += thread.get();
  EXPECT_EQ(ok, kThreads * kCallsEach);
  EXPECT_EQ(client_->requests(), before + kThreads * kCallsEach);
}

}  // namespace
}  // namespace shoal::backends
