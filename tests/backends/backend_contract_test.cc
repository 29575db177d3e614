// One suite of behaviours every backend must have, run against each: the local backend on this
// machine, the Slurm backend on its test cluster (tests/slurm/cluster.sh) and the YARN backend
// on its mini-cluster (tests/yarn/cluster.sh); ctest brings each cluster up first. The agents dial a plain TCP listener standing in for nothing: these tests look at
// what the backend does with processes and the resource manager, not at the agents' protocol.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kube_config.h"
#include "backends/kubernetes/kubernetes_backend.h"
#include "backends/kubernetes/kubernetes_objects.h"
#include "backends/local/local_backend.h"
#include "backends/slurm/slurm_backend.h"
#include "backends/slurm/srun_command.h"
#include "backends/spark/spark_backend.h"
#include "backends/yarn/yarn_backend.h"
#include "common/local_address.h"
#include "machine/inventory.h"

namespace shoal::backends {
namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Run(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// A listening socket agents can dial; it never answers, which keeps them retrying.
class Listener {
 public:
  explicit Listener(const std::string& host) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 64);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = absl::StrCat(host, ":", ntohs(a.sin_port));
  }
  ~Listener() { ::close(fd_); }
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

struct AgentProcess {
  pid_t pid;
  std::string place;  // the place it serves, from its own flags and environment
};

// Every live `shoal agent` process dialling `master`, wherever the backend started it (the test
// cluster's nodes are namespaces of this machine, so their processes are visible here).
std::vector<AgentProcess> AgentsOf(const std::string& master) {
  std::vector<AgentProcess> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::string cmdline = Slurp(entry.path() / "cmdline");
    std::vector<std::string> argv = absl::StrSplit(cmdline, '\0');
    bool agent = false, ours = false;
    std::string node, slurm_place;
    for (size_t i = 0; i < argv.size(); ++i) {
      if (argv[i] == "agent") agent = true;
      if (argv[i] == master) ours = true;
      if (argv[i] == "--node" && i + 1 < argv.size()) node = argv[i + 1];
      if (absl::StartsWith(argv[i], "--slurm-place=")) slurm_place = argv[i].substr(14);
    }
    std::string stat = Slurp(entry.path() / "stat");
    bool zombie = stat.find(") Z") != std::string::npos;
    if (!agent || !ours || zombie || argv[0].find("srun") != std::string::npos) continue;
    if (!slurm_place.empty()) {
      uint32_t rank = 0;
      std::string environ = Slurp(entry.path() / "environ");
      for (absl::string_view var : absl::StrSplit(environ, '\0')) {
        if (absl::StartsWith(var, "SLURM_PROCID=")) (void)absl::SimpleAtoi(var.substr(13), &rank);
      }
      node = SlurmPlaceOf(slurm_place, rank).value_or("?");
    }
    found.push_back({pid, node.empty() ? "local" : node});
  }
  return found;
}

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

struct Flavour {
  std::string name;
  std::function<std::unique_ptr<Backend>(const std::string& dir, const std::string& job_id)> make;
  std::string listen_host;  // where agents can reach a master on this machine
  // Whether the resource manager still holds anything for the job.
  std::function<bool(const std::string& job_id)> holds;
  // How long the agents may take to start: a Spark application starts its driver's JVM, then
  // its executors' JVMs, before the barrier stage runs.
  std::chrono::seconds start_limit = 30s;
};

void PrintTo(const Flavour& flavour, std::ostream* os) { *os << flavour.name; }

Flavour LocalFlavour() {
  return {"Local",
          [](const std::string& dir, const std::string& job_id) -> std::unique_ptr<Backend> {
            LocalBackendOptions o;
            o.machine = machine::DetectLocalInventory({});
            o.ledger_dir = dir + "/ledger";
            o.agent_work_dir = dir + "/agent";
            return std::make_unique<LocalBackend>(o);
          },
          "127.0.0.1",
          [](const std::string& job_id) { return false; }};
}

