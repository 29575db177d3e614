#include "backends/spark/spark_provider.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "backends/spark/spark_backend.h"
#include "backends/spark/spark_on_yarn.h"
#include "backends/spark/spark_section.h"
#include "common/local_address.h"
#include "process/exec_plan.h"
#include "process/process.h"
#include "process/process_launcher.h"

namespace shoal::backends {
namespace {

// Whether something accepts TCP connections at host:port within `timeout_ms`.
absl::Status Connects(const std::string& host, const std::string& port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, timeout_ms) == 1 ? 0 : -1;
      int error = 0;
      socklen_t len = sizeof error;
      if (rc == 0 && (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0)) {
        errno = error;
        rc = -1;
      } else if (rc != 0) {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      ::close(fd);
      ::freeaddrinfo(found);
      return absl::OkStatus();
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot connect to ", host, ":", port, ": ", last));
}

// Runs `python` to import pyspark: PySpark's directory (where its jars are), or what the Python
// printed when it fails.
absl::StatusOr<std::string> PysparkHome(const std::string& python) {
  if (::access(python.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no Python at ", python, ": ", std::strerror(errno)));
  }
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  process::ProcessSpec spec;
  spec.key = "pyspark-check";
  spec.argv = {python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"};
  spec.env = InheritedEnvironment({"SHOAL_AGENT_TOKEN"});
  process::ChildSetup setup;
  setup.stdout_fd = setup.stderr_fd = out[1];
  setup.grouping = process::Grouping::kCallersGroup;
  auto child = process::SystemLauncher().Start(spec, setup);
  ::close(out[1]);
  if (!child.ok()) {
    ::close(out[0]);
    return child.status();
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string said(absl::StripAsciiWhitespace(text));
  size_t last_line = said.rfind('\n');
  if (last_line != std::string::npos) said = said.substr(last_line + 1);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return said;
  return absl::FailedPreconditionError(said.empty() ? "it failed" : said);
}

// Whether executors started by `master` see this machine's filesystem: a standalone master on
// this machine's loopback, local-cluster (its workers are processes of this machine), or YARN
// whose ResourceManager is on this machine's loopback (`yarn_rm_host`: its host, for yarn; a
// cluster whose NodeManagers reach the ResourceManager on loopback is this machine).
bool SharesThisFilesystem(const std::string& master, const std::string& yarn_rm_host) {
  if (absl::StartsWith(master, "local-cluster[")) return true;
  if (master == "yarn") return common::IsLoopbackHost(yarn_rm_host);
  auto addresses = SparkStandaloneAddresses(master);
  if (addresses.empty()) return false;
  for (const auto& [host, port] : addresses) {
    if (!common::IsLoopbackHost(host)) return false;
  }
  return true;
}

// Whether the agents' binary travels with the application: where the executors cannot see
// this machine's files, or when SHOAL_SPARK_SHIP_BINARY=1 says so (0: never).
bool ShipBinary(const std::string& master, const std::string& yarn_rm_host) {
  const char* env = std::getenv("SHOAL_SPARK_SHIP_BINARY");
  if (env != nullptr && std::string_view(env) == "1") return true;
  if (env != nullptr && std::string_view(env) == "0") return false;
  return !SharesThisFilesystem(master, yarn_rm_host);
}

bool IsKubernetesMaster(const std::string& master) { return absl::StartsWith(master, "k8s://"); }

// The host and port of a k8s://[https://|http://]HOST[:PORT][/PATH] master's API server (Spark
// reads k8s://HOST:PORT as https).
std::pair<std::string, std::string> KubernetesApiAddress(absl::string_view master) {
  absl::ConsumePrefix(&master, "k8s://");
  std::string port = "443";
  if (absl::ConsumePrefix(&master, "http://")) {
    port = "80";
  } else {
    absl::ConsumePrefix(&master, "https://");
  }
  master = master.substr(0, master.find('/'));
  std::string host(master);
  size_t colon = master.rfind(':');
  if (colon != absl::string_view::npos && master.find(']', colon) == absl::string_view::npos) {
    host = std::string(master.substr(0, colon));
    port = std::string(master.substr(colon + 1));
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return {host, port};
}

bool IsFile(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

// What the driver lacks to reach a k8s:// master, empty when nothing: the executors' image
// (Spark refuses to start without one), credentials for the API server (in client mode the
// driver's Kubernetes client reads $KUBECONFIG or ~/.kube/config, a service account's token
// inside a pod, or spark.kubernetes.authenticate.* properties), and the server itself.
std::string KubernetesProblem(const std::string& master, const SparkConfig& section) {
  const auto& conf = section.conf;
  if (!conf.contains("spark.kubernetes.container.image") &&
      !conf.contains("spark.kubernetes.executor.container.image")) {
    return absl::StrCat(
        "--backend spark with master ", master,
        " needs the executors' image: set `spark: {conf: {spark.kubernetes.container.image: "
        "IMAGE}}` in the job file (an image with Java 17, PySpark's jars and the Python of "
        "SHOAL_SPARK_PYTHON at the same path; docs/backends/spark.md)");
  }
  bool credentials = false;
  for (const auto& [key, value] : conf) {
    if (absl::StartsWith(key, "spark.kubernetes.authenticate.")) credentials = true;
  }
  const char* kubeconfig = std::getenv("KUBECONFIG");
  if (!credentials && kubeconfig != nullptr && *kubeconfig != '\0') {
    for (absl::string_view path : absl::StrSplit(kubeconfig, ':', absl::SkipEmpty())) {
      if (IsFile(std::string(path))) credentials = true;
    }
    if (!credentials) {
      return absl::StrCat("--backend spark with master ", master, ": KUBECONFIG=", kubeconfig,
                          " names no readable file");
    }
  }
  if (!credentials) {
    const char* home = std::getenv("HOME");
    credentials = (home != nullptr && IsFile(absl::StrCat(home, "/.kube/config"))) ||
                  IsFile("/var/run/secrets/kubernetes.io/serviceaccount/token");
  }
  if (!credentials) {
    return absl::StrCat("--backend spark with master ", master,
                        ": no credentials for the Kubernetes API server: set KUBECONFIG (or "
                        "write ~/.kube/config), or give spark.kubernetes.authenticate.* "
                        "properties in the job file's spark.conf");
  }
  auto [host, port] = KubernetesApiAddress(master);
  if (absl::Status st = Connects(host, port, 3000); !st.ok()) {
    return absl::StrCat("--backend spark: the Kubernetes API server of ", master,
                        " does not answer: ", st.message());
  }
  return "";
}

}  // namespace

std::string SparkPython() {
  const char* env = std::getenv("SHOAL_SPARK_PYTHON");
  if (env != nullptr && *env != '\0') return env;
  return SHOAL_DEFAULT_SPARK_PYTHON;
}

std::vector<RunFlag> SparkProvider::Flags() const {
  return {{"--spark-master",
           "Spark master URL: spark://HOST:PORT, yarn, local-cluster[N,C,M] or k8s://... "
           "(spark.master; default $SHOAL_SPARK_MASTER)"}};
}

std::optional<spec::JobSection> SparkProvider::JobSection() const { return SparkJobSection(); }

absl::StatusOr<std::string> SparkMasterFor(const spec::JobSpec& job,
                                           const std::map<std::string, std::string>& flags) {
  if (auto it = flags.find("--spark-master"); it != flags.end()) {
    if (!IsSparkMaster(it->second)) {
      return absl::InvalidArgumentError(absl::StrCat("invalid flag: --spark-master: must be ",
                                                     kSparkMasterForm, ", got ",
                                                     spec::DescribeText(it->second)));
    }
    return it->second;
  }
  const SparkConfig& section = SparkConfigOf(job);
  if (!section.master.empty()) return section.master;
  const char* env = std::getenv("SHOAL_SPARK_MASTER");
  if (env != nullptr && *env != '\0') {
    if (!IsSparkMaster(env)) {
      return absl::InvalidArgumentError(absl::StrCat("SHOAL_SPARK_MASTER: must be ",
                                                     kSparkMasterForm, ", got ",
                                                     spec::DescribeText(env)));
    }
    return std::string(env);
  }
  return absl::InvalidArgumentError(
      "--backend spark needs the Spark master: --spark-master URL, `spark: {master: URL}` in "
      "the job file, or SHOAL_SPARK_MASTER");
}

absl::StatusOr<Preflight> SparkProvider::Check(const PreflightRequest& request) const {
  // Everything the master needs is resolved here, before anything exists, and recorded in
  // submit.json: a wrong master, Python or address changes nothing.
  absl::StatusOr<std::string> master = SparkMasterFor(*request.job, request.flags);
  if (!master.ok()) return master.status();
  std::string python = SparkPython();
  absl::StatusOr<std::string> spark_home = PysparkHome(python);
  if (!spark_home.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend spark: cannot import pyspark with ", python,
        " (SHOAL_SPARK_PYTHON names a Python with PySpark): ", spark_home.status().message()));
  }
  // yarn: the cluster's configuration (Spark's YARN client reads it) and a ResourceManager that
  // answers, whose route gives the master's address.
  std::string hadoop_conf_dir;
  std::optional<std::pair<std::string, std::string>> resource_manager;
  if (*master == "yarn") {
    absl::StatusOr<std::string> dir = YarnConfDir();
    if (!dir.ok()) return dir.status();
    hadoop_conf_dir = *dir;
    auto rm = YarnResourceManagerAddress(hadoop_conf_dir);
    if (!rm.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend spark with master yarn: ", rm.status().message()));
    }
    if (absl::Status st = Connects(rm->first, rm->second, 3000); !st.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--backend spark: the YARN ResourceManager at ", rm->first, ":", rm->second,
          " (yarn.resourcemanager.address in ", hadoop_conf_dir, "/yarn-site.xml) does not "
          "answer: ", st.message()));
    }
    resource_manager = *rm;
  }
  auto standalone = SparkStandaloneAddresses(*master);
  if (!standalone.empty()) {
    std::vector<std::string> problems;
    bool any = false;
    for (const auto& [host, port] : standalone) {
      absl::Status st = Connects(host, port, 3000);
      if (st.ok()) {
        any = true;
        break;
      }
      problems.emplace_back(st.message());
    }
    if (!any) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend spark: the Spark master at ", *master,
                       " does not answer: ", absl::StrJoin(problems, "; ")));
    }
  }
  const SparkConfig& section = SparkConfigOf(*request.job);
  if (IsKubernetesMaster(*master)) {
    if (std::string problem = KubernetesProblem(*master, section); !problem.empty()) {
      return absl::FailedPreconditionError(problem);
    }
  }
  Preflight out;
  out.listen_host = request.listen_host;
  if (out.listen_host.empty()) {
    if (!standalone.empty()) {
      auto address = common::LocalAddressTowards(standalone.front().first,
                                                 standalone.front().second, "the Spark master");
      if (!address.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("--backend spark: ", address.status().message(),
                         "; give the address executors reach this machine at with --listen"));
      }
      out.listen_host = *address;
    } else if (absl::StartsWith(*master, "local-cluster[")) {
      out.listen_host = "127.0.0.1";
    } else if (resource_manager) {
      auto address = common::LocalAddressTowards(resource_manager->first,
                                                 resource_manager->second,
                                                 "the YARN ResourceManager");
      if (!address.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("--backend spark: ", address.status().message(),
                         "; give the address executors reach this machine at with --listen"));
      }
      out.listen_host = *address;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend spark with master ", *master,
          ": give the address the cluster's executors reach this machine at with --listen "
          "(the Shoal master and the Spark driver listen there)"));
    }
  }
  nlohmann::json conf = nlohmann::json::object();
  for (const auto& [k, v] : section.conf) conf[k] = v;
  out.settings = {{"master", *master},
                  {"python", python},
                  {"executor_memory", section.executor_memory},
                  {"executor_cores", section.executor_cores},
                  {"conf", conf},
                  {"ship_binary",
                   ShipBinary(*master, resource_manager ? resource_manager->first : "")}};
  if (IsKubernetesMaster(*master)) {
    // Executor pods get the agent bundle from an image, never the binary from this machine.
    out.settings["ship_binary"] = false;
    out.settings["agent_image"] =
        section.agent_image.empty() ? kDefaultSparkAgentImage : section.agent_image;
  }
  if (!hadoop_conf_dir.empty()) {
    out.settings["hadoop_conf_dir"] = hadoop_conf_dir;
    out.settings["spark_home"] = *spark_home;
  }
  return out;
}

