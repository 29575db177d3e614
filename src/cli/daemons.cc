// Composition roots of the two daemons: read configuration, build, inject, run.
#include "cli/daemons.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <optional>
#include <cstdlib>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/agent.h"
#include "backends/backend_provider.h"
#include "backends/slurm/srun_command.h"
#include "cli/backends_registry.h"
#include "common/files.h"
#include "common/port_range.h"
#include "process/process.h"
#include "master/master.h"
#include "master/tensorboard_sidecar.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "spec/spec_parser.h"

namespace shoal::cli {

namespace {

// A tunable of milliseconds from the environment (docs/configuration.md). A value that is not
// a whole number up to one hour (a typo, a negative number that strtoul would wrap) is named
// in a warning and the default kept: a tunable never silently becomes 0 or ~forever.
std::optional<uint32_t> EnvMilliseconds(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  uint32_t ms = 0;
  if (!absl::SimpleAtoi(text, &ms) || ms > 3'600'000) {
    spdlog::warn("{}='{}' is not a number of milliseconds from 0 to 3600000; ignoring it", name,
                 text);
    return std::nullopt;
  }
  return ms;
}

// Runs `on_signal` on a dedicated thread at SIGTERM/SIGINT. Signals must already be blocked in
// every thread (done first thing in main()). The destructor wakes the thread with SIGUSR1 rather
// than waiting out a polling tick, so a daemon exits the moment its work is done.
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int)> on_signal) {
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGTERM);
      sigaddset(&set, SIGINT);
      sigaddset(&set, SIGUSR1);
      while (!done_) {
        int sig = 0;
        if (::sigwait(&set, &sig) != 0) continue;
        if (sig != SIGUSR1) on_signal(sig);
      }
    });
  }
  ~SignalWatcher() {
    done_ = true;
    ::pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int RunMasterDaemon(const std::string& job_dir, const std::string& shoal_binary, bool recover,
                    int ready_fd) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l master: %v");
  // Not for the agents or sidecars it starts: the client must see it close when this exits.
  if (ready_fd >= 0) ::fcntl(ready_fd, F_SETFD, FD_CLOEXEC);
  auto submit_text = ReadFile(job_dir + "/submit.json");
  auto spec_text = ReadFile(job_dir + "/spec.yaml");
  auto token = ReadFile(job_dir + "/token");
  if (!submit_text.ok() || !spec_text.ok() || !token.ok()) {
    spdlog::error("{} is not a complete job directory (submit.json, spec.yaml, token)", job_dir);
    return 2;
  }
  auto submit = nlohmann::json::parse(*submit_text, nullptr, false);
  if (submit.is_discarded()) {
    spdlog::error("{}/submit.json is not valid JSON", job_dir);
    return 2;
  }
  auto spec = spec::ParseJobSpec(*spec_text, submit.value("source_path", job_dir + "/spec.yaml"),
                                 submit.value("base_dir", job_dir),
                                 BuiltInBackends().JobSections());
  if (!spec.ok()) {
    spdlog::error("invalid job file: {}", std::string(spec.status().message()));
    return 2;
  }
  if (!spec->dataset.parquet.empty()) {
    // Listed by `shoal run` and fixed there (master/parquet_dataset.h), never listed again.
    const nlohmann::json files = submit.value("dataset_files", nlohmann::json());
    bool valid = files.is_array() && !files.empty();
    for (const auto& f : files) valid = valid && f.is_string();
    if (!valid) {
      spdlog::error("{}/submit.json lacks dataset_files, the Parquet files `shoal run` listed",
                    job_dir);
      return 2;
    }
    spec->dataset.files = files.get<std::vector<std::string>>();
  }
  std::string backend_name = submit.value("backend", "local");
  const backends::BackendProvider* provider = BuiltInBackends().Find(backend_name);
  if (provider == nullptr) {
    spdlog::error("{}/submit.json names an unknown backend '{}'", job_dir, backend_name);
    return 2;
  }
  const nlohmann::json settings = submit.value(backend_name, nlohmann::json::object());
  backends::BackendContext context;
  context.job = &*spec;
  context.job_dir = job_dir;
  context.submit = &submit;
  context.settings = &settings;
  context.listen_host = submit.value("listen_host", "");
  absl::StatusOr<backends::CreatedBackend> created = provider->Create(context);
  if (!created.ok()) {
    spdlog::error("{}", std::string(created.status().message()));
    return 2;
  }
  std::unique_ptr<backends::Backend> backend = std::move(created->backend);
  std::string listen_host = created->listen_host;
  if (listen_host.empty()) listen_host = "127.0.0.1";

  master::MasterOptions options;
  options.job_id = submit.value("job_id", "");
  options.job_dir = job_dir;
  options.spec = *spec;
  options.listen_host = listen_host;
  options.token = std::string(absl::StripAsciiWhitespace(*token));
  options.shoal_binary = shoal_binary;
  options.recover = recover;
  // The agents dial the previous master's port: wait for a predecessor still letting go of it.
  if (recover) options.listen_patience = std::chrono::seconds(10);
  // Tunables for operators and tests; documented in docs/configuration.md.
  if (auto grace = EnvMilliseconds("SHOAL_AGENT_MASTER_GRACE_MS")) {
    options.agent_master_grace_ms = *grace;
  }
  options.heartbeat_interval = spec->heartbeat.interval;
  options.heartbeat_misses = static_cast<int>(spec->heartbeat.misses);
  if (auto hb = EnvMilliseconds("SHOAL_HEARTBEAT_INTERVAL_MS")) {
    options.heartbeat_interval = std::chrono::milliseconds(*hb);
  }
  auto master = master::Master::Create(std::move(options), std::move(backend));
  if (!master.ok()) {
    spdlog::error("cannot create the master: {}", master.status().ToString());
    return 1;
  }
  if (auto st = (*master)->Start(); !st.ok()) {
    spdlog::error("cannot start the master: {}", st.ToString());
    return 1;
  }
  spdlog::info("job {} listening on {}", submit.value("job_id", ""), (*master)->address());
  if (ready_fd >= 0) {
    // A client that is gone does not matter: its SIGPIPE (sent to this thread) is blocked and
    // dropped rather than ending the job.
    sigset_t pipe_signal, old_mask;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask);
    ssize_t ignored = ::write(ready_fd, "1", 1);
    (void)ignored;
    timespec now{0, 0};
    ::sigtimedwait(&pipe_signal, nullptr, &now);
    ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    ::close(ready_fd);
  }
  std::unique_ptr<master::TensorBoardSidecar> tensorboard;
  if (spec->tensorboard.configured) {
    // Beside the job, never part of it: a TensorBoard that cannot start is reported, and the
    // job runs on.
    auto command = master::ResolveTensorBoardCommand(spec->tensorboard);
    master::Master* m = master->get();
    if (!command.ok()) {
      m->SidecarFailed("TensorBoard", std::string(command.status().message()));
    } else {
      auto started = master::TensorBoardSidecar::Start(
          *command, master::TensorBoardLogdir(spec->tensorboard, job_dir),
          job_dir + "/tensorboard.log",
          [m](const std::string& url) { m->AnnounceSidecar("TensorBoard", url); },
          [m](const std::string& why) { m->SidecarFailed("TensorBoard", why); });
      if (started.ok()) {
        tensorboard = std::move(*started);
      } else {
        m->SidecarFailed("TensorBoard", absl::StrCat("cannot start TensorBoard: ",
                                                     started.status().message()));
      }
    }
  }
  SignalWatcher signals([&](int sig) {
    spdlog::warn("received {}; stopping the job", sigabbrev_np(sig));
    (*master)->Kill(std::string("the master received SIG") + sigabbrev_np(sig));
  });
  int code = (*master)->Wait();
  tensorboard.reset();  // it serves the job's logs only while the job lives
  // A client behind on the output (a paused pager, a slow link) gets a moment to take the
  // rest from this master; past it, `shoal run` reads what is left from logs.txt itself.
  if (!(*master)->WaitForWatchers(std::chrono::seconds(5))) {
    spdlog::info("a client was still reading the job's output; it catches up from logs.txt");
  }
  spdlog::info("job finished; master exiting with {}", code);
  return code;
}