Flavour SlurmFlavour() {
  return {"Slurm",
          [](const std::string& dir, const std::string& job_id) -> std::unique_ptr<Backend> {
            SlurmBackendOptions o;
            o.state_dir = dir + "/slurm";
            o.agent_work_dir = dir + "/agents";
            return std::make_unique<SlurmBackend>(o);
          },
          "",
          [](const std::string& job_id) {
            return !Run("squeue -h --name=shoal-" + job_id + " -o %i").empty();
          }};
}

// KEY=value of the YARN test cluster's env file ($SHOAL_YARN_DIR/env), "" when absent.
std::string YarnEnv(const std::string& key) {
  const char* dir = std::getenv("SHOAL_YARN_DIR");
  std::istringstream lines(Slurp(std::string(dir ? dir : "/tmp/shoal-yarn") + "/env"));
  std::string line;
  while (std::getline(lines, line)) {
    if (absl::StartsWith(line, key + "=")) return line.substr(key.size() + 1);
  }
  return "";
}

Flavour YarnFlavour() {
  return {"Yarn",
          [](const std::string& dir, const std::string& job_id) -> std::unique_ptr<Backend> {
            YarnBackendOptions o;
            o.rm_web = YarnEnv("SHOAL_YARN_RM_WEB");
            o.am_jar = SHOAL_DEFAULT_YARN_AM_JAR;
            // The mini-cluster's Hadoop is its jar's lib/, not an installation.
            o.am_classpath = YarnEnv("HADOOP_CONF_DIR") + ":" + SHOAL_SOURCE_DIR +
                             "/tests/yarn/minicluster/target/lib/*";
            // The AM jar and the agent binary reach the containers through the cluster's HDFS.
            o.hdfs = YarnEnv("SHOAL_HDFS");
            o.webhdfs = YarnEnv("SHOAL_WEBHDFS");
            o.hdfs_user = "shoal";
            o.state_dir = dir + "/yarn";
            return std::make_unique<YarnBackend>(o);
          },
          "127.0.0.1",
          [](const std::string& job_id) {
            auto ids = YarnBackend::UnfinishedApplications(YarnEnv("SHOAL_YARN_RM_WEB"),
                                                           "shoal-" + job_id);
            return !ids.ok() || !ids->empty();
          }};
}

// The project's Kubernetes test cluster (tests/kubernetes/cluster.sh), through $KUBECONFIG.
// Its pods' processes are processes of this machine, so AgentsOf finds their agents too.
Flavour KubernetesFlavour() {
  return {"Kubernetes",
          [](const std::string& dir, const std::string& job_id) -> std::unique_ptr<Backend> {
            KubernetesBackendOptions o;
            auto kube = LoadKubeConfig(std::nullopt);
            EXPECT_TRUE(kube.ok()) << kube.status();
            if (kube.ok()) o.kube = *kube;
            o.ns = "default";
            o.task_image = "localhost/shoal-python:test";
            o.image_pull_policy = "Never";
            o.state_dir = dir + "/kubernetes";
            return std::make_unique<KubernetesBackend>(o);
          },
          "",
          [](const std::string& job_id) {
            auto kube = LoadKubeConfig(std::nullopt);
            if (!kube.ok()) return true;
            auto client = KubeClient::Create(*kube);
            if (!client.ok()) return true;
            std::string selector = absl::StrCat("shoal.io%2Fjob%3D", JobObjectName(job_id));
            for (const char* kind : {"pods", "secrets", "configmaps"}) {
              auto list = (*client)->Get(
                  absl::StrCat("/api/v1/namespaces/default/", kind, "?labelSelector=", selector));
              if (!list.ok() || !(*list)["items"].empty()) return true;
            }
            return false;
          }};
}

// KEY=value of the Spark test cluster's env file ($SHOAL_SPARK_DIR/env), "" when absent.
std::string SparkEnv(const std::string& key) {
  const char* dir = std::getenv("SHOAL_SPARK_DIR");
  std::istringstream lines(Slurp(std::string(dir ? dir : "/tmp/shoal-spark") + "/env"));
  std::string line;
  while (std::getline(lines, line)) {
    if (absl::StartsWith(line, key + "=")) return line.substr(key.size() + 1);
  }
  return "";
}