absl::StatusOr<CreatedBackend> SparkProvider::Create(const BackendContext& context) const {
  // `shoal run` resolved and checked these (the flag over the job file's `spark:` section).
  const nlohmann::json& settings = *context.settings;
  const SparkConfig& section = SparkConfigOf(*context.job);
  SparkBackendOptions spark;
  spark.master = settings.value("master", section.master);
  spark.python = settings.value("python", SparkPython());
  spark.executor_memory = settings.value("executor_memory", section.executor_memory);
  spark.executor_cores = settings.value("executor_cores", section.executor_cores);
  spark.conf = section.conf;
  if (settings.contains("conf") && settings["conf"].is_object()) {
    for (const auto& [k, v] : settings["conf"].items()) {
      if (v.is_string()) spark.conf[k] = v.get<std::string>();
    }
  }
  spark.ship_binary = settings.value("ship_binary", false);
  spark.agent_image = settings.value("agent_image", std::string());
  spark.hadoop_conf_dir = settings.value("hadoop_conf_dir", "");
  spark.spark_home = settings.value("spark_home", "");
  spark.state_dir = context.job_dir + "/agents/spark";
  if (spark.master.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context.job_dir, "/submit.json lacks spark.master"));
  }
  CreatedBackend out;
  out.listen_host = context.listen_host;
  out.backend = std::make_unique<SparkBackend>(std::move(spark));
  return out;
}

}  // namespace shoal::backends