namespace {

// The GPUs the resource manager bound to this agent (Slurm, YARN): CUDA_VISIBLE_DEVICES. Empty
// when the task asked for none.
std::vector<std::string> BoundGpus() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> gpus;
  if (visible == nullptr) return gpus;
  for (absl::string_view id : absl::StrSplit(visible, ',', absl::SkipWhitespace())) {
    gpus.emplace_back(id);
  }
  return gpus;
}

}  // namespace

int RunAgentDaemon(const AgentFlags& flags) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l agent: %v");
  agent::AgentOptions options;
  options.master_address = flags.master;
  const char* token = std::getenv("SHOAL_AGENT_TOKEN");
  options.token = token ? token : "";
  options.node_name = flags.node;
  options.work_dir = flags.work_dir.empty() ? "/tmp/shoal-agent-" + flags.node : flags.work_dir;
  if (!flags.slurm_place.empty()) {
    const char* procid = std::getenv("SLURM_PROCID");
    uint32_t rank = 0;
    if (procid == nullptr || !absl::SimpleAtoi(procid, &rank)) {
      spdlog::error("--slurm-place needs SLURM_PROCID (run the agent through srun); got '{}'",
                    procid ? procid : "");
      return 2;
    }
    auto place = backends::SlurmPlaceOf(flags.slurm_place, rank);
    if (!place.ok()) {
      spdlog::error("{}", std::string(place.status().message()));
      return 2;
    }
    options.node_name = *place;
    // Several of the job's agents may share this machine: each keeps its files apart.
    options.work_dir = absl::StrCat(options.work_dir, "/", *place);
    options.bound_gpus = BoundGpus();
    options.hide_slurm_step_env = true;
  }
  if (flags.gpus_from_env) options.bound_gpus = BoundGpus();
  options.in_container = flags.in_container;
  options.ports = flags.ports;
  // The environment wins over the flag, as for the other agent tunables. `shoal run` refused
  // a malformed value before anything started; an agent started some other way keeps the
  // default rather than fail the job.
  const char* env_ports = std::getenv("SHOAL_TASK_PORTS");
  std::string task_ports = env_ports != nullptr && *env_ports != '\0' ? env_ports : flags.task_ports;
  if (!task_ports.empty()) {
    if (auto range = ParsePortRange(task_ports); range.ok()) {
      options.task_ports = *range;
    } else {
      spdlog::warn("task ports '{}': {}; ignoring them", task_ports,
                   std::string(range.status().message()));
    }
  }
  options.keep_task_output = flags.keep_task_output;
  options.fake_gpus = flags.fake_gpus;
  options.master_grace = std::chrono::milliseconds(flags.master_grace_ms);
  options.watchdog_limit = std::chrono::milliseconds(flags.watchdog_ms);
  options.log_flush_window = std::chrono::milliseconds(flags.log_flush_ms);
  if (auto flush = EnvMilliseconds("SHOAL_AGENT_LOG_FLUSH_MS")) {
    options.log_flush_window = std::chrono::milliseconds(*flush);
  }
  if (auto sample = EnvMilliseconds("SHOAL_AGENT_SAMPLE_INTERVAL_MS")) {
    options.resource_sample_interval = std::chrono::milliseconds(*sample);
  }
  options.shoal_binary = flags.shoal_binary;
  if (flags.heartbeat_interval_ms != 0) {
    options.heartbeat_interval = std::chrono::milliseconds(flags.heartbeat_interval_ms);
  }
  if (auto hb = EnvMilliseconds("SHOAL_HEARTBEAT_INTERVAL_MS")) {
    options.heartbeat_interval = std::chrono::milliseconds(*hb);
  }
  const std::string work_dir = options.work_dir;
  auto agent = agent::Agent::Create(std::move(options));
  if (!agent.ok()) {
    spdlog::error("cannot start the agent: {}", std::string(agent.status().message()));
    return 2;
  }
  SignalWatcher signals([&](int sig) {
    (*agent)->RequestStop(absl::StrCat("the agent received SIG", sigabbrev_np(sig)));
  });
  int code = (*agent)->Run();
  (*agent)->Shutdown();
  KeepUntilExit(std::shared_ptr<agent::Agent>(std::move(*agent)));
  if (!flags.slurm_place.empty()) {
    // A Slurm node's scratch, one directory per job under /tmp/shoal-agents: the task output
    // reached the master, and nothing else there outlives the agent's step. The job's
    // directory goes with its last place.
    std::error_code ec;
    std::filesystem::remove_all(work_dir, ec);
    std::filesystem::remove(std::filesystem::path(work_dir).parent_path(), ec);
  }
  return code;
}

}  // namespace shoal::cli