// The project's Spark standalone test cluster (tests/spark/cluster.sh) on this machine's
// loopback: the executors' processes, and the agents their barrier tasks start, are visible here.
Flavour SparkFlavour() {
  return {"Spark",
          [](const std::string& dir, const std::string& job_id) -> std::unique_ptr<Backend> {
            SparkBackendOptions o;
            o.master = SparkEnv("SHOAL_SPARK_MASTER");
            o.python = SparkEnv("SHOAL_SPARK_PYTHON");
            o.executor_memory = "512m";
            o.state_dir = dir + "/spark";
            return std::make_unique<SparkBackend>(o);
          },
          "127.0.0.1",
          [](const std::string& job_id) {
            // The master's JSON page lists the applications it runs under "activeapps".
            std::string page = Run("curl -sf --max-time 10 " +
                                   SparkEnv("SHOAL_SPARK_MASTER_WEB") + "/json/");
            if (page.empty()) return true;
            size_t active = page.find("\"activeapps\"");
            size_t completed = page.find("\"completedapps\"");
            if (active == std::string::npos) return true;
            std::string name = "\"shoal-" + job_id + "\"";
            size_t at = page.find(name, active);
            return at != std::string::npos &&
                   (completed == std::string::npos || completed < active || at < completed);
          },
          120s};
}

class BackendContractTest : public ::testing::TestWithParam<Flavour> {
 protected:
  void SetUp() override {
    if (GetParam().name == "Slurm") {
      // The test cluster is brought up by ctest's fixture; without it this must fail, loudly.
      ASSERT_NE(std::getenv("SLURM_CONF"), nullptr)
          << "SLURM_CONF is not set: start the test cluster (tests/slurm/cluster.sh up) and "
             "eval \"$(tests/slurm/cluster.sh env)\"";
      auto address = SlurmBackend::AddressTowardsController();
      ASSERT_TRUE(address.ok()) << address.status();
      listen_host_ = *address;
    } else if (GetParam().name == "Yarn") {
      // Brought up by ctest's yarn_cluster fixture; without it this must fail, loudly.
      std::string rm = YarnEnv("SHOAL_YARN_RM_WEB");
      ASSERT_FALSE(rm.empty())
          << "no YARN test cluster ($SHOAL_YARN_DIR/env): start it (tests/yarn/cluster.sh up)";
      ASSERT_TRUE(std::filesystem::is_regular_file(SHOAL_DEFAULT_YARN_AM_JAR))
          << "no application master jar: src/backends/yarn/am/build.sh";
      auto address = YarnBackend::AddressTowardsResourceManager(rm);
      ASSERT_TRUE(address.ok()) << address.status();
      listen_host_ = *address;
    } else if (GetParam().name == "Spark") {
      // Brought up by ctest's spark_cluster fixture; without it this must fail, loudly.
      ASSERT_FALSE(SparkEnv("SHOAL_SPARK_MASTER").empty())
          << "no Spark test cluster ($SHOAL_SPARK_DIR/env): start it (tests/spark/cluster.sh up)";
      listen_host_ = GetParam().listen_host;
    } else if (GetParam().name == "Kubernetes") {
      // Brought up by ctest's kubernetes_cluster fixture; without it this must fail, loudly.
      ASSERT_NE(std::getenv("KUBECONFIG"), nullptr)
          << "KUBECONFIG is not set: start the test cluster (tests/kubernetes/cluster.sh up) "
             "and export the KUBECONFIG=... line it prints";
      // Pods reach this machine at its default route's address (the cluster is on it).
      auto address = common::LocalAddressTowards("203.0.113.1", "9", "the default route");
      ASSERT_TRUE(address.ok()) << address.status();
      listen_host_ = *address;
    } else {
      listen_host_ = GetParam().listen_host;
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    job_id_ = absl::StrCat("contract-", ::getpid(), "-", info->name());
    for (char& c : job_id_) {
      if (c == '/') c = '-';
    }
    dir_ = (std::filesystem::temp_directory_path() / ("shoal-" + job_id_)).string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    listener_ = std::make_unique<Listener>(listen_host_);
    backend_ = GetParam().make(dir_, job_id_);
    backend_->SetPlaceLostCallback([this](const std::string& node, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu_);
      lost_[node] = why;
      cv_.notify_all();
    });
  }
  void TearDown() override {
    if (backend_) backend_->Release();
    std::filesystem::remove_all(dir_);
  }

