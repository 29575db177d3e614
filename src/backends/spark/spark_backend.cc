#include "backends/spark/spark_backend.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "backends/spark/spark_on_yarn.h"
#include "common/files.h"
#include "process/exec_plan.h"
#include "process/process.h"
#include "process/process_launcher.h"
#include "spdlog/spdlog.h"

namespace shoal::backends {
namespace {

constexpr char kEventPrefix[] = "SHOAL-SPARK ";
constexpr char kDriverFile[] = "shoal_spark_driver.py";
// Spark checks that a barrier stage fits the application's free task slots before it starts
// it, and gives up after maxFailures checks (default 40, 15 s apart): the job would fail when
// the cluster is busy. Shoal queues instead, checking every second, as long as it takes.
constexpr char kBarrierCheckInterval[] = "1s";
constexpr char kBarrierCheckMaxFailures[] = "2147483647";
// k8s:// masters: where the executor pods hold the agent bundle (the Kubernetes backend's
// layout: its binary runs with its own C library and loader in any image), the pod template's
// executor container, and the file the template is written to in the state directory.
constexpr char kAgentBundleDir[] = "/opt/shoal";
constexpr char kExecutorContainer[] = "spark-kubernetes-executor";
constexpr char kPodTemplateFile[] = "executor-pod-template.json";

bool IsKubernetesMaster(const std::string& master) { return absl::StartsWith(master, "k8s://"); }

uint32_t TaskCpus(const spec::JobSpec& job) {
  double cpus = 1;
  for (const auto& role : job.roles) cpus = std::max(cpus, role.resources.cpus);
  return static_cast<uint32_t>(std::ceil(cpus));
}

uint32_t TaskGpus(const spec::JobSpec& job) {
  uint32_t gpus = 0;
  for (const auto& role : job.roles) gpus = std::max(gpus, role.resources.gpus);
  return gpus;
}

std::string HostOf(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

SparkBackend::SparkBackend(SparkBackendOptions options) : options_(std::move(options)) {}

SparkBackend::~SparkBackend() { Release(); }

std::map<std::string, std::string> SparkBackend::SparkProperties(
    const spec::JobSpec& job, const SparkBackendOptions& options, const std::string& driver_host) {
  std::map<std::string, std::string> conf;
  conf["spark.submit.deployMode"] = "client";
  conf["spark.ui.showConsoleProgress"] = "false";
  // The driver runs one small stage and shuttles a few messages: Spark's default 1g is waste.
  conf["spark.driver.memory"] = "512m";
  // Every barrier task is one place: as big as the biggest task of the job (Spark gives all
  // tasks of a stage the same size).
  uint32_t task_cpus = TaskCpus(job);
  conf["spark.task.cpus"] = std::to_string(task_cpus);
  if (uint32_t gpus = TaskGpus(job); gpus > 0) {
    conf["spark.task.resource.gpu.amount"] = std::to_string(gpus);
    uint32_t tasks_per_executor =
        options.executor_cores > 0 ? std::max(1u, options.executor_cores / task_cpus) : 1;
    conf["spark.executor.resource.gpu.amount"] = std::to_string(gpus * tasks_per_executor);
  }
  if (!options.executor_memory.empty()) conf["spark.executor.memory"] = options.executor_memory;
  if (options.executor_cores > 0) {
    conf["spark.executor.cores"] = std::to_string(options.executor_cores);
  }
  if (IsKubernetesMaster(options.master)) {
    // Executor pods, like YARN's containers: exactly as many as asked, memory enforced.
    for (auto& [key, value] :
         ContainerExecutorProperties(job, options.executor_cores, options.executor_memory)) {
      conf[key] = value;
    }
  }
  conf["spark.scheduler.barrier.maxConcurrentTasksCheck.interval"] = kBarrierCheckInterval;
  conf["spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"] = kBarrierCheckMaxFailures;
  // Executors reach the driver where the agents reach the master: the same machine.
  if (!driver_host.empty()) conf["spark.driver.host"] = driver_host;
  if (options.master == "yarn") {
    for (auto& [key, value] : SparkOnYarnProperties(job, options.executor_cores,
                                                    options.executor_memory, options.spark_home)) {
      conf[key] = value;
    }
  }
  for (const auto& [key, value] : options.conf) conf[key] = value;
  return conf;
}

nlohmann::json SparkBackend::ExecutorPodTemplate(const std::string& agent_image,
                                                 const std::string& pull_policy) {
  // The agent image's default command copies its /opt/shoal into /mnt/shoal; the executor
  // container sees that copy at /opt/shoal. Spark adds its own settings (image, env, ports,
  // resources, local dirs) to this container and keeps the rest of the pod.
  nlohmann::json volume_mount = {{"name", "shoal-agent"}, {"mountPath", "/mnt/shoal"}};
  nlohmann::json init = {{"name", "shoal-agent"},
                         {"image", agent_image},
                         {"volumeMounts", nlohmann::json::array({volume_mount})}};
  if (!pull_policy.empty()) init["imagePullPolicy"] = pull_policy;
  nlohmann::json executor = {
      {"name", kExecutorContainer},
      {"volumeMounts", nlohmann::json::array(
                           {{{"name", "shoal-agent"}, {"mountPath", kAgentBundleDir}}})}};
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"spec",
           {{"initContainers", nlohmann::json::array({init})},
            {"containers", nlohmann::json::array({executor})},
            {"volumes", nlohmann::json::array(
                            {{{"name", "shoal-agent"}, {"emptyDir", nlohmann::json::object()}}})}}}};
}

absl::StatusOr<std::vector<NodeGrant>> SparkBackend::Acquire(const spec::JobSpec& job,
                                                             const std::string& job_id) {
  job_ = job;
  job_id_ = job_id;
  // Spark's scheduler picks the GPUs when the barrier task starts; the task hands them to the
  // agent as CUDA_VISIBLE_DEVICES and the agent reports them.
  places_ = OnePlacePerTask(job);
  // Whether Spark can run the gang is Spark's to say once the barrier stage is submitted
  // (StartAgents): a wait for task slots arrives as an allocation event.
  return places_;
}

absl::Status SparkBackend::StartAgents(const AgentStartOptions& options) {
  {
    absl::MutexLock lock(&mu_);
    if (driver_pid_ > 0 || driver_exited_) {
      return absl::FailedPreconditionError("the Spark application is started");
    }
  }
  uint32_t ports = 0;
  for (const auto& [node, n] : options.ports_per_node) ports = std::max(ports, n);
  std::vector<std::string> agent_args = {
      "--master", options.master_address,
      "--ports", std::to_string(ports),
      "--master-grace-ms", std::to_string(options.master_grace_ms),
      "--heartbeat-interval-ms", std::to_string(options.heartbeat_interval_ms),
      "--watchdog-ms", std::to_string(WatchdogMs(options))};
  // Executors give their Python workers none of this environment: the range goes as a flag.
  if (const char* range = std::getenv("SHOAL_TASK_PORTS"); range != nullptr && *range != '\0') {
    agent_args.insert(agent_args.end(), {"--task-ports", range});
  }
  nlohmann::json places = nlohmann::json::array();
  for (const auto& p : places_) places.push_back({{"name", p.name}, {"gpus", p.gpu_count}});
  uint32_t task_gpus = TaskGpus(job_);
  std::string task_resources = absl::StrCat(TaskCpus(job_), " core", TaskCpus(job_) == 1 ? "" : "s");
  if (task_gpus > 0) absl::StrAppend(&task_resources, ", ", task_gpus, " GPU", task_gpus == 1 ? "" : "s");
  std::map<std::string, std::string> conf =
      SparkProperties(job_, options_, HostOf(options.master_address));
  if (auto st = MakeDirs(options_.state_dir); !st.ok()) return st;
  std::string shoal_binary = options.shoal_binary;
  std::string pythonpath;
  if (const char* path = std::getenv("PYTHONPATH"); path != nullptr && *path != '\0') {
    pythonpath = path;
  }
  if (IsKubernetesMaster(options_.master)) {
    // Executor pods run Shoal's agent bundle from the agent image (an init container copies it
    // in), whatever the executor image holds; the job's own conf may name another template.
    shoal_binary = absl::StrCat(kAgentBundleDir, "/bin/shoal");
    pythonpath = absl::StrCat(kAgentBundleDir, "/python");
    if (!options_.conf.contains("spark.kubernetes.executor.podTemplateFile")) {
      std::string pull_policy;
      if (auto it = conf.find("spark.kubernetes.container.image.pullPolicy"); it != conf.end()) {
        pull_policy = it->second;
      }
      std::string path = options_.state_dir + "/" + kPodTemplateFile;
      if (auto st = ReplaceFile(path, ExecutorPodTemplate(options_.agent_image, pull_policy).dump(2));
          !st.ok()) {
        return st;
      }
      conf["spark.kubernetes.executor.podTemplateFile"] = path;
      conf["spark.kubernetes.executor.podTemplateContainerName"] = kExecutorContainer;
    }
  }
  nlohmann::json settings = {
      {"master", options_.master},
      {"app_name", ApplicationName()},
      {"conf", conf},
      {"places", places},
      {"agent_args", agent_args},
      {"shoal_binary", shoal_binary},
      {"ship_binary", options_.ship_binary},
      {"task_resources", task_resources}};
  if (!pythonpath.empty()) settings["pythonpath"] = pythonpath;
  std::string program = options_.state_dir + "/" + kDriverFile;
  std::string settings_path = options_.state_dir + "/driver.json";
  if (auto st = ReplaceFile(program, DriverProgram()); !st.ok()) return st;
  if (auto st = ReplaceFile(settings_path, settings.dump(2), 0600); !st.ok()) return st;

  process::ProcessSpec spec;
  spec.key = "spark-driver:" + options.job_id;
  spec.argv = {options_.python, program, settings_path};
  spec.working_dir = options_.state_dir;
  // The token reaches the barrier tasks inside the task closure Spark ships; never argv, never
  // a Spark property (the Spark UI shows those).
  spec.env = InheritedEnvironment({"SHOAL_AGENT_TOKEN"});
  spec.env["SHOAL_AGENT_TOKEN"] = options.token;
  spec.env["PYSPARK_PYTHON"] = options_.python;
  spec.env["PYSPARK_DRIVER_PYTHON"] = options_.python;
  spec.env["PYTHONUNBUFFERED"] = "1";
  if (!options_.hadoop_conf_dir.empty()) {
    // Where Spark's YARN client finds the ResourceManager (checked before the job started).
    spec.env["HADOOP_CONF_DIR"] = options_.hadoop_conf_dir;
    spec.env["YARN_CONF_DIR"] = options_.hadoop_conf_dir;
  }
  auto plan = process::ExecPlan::Build(spec);
  if (!plan.ok()) return plan.status();
  std::string log_path = options_.state_dir + "/driver.log";
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  }
  int out[2], in[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(log);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // A socket rather than a pipe for the commands: a write to a driver that died must fail
  // with EPIPE (MSG_NOSIGNAL), not raise SIGPIPE in the master's loop thread.
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) {
    ::close(log);
    ::close(out[0]);
    ::close(out[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  process::ChildSetup setup;
  setup.stdin_fd = in[0];
  setup.stdout_fd = out[1];
  setup.stderr_fd = log;
  // The driver (and the application with it) ends with the master: nothing of the job may
  // keep running on the cluster unwatched.
  setup.die_with_parent = true;
  auto child = process::SystemLauncher().Launch(*plan, setup);
  ::close(out[1]);
  ::close(in[0]);
  ::close(log);
  if (!child.ok()) {
    ::close(out[0]);
    ::close(in[1]);
    return child.status();
  }
  spdlog::info("started the Spark driver for {} (pid {}, master {}, log {})", ApplicationName(),
               child->pid, options_.master, log_path);
  {
    absl::MutexLock lock(&mu_);
    driver_pid_ = child->pid;
    driver_stdin_ = in[1];
  }
  int read_fd = out[0];
  watcher_ = std::thread([this, read_fd] { Watch(read_fd); });
  return absl::OkStatus();
}

void SparkBackend::Watch(int stdout_fd) {
  std::string partial;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(stdout_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      std::string line = partial.substr(0, nl);
      partial.erase(0, nl + 1);
      if (!absl::StartsWith(line, kEventPrefix)) {
        spdlog::info("spark driver: {}", line);
        continue;
      }
      auto event = nlohmann::json::parse(line.substr(sizeof kEventPrefix - 1), nullptr, false);
      if (event.is_object()) HandleEvent(event);
    }
  }
  ::close(stdout_fd);
  pid_t pid;
  {
    absl::MutexLock lock(&mu_);
    pid = driver_pid_;
  }
  int status = -1;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  AllocationEventCallback on_event;
  bool gang, releasing;
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    driver_exited_ = true;
    driver_status_ = status;
    driver_pid_ = -1;
    releasing = releasing_;
    gang = gang_;
    on_event = on_event_;
    why = finish_reason_;
  }
  if (releasing) return;
  if (why.empty()) {
    why = WIFSIGNALED(status)
              ? absl::StrCat("the Spark driver was killed by signal ", WTERMSIG(status))
              : absl::StrCat("the Spark driver exited with status ", WEXITSTATUS(status));
    why += absl::StrCat(" (its log: ", options_.state_dir, "/driver.log)");
  }
  if (!gang) {
    // The barrier stage never ran: the job was not admitted, in Spark's words.
    spdlog::warn("the Spark application ended before its barrier stage ran: {}", why);
    if (on_event) on_event({AllocationEvent::kRefused, "Spark: " + why});
    return;
  }
  // Spark gave the job up (its stage attempts used up, the driver gone): no place can come
  // back, so the job ends now with Spark's reason, as when a resource manager cancels a job,
  // rather than waiting for replacements that cannot come.
  std::string ended = absl::StrCat("the Spark application ", ApplicationName(), " ended: ", why);
  spdlog::warn("{}", ended);
  if (on_event) on_event({AllocationEvent::kCancelled, ended});
  LoseAll(ended);
}

void SparkBackend::HandleEvent(const nlohmann::json& event) {
  std::string kind = event.value("kind", "");
  AllocationEventCallback on_event;
  {
    absl::MutexLock lock(&mu_);
    if (releasing_) return;
    on_event = on_event_;
  }
  if (kind == "application") {
    std::string app_id = event.value("app_id", "");
    {
      absl::MutexLock lock(&mu_);
      app_id_ = app_id;
    }
    spdlog::info("Spark application {} ({}) is up; driver UI {}", app_id, ApplicationName(),
                 event.value("ui", ""));
    nlohmann::json record = {{"application_id", app_id},
                             {"application_name", ApplicationName()},
                             {"master", options_.master},
                             {"ui", event.value("ui", "")}};
    (void)ReplaceFile(options_.state_dir + "/application.json", record.dump(2));
  } else if (kind == "queued") {
    std::string reason = event.value("reason", "");
    {
      absl::MutexLock lock(&mu_);
      if (reason == last_queued_reason_) return;
      last_queued_reason_ = reason;
      if (gang_) {
        spdlog::info("{}", reason);
        return;
      }
    }
    spdlog::info("{}", reason);
    if (on_event) on_event({AllocationEvent::kQueued, reason});
  } else if (kind == "gang") {
    int attempt = event.value("attempt", 0);
    bool first;
    std::string app_id;
    {
      absl::MutexLock lock(&mu_);
      first = !gang_;
      gang_ = true;
      last_queued_reason_.clear();
      app_id = app_id_;
    }
    std::string why = absl::StrCat("Spark started the barrier stage of ", app_id, ": all ",
                                   places_.size(), " tasks run (stage attempt ", attempt, ")");
    spdlog::info("{}", why);
    if (first && on_event) on_event({AllocationEvent::kAllocated, why});
  } else if (kind == "agent_started") {
    {
      absl::MutexLock lock(&mu_);
      started_places_.insert(event.value("place", ""));
    }
    spdlog::info("Spark barrier task on {} started the agent for {} (stage attempt {})",
                 event.value("host", ""), event.value("place", ""), event.value("attempt", 0));
  } else if (kind == "agent_failed") {
    std::string place = event.value("place", "");
    std::string why = absl::StrCat("the Spark barrier task for ", place, " on ",
                                   event.value("host", ""), " cannot start `",
                                   event.value("binary", ""), " agent`: ", event.value("error", ""));
    PlaceLostCallback on_lost;
    bool first_start, refuse;
    {
      absl::MutexLock lock(&mu_);
      on_lost = on_lost_;
      first_start = !started_places_.contains(place);
      refuse = first_start && !refused_;
      if (refuse) refused_ = true;
    }
    spdlog::warn("{}", why);
    // Never started there: the job cannot run as asked (say so now, not after the agents'
    // registration deadline). Started before: the replacement failed, the place is lost.
    if (first_start) {
      if (refuse && on_event) on_event({AllocationEvent::kRefused, why});
    } else if (on_lost) {
      on_lost(place, why);
    }
  } else if (kind == "place_lost") {
    std::string place = event.value("place", "");
    std::string why = event.value("reason", "");
    PlaceLostCallback on_lost;
    {
      absl::MutexLock lock(&mu_);
      on_lost = on_lost_;
    }
    spdlog::warn("place {} lost: {}", place, why);
    if (on_lost) on_lost(place, why);
  } else if (kind == "finished") {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    if (!event.value("ok", false)) finish_reason_ = event.value("reason", "");
  }
}

void SparkBackend::LoseAll(const std::string& why) {
  PlaceLostCallback on_lost;
  {
    absl::MutexLock lock(&mu_);
    if (releasing_) return;
    on_lost = on_lost_;
  }
  spdlog::warn("every place lost: {}", why);
  if (on_lost) {
    for (const auto& p : places_) on_lost(p.name, why);
  }
}

void SparkBackend::SetPlaceLostCallback(PlaceLostCallback callback) {
  absl::MutexLock lock(&mu_);
  on_lost_ = std::move(callback);
}

void SparkBackend::SetAllocationEventCallback(AllocationEventCallback callback) {
  absl::MutexLock lock(&mu_);
  on_event_ = std::move(callback);
}

void SparkBackend::Command(const std::string& line) {
  if (driver_stdin_ < 0) return;
  std::string text = line + "\n";
  // A few bytes to a pipe the driver reads all the time: never blocks for long.
  if (::send(driver_stdin_, text.data(), text.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(text.size())) {
    spdlog::warn("cannot tell the Spark driver '{}': {}", line, std::strerror(errno));
  }
}

void SparkBackend::TerminatePlace(const std::string& node) {
  // The place's barrier task stops its agent (SIGTERM, then SIGKILL) and stays, waiting to
  // start a new one if the place is replaced.
  absl::MutexLock lock(&mu_);
  Command("terminate " + node);
}

absl::Status SparkBackend::ReplacePlace(const std::string& node, const AgentStartOptions&) {
  absl::MutexLock lock(&mu_);
  if (driver_exited_ || finished_ || driver_stdin_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the Spark application ", ApplicationName(), " has ended",
        finish_reason_.empty() ? "" : ": " + finish_reason_));
  }
  // The place's barrier task starts a new agent; if the task itself is gone (its executor was
  // lost, and Spark failed the stage attempt), the task of Spark's retried attempt does.
  Command("replace " + node);
  return absl::OkStatus();
}

void SparkBackend::Release() {
  pid_t pid;
  {
    absl::MutexLock lock(&mu_);
    if (released_) return;
    released_ = true;
    releasing_ = true;
    pid = driver_pid_;
  }
  auto exited = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return driver_exited_; };
  if (pid > 0) {
    // The master has normally told every agent to shut down: their barrier tasks complete, the
    // stage ends and the driver with it. Otherwise the driver cancels the stage (Spark kills
    // the barrier tasks' Python workers, and the agents with them) and stops the application.
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&exited), absl::Seconds(5))) {
      Command("end");
      if (!mu_.AwaitWithTimeout(absl::Condition(&exited), absl::FromChrono(options_.stop_grace))) {
        spdlog::warn("the Spark driver (pid {}) has not ended {}s after it was told to end; killing it", pid,
                     absl::ToInt64Seconds(absl::FromChrono(options_.stop_grace)));
        // Its process group: the driver's JVM too, which then stops the application.
        ::kill(-pid, SIGKILL);
      }
    }
  }
  if (watcher_.joinable()) watcher_.join();
  absl::MutexLock lock(&mu_);
  if (driver_stdin_ >= 0) ::close(driver_stdin_);
  driver_stdin_ = -1;
}

}  // namespace shoal::backends
