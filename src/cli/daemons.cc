// Composition roots of the two daemons: read configuration, build, inject, run.
#include "cli/daemons.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <cstdlib>
#include <thread>

#include "absl/strings/ascii.h"
#include "agent/agent.h"
#include "backends/local/local_backend.h"
#include "common/files.h"
#include "master/master.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "spec/inventory.h"
#include "spec/spec_parser.h"

namespace shoal::cli {
namespace {

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

int RunMasterDaemon(const std::string& job_dir, const std::string& shoal_binary, bool recover) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l master: %v");
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
                                 submit.value("base_dir", job_dir));
  if (!spec.ok()) {
    spdlog::error("invalid job file: {}", std::string(spec.status().message()));
    return 2;
  }
  spec::InventoryOptions inv;
  if (submit.contains("fake_gpus")) inv.fake_gpus = submit["fake_gpus"].get<uint32_t>();
  backends::LocalBackendOptions local;
  local.machine = spec::DetectLocalInventory(inv);
  local.ledger_dir = submit.value("jobs_root", job_dir + "/..") + "/.ledger";
  local.agent_work_dir = job_dir + "/agents/local";
  local.fake_gpus = inv.fake_gpus;

  master::MasterOptions options;
  options.job_id = submit.value("job_id", "");
  options.job_dir = job_dir;
  options.spec = *spec;
  options.listen_host = submit.value("listen_host", "127.0.0.1");
  options.token = std::string(absl::StripAsciiWhitespace(*token));
  options.shoal_binary = shoal_binary;
  options.recover = recover;
  // Tunables for operators and tests; documented in docs/configuration.md.
  if (const char* grace = std::getenv("SHOAL_AGENT_MASTER_GRACE_MS")) {
    options.agent_master_grace_ms = static_cast<uint32_t>(std::strtoul(grace, nullptr, 10));
  }
  options.heartbeat_interval = spec->heartbeat.interval;
  options.heartbeat_misses = static_cast<int>(spec->heartbeat.misses);
  if (const char* hb = std::getenv("SHOAL_HEARTBEAT_INTERVAL_MS")) {
    options.heartbeat_interval = std::chrono::milliseconds(std::strtoul(hb, nullptr, 10));
  }
  auto master = master::Master::Create(std::move(options),
                                       std::make_unique<backends::LocalBackend>(local));
  if (!master.ok()) {
    spdlog::error("cannot create the master: {}", master.status().ToString());
    return 1;
  }
  if (auto st = (*master)->Start(); !st.ok()) {
    spdlog::error("cannot start the master: {}", st.ToString());
    return 1;
  }
  spdlog::info("job {} listening on {}", submit.value("job_id", ""), (*master)->address());
  SignalWatcher signals([&](int sig) {
    spdlog::warn("received {}; stopping the job", sigabbrev_np(sig));
    (*master)->Kill(std::string("the master received SIG") + sigabbrev_np(sig));
  });
  int code = (*master)->Wait();
  spdlog::info("job finished; master exiting with {}", code);
  return code;
}

int RunAgentDaemon(const AgentFlags& flags) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l agent: %v");
  agent::AgentOptions options;
  options.master_address = flags.master;
  const char* token = std::getenv("SHOAL_AGENT_TOKEN");
  options.token = token ? token : "";
  options.node_name = flags.node;
  options.work_dir = flags.work_dir.empty() ? "/tmp/shoal-agent-" + flags.node : flags.work_dir;
  options.ports = flags.ports;
  options.keep_task_output = flags.keep_task_output;
  options.fake_gpus = flags.fake_gpus;
  options.master_grace = std::chrono::milliseconds(flags.master_grace_ms);
  if (flags.heartbeat_interval_ms != 0) {
    options.heartbeat_interval = std::chrono::milliseconds(flags.heartbeat_interval_ms);
  }
  if (const char* hb = std::getenv("SHOAL_HEARTBEAT_INTERVAL_MS")) {
    options.heartbeat_interval = std::chrono::milliseconds(std::strtoul(hb, nullptr, 10));
  }
  auto agent = agent::Agent::Create(std::move(options));
  if (!agent.ok()) {
    spdlog::error("cannot start the agent: {}", std::string(agent.status().message()));
    return 2;
  }
  SignalWatcher signals([&](int sig) { (*agent)->RequestStop(); });
  return (*agent)->Run();
}

}  // namespace shoal::cli