  static spec::JobSpec Job(uint32_t workers) {
    spec::JobSpec job;
    job.name = "contract";
    spec::Role r;
    r.name = "worker";
    r.instances = workers;
    r.argv = {"true"};
    r.resources.cpus = 1;
    r.resources.memory_bytes = 64ull << 20;
    job.roles.push_back(r);
    return job;
  }

  AgentStartOptions StartOptions() const {
    AgentStartOptions o;
    o.master_address = listener_->address();
    o.token = "contract-token";
    o.job_id = job_id_;
    o.job_dir = dir_;
    o.shoal_binary = SHOAL_BINARY;
    o.master_grace_ms = 60000;  // the listener never answers; the agents must not give up
    return o;
  }

  std::string listen_host_, job_id_, dir_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Backend> backend_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> lost_;
};

TEST_P(BackendContractTest, GrantsPlacesForTheWholeGang) {
  auto grants = backend_->Acquire(Job(2), job_id_);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_FALSE(grants->empty());
  double cpus = 0;
  for (const auto& g : *grants) {
    EXPECT_FALSE(g.name.empty());
    cpus += g.cpus;
  }
  EXPECT_GE(cpus, 2.0);
}

TEST_P(BackendContractTest, StartsOneAgentPerPlaceDiallingTheMaster) {
  auto grants = backend_->Acquire(Job(2), job_id_);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_TRUE(backend_->StartAgents(StartOptions()).ok());
  std::string master = listener_->address();
  ASSERT_TRUE(WaitFor([&] { return AgentsOf(master).size() == grants->size(); },
                      GetParam().start_limit))
      << "agents running: " << AgentsOf(master).size() << ", places: " << grants->size();
  std::set<std::string> places, served;
  for (const auto& g : *grants) places.insert(g.name);
  for (const auto& a : AgentsOf(master)) served.insert(a.place);
  EXPECT_EQ(served, places);
}

TEST_P(BackendContractTest, ReportsALostPlaceByName) {
  auto grants = backend_->Acquire(Job(2), job_id_);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_TRUE(backend_->StartAgents(StartOptions()).ok());
  std::string master = listener_->address();
  ASSERT_TRUE(WaitFor([&] { return AgentsOf(master).size() == grants->size(); },
                      GetParam().start_limit));
  AgentProcess victim = AgentsOf(master).back();
  ASSERT_EQ(::kill(victim.pid, SIGKILL), 0);
  std::unique_lock<std::mutex> lock(mu_);
  ASSERT_TRUE(cv_.wait_for(lock, 20s, [&] { return lost_.count(victim.place) > 0; }))
      << "no loss reported for " << victim.place;
  EXPECT_FALSE(lost_[victim.place].empty());
  // Only the place that was lost.
  EXPECT_EQ(lost_.size(), 1u);
}

TEST_P(BackendContractTest, ReleaseLeavesNothingRunningOrHeld) {
  auto grants = backend_->Acquire(Job(2), job_id_);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_TRUE(backend_->StartAgents(StartOptions()).ok());
  std::string master = listener_->address();
  ASSERT_TRUE(WaitFor([&] { return AgentsOf(master).size() == grants->size(); },
                      GetParam().start_limit));
  backend_->Release();
  EXPECT_TRUE(WaitFor([&] { return AgentsOf(master).empty(); }, 10s))
      << AgentsOf(master).size() << " agents still running";
  EXPECT_TRUE(WaitFor([&] { return !GetParam().holds(job_id_); }, 10s))
      << "the resource manager still holds the job";
  // Twice is harmless.
  backend_->Release();
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendContractTest,
                         ::testing::Values(LocalFlavour(), SlurmFlavour(), YarnFlavour(),
                                           KubernetesFlavour(), SparkFlavour()),
                         [](const ::testing::TestParamInfo<Flavour>& p) { return p.param.name; });

}  // namespace
}  // namespace shoal::backends
