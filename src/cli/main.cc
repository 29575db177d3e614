// The `shoal` binary: parse flags, hand over to the client commands or a daemon. Nothing else.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <grpc/support/log.h>

#include "CLI/CLI.hpp"
#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "backends/kubernetes/agent_delivery.h"
#include "backends/kubernetes/kubernetes_section.h"
#include "cli/backends_registry.h"
#include "cli/daemons.h"
#include "cli/kubernetes_commands.h"
#include "cli/serve_manifests.h"
#include "client/commands.h"
#include "client/job_directory.h"
#include "agent/agent_watchdog.h"
#include "mpi/mpi_commands.h"
#include "serve/serve_command.h"
#include "ui/ui_command.h"
#include "spdlog/spdlog.h"

namespace {

std::string SelfPath(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

int RunShoal(int argc, char** argv);

// gRPC's own log lines ("No address added out of total 1 resolved" for a port in use, a peer
// that went away) are for whoever debugs Shoal, not for its users, who get Shoal's own message
// naming what is wrong: they go to Shoal's log at debug level.
void LogGrpcAtDebug(gpr_log_func_args* args) {
  spdlog::debug("grpc {}:{}: {}", args->file ? args->file : "?", args->line,
                args->message ? args->message : "");
}

}  // namespace

int main(int argc, char** argv) {
  gpr_set_log_function(&LogGrpcAtDebug);
  int code = RunShoal(argc, argv);
  // Every command has finished its work and released what it owns by the time it returns; what
  // exit() would still run is the libraries' global teardown, gRPC's among it, which sleeps 1 ms
  // and then 2 ms for its threads. `shoal run` and both daemons would add that to the end of
  // every job, so the process leaves at once, output flushed.
  std::cout.flush();
  std::cerr.flush();
  spdlog::shutdown();
  std::fflush(nullptr);
  std::_Exit(code);
}

namespace {

int RunShoal(int argc, char** argv) {
  using shoal::client::kExitUsage;
  // framework: mpi's task commands take Open MPI's arguments verbatim (orted's -mca ... for
  // mpi-rsh, the MPI program after -- for mpi-launcher), so they bypass flag parsing.
  if (argc >= 2) {
    std::string sub = argv[1];
    std::vector<std::string> rest(argv + 2, argv + argc);
    if (sub == "mpi-rsh") return shoal::mpi::RunMpiRsh(rest);
    if (sub == "agent-watchdog" && rest.size() == 2) {
      // Started by an agent (agent_watchdog.h) with its ping pipe on fd 3.
      return shoal::agent::RunAgentWatchdog(std::atoi(rest[0].c_str()), 3,
                                            std::chrono::milliseconds(std::atoll(rest[1].c_str())));
    }
    if (sub == "mpi-worker" && rest.empty()) return shoal::mpi::RunMpiWorker();
    if (sub == "mpi-launcher" && !rest.empty() && rest[0] == "--") {
      return shoal::mpi::RunMpiLauncher(SelfPath(argv[0]), {rest.begin() + 1, rest.end()});
    }
  }
  CLI::App app{
      "Shoal runs distributed training jobs described in one YAML file, and supervises them.\n"
      "Exit codes: 0 success, 1 the job failed, 2 invalid job file or usage, 129 hung up (detached;\n"
      "the job runs on), 130 interrupted, 141 output closed (detached)."};
  app.require_subcommand(1);
  app.fallthrough();  // `shoal run --jobs-dir D job.yaml` works as well as `shoal --jobs-dir D run job.yaml`
  app.set_version_flag("--version", "shoal 0.1.0");
  std::string jobs_dir;
  app.add_option("--jobs-dir", jobs_dir,
                 "Where job directories live (default: $SHOAL_JOBS_DIR, else ~/.shoal/jobs)");

  shoal::client::RunOptions run;
  uint32_t fake_gpus = 0;
  auto* run_cmd = app.add_subcommand("run", "Run a job and follow it to its end (or --detach)");
  run_cmd->add_option("job_file", run.job_file, "The job's YAML file")->required();
  run_cmd->add_flag("-d,--detach", run.detach, "Print the job id and return once it started");
  run_cmd->add_flag("-q,--quiet", run.quiet, "No live status line; task output and the outcome only");
  auto* fake_opt = run_cmd->add_option(
      "--fake-gpus", fake_gpus,
      "Declare N GPUs on this machine instead of discovering them (for testing assignment)");
  const shoal::backends::BackendRegistry& backends = shoal::cli::BuiltInBackends();
  // Each backend's own flags (backends::RunFlag), by name; empty: not given.
  std::map<std::string, std::string> backend_flags;
  // `submit` is `run --detach`: the same flags, the job id printed once it started.
  auto* submit_cmd = app.add_subcommand("submit", "Start a job and print its id (run --detach)");
  for (CLI::App* cmd : {run_cmd, submit_cmd}) {
    if (cmd == submit_cmd) {
      cmd->add_option("job_file", run.job_file, "The job's YAML file")->required();
      cmd->add_flag("-q,--quiet", run.quiet, "No progress messages");
    }
    cmd->add_option("--listen", run.listen_host,
                    "Address the job's master listens on (default 127.0.0.1; with --backend "
                    "slurm, this machine's address towards the Slurm controller)");
    cmd->add_option("--backend", run.backend,
                    "Where the job runs: " + backends.NamesForMessages(run.backend))
        ->check(CLI::IsMember(backends.Names()));
    for (const auto& provider : backends.providers()) {
      for (const shoal::backends::RunFlag& flag : provider->Flags()) {
        cmd->add_option(flag.name, backend_flags[flag.name], flag.help);
      }
    }
  }

  std::string job, task;
  bool json = false, follow = false;
  auto* status_cmd = app.add_subcommand("status", "Show a job's state and its tasks");
  status_cmd->add_option("job", job, "Job id, or a unique prefix of it")->required();
  status_cmd->add_flag("--json", json, "Print status.json's form");

  auto* list_cmd = app.add_subcommand("list", "List jobs, oldest first");
  list_cmd->add_flag("--json", json, "Print JSON");

  auto* logs_cmd = app.add_subcommand("logs", "Print a job's output, each line prefixed role:index");
  logs_cmd->add_option("job", job, "Job id, or a unique prefix of it")->required();
  logs_cmd->add_option("--task", task, "Only this task's output, e.g. worker:1 (unprefixed)");
  logs_cmd->add_flag("-f,--follow", follow, "Keep printing new output until the job ends");

  auto* kill_cmd = app.add_subcommand("kill", "Stop every task of a job (SIGTERM, then SIGKILL)");
  kill_cmd->add_option("job", job, "Job id, or a unique prefix of it")->required();

  auto* tensorboard_cmd = app.add_subcommand(
      "tensorboard", "Serve a job's TensorBoard logs on loopback, also after it ended");
  tensorboard_cmd->add_option("job", job, "Job id, or a unique prefix of it")->required();

  bool resume_quiet = false;
  auto* resume_cmd = app.add_subcommand(
      "resume", "Follow a job again; if its master died, a new one takes over from its journal");
  resume_cmd->add_option("job", job, "Job id, or a unique prefix of it")->required();
  resume_cmd->add_flag("-q,--quiet", resume_quiet, "No live status line");

  shoal::serve::ServeOptions serve;
  auto* serve_cmd = app.add_subcommand(
      "serve", "Serve the TorchScript models of a model repository over KServe v2 REST and gRPC");
  auto* serve_repository_opt =
      serve_cmd->add_option("--model-repository", serve.model_repository,
                            "Directory of <model>/<version>/model.pt, or "
                            "hdfs://NAMENODE[:PORT]/PATH (docs/serving.md)");
  serve_cmd->add_option("--repository-cache-dir", serve.repository_cache_dir,
                        "Where an hdfs:// repository is copied to be served (default: a "
                        "temporary directory, removed at exit)");
  serve_cmd->add_option("--http-port", serve.http_port, "HTTP port (default 8000; 0: a free one)");
  auto* serve_host_opt =
      serve_cmd->add_option("--host", serve.host, "Address to listen on (default 127.0.0.1)");
  serve_cmd->add_option("--http-threads", serve.http_threads,
                        "HTTP event-loop threads (default 0: one per CPU the server may use)")
      ->check(CLI::Range(0, 1024));
  serve_cmd->add_option("--max-request-bytes", serve.max_request_bytes,
                        "Larger request bodies are refused with 413 (default 64 MiB)")
      ->check(CLI::PositiveNumber);
  serve_cmd->add_option("--grpc-port", serve.grpc_port,
                        "gRPC port, on --host (default 8001; 0: a free one)");
  serve_cmd->add_option("--grpc-threads", serve.grpc_threads,
                        "Threads running gRPC inference calls (default 64)")
      ->check(CLI::Range(1, 4096));
  auto* serve_token_opt = serve_cmd->add_option("--token-file", serve.token_file,
                        "File with the token callers must send as Authorization: Bearer (required "
                        "with a non-loopback --host; default $SHOAL_SERVE_TOKEN_FILE)");
  serve_cmd->add_option("--repository-poll-ms", serve.repository_poll_ms,
                        "Rescan the repository for new versions and models this often (default "
                        "1000; 0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  serve_cmd->add_option("--repository-settle-ms", serve.repository_settle_ms,
                        "Load a new version once its files are unchanged this long (default 2000)")
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  serve_cmd->add_option("--drain-seconds", serve.drain_seconds,
                        "On SIGTERM, keep answering this long while /v2/health/ready says 503, "
                        "before the listeners close (default 5; 0: close at once)")
      ->check(CLI::Range(0, 3600));
  serve_cmd->add_option("--finish-seconds", serve.finish_seconds,
                        "Once the listeners closed, wait at most this long for the requests in "
                        "flight (default 20)")
      ->check(CLI::Range(1, 3600));
  // Kubernetes (docs/serving.md, "Running on Kubernetes"): these flags only shape the manifests.
  bool print_manifests = false;
  shoal::cli::ServeManifestFlags manifests;
  serve_cmd->add_flag("--print-manifests", print_manifests,
                      "Print a Deployment, a Service and a token Secret that run this server on "
                      "Kubernetes (kubectl apply -f -), instead of serving");
  std::vector<CLI::Option*> manifest_opts = {
      serve_cmd->add_option("--replicas", manifests.replicas,
                            "Manifests: the number of server pods (default 2)")
          ->check(CLI::Range(1, 1000)),
      serve_cmd->add_option("--image", manifests.image,
                            "Manifests: the image holding shoal and its TorchScript runtime "
                            "(tools/kubernetes/agent_image.py --serve; default "
                            "localhost/shoal-serve:latest)"),
      serve_cmd->add_option("--image-pull-policy", manifests.image_pull_policy,
                            "Manifests: Always, IfNotPresent (default) or Never"),
      serve_cmd->add_option("--model-repository-volume", manifests.model_repository_volume,
                            "Manifests: hostpath:/DIR or pvc:CLAIM, mounted read-only at /models"),
      serve_cmd->add_option("--name", manifests.name,
                            "Manifests: the Deployment's and Service's name (default shoal-serve)"),
      serve_cmd->add_option("--namespace", manifests.ns,
                            "Manifests: their namespace (default: none, kubectl's)"),
      serve_cmd->add_option("--token-secret", manifests.token_secret,
                            "Manifests: an existing Secret whose key 'token' callers must send "
                            "(default: a Secret NAME-token with a random token is printed)"),
      serve_cmd->add_option("--cpu", manifests.cpu,
                            "Manifests: each pod's CPU request and limit (default 1)"),
      serve_cmd->add_option("--memory", manifests.memory,
                            "Manifests: each pod's memory request and limit (default 1Gi)"),
  };

  shoal::ui::UiOptions ui;
  auto* ui_cmd = app.add_subcommand(
      "ui", "Serve the web dashboard of the jobs directory (and of shoal serve instances)");
  ui_cmd->add_option("--listen", ui.listen,
                     "HOST:PORT to serve on (default 127.0.0.1:8470; any other host needs a token)");
  ui_cmd->add_option("--serve", ui.serve_urls,
                     "URL of a shoal serve for the models page (repeatable)");
  ui_cmd->add_option("--token-file", ui.token_file,
                     "File with the token callers must present (required off loopback; default "
                     "$SHOAL_UI_TOKEN_FILE)");

  std::string master_job_dir;
  bool master_recover = false;
  auto* master_cmd = app.add_subcommand("master", "Internal: the per-job master (started by run)");
  master_cmd->add_option("--job-dir", master_job_dir, "The job directory")->required();
  int master_ready_fd = -1;
  master_cmd->add_option("--ready-fd", master_ready_fd,
                         "Internal: a pipe to write one byte to once the master listens");
  master_cmd->add_flag("--recover", master_recover,
                       "Take over a job whose master died, from its events journal");

  shoal::cli::AgentFlags agent;
  uint32_t agent_fake_gpus = 0;
  auto* agent_cmd = app.add_subcommand("agent", "Internal: a node agent (started by a backend)");
  agent_cmd->add_option("--master", agent.master, "host:port of the job's master")->required();
  agent_cmd->add_option("--node", agent.node, "The placement node this agent serves");
  agent_cmd->add_option("--work-dir", agent.work_dir, "Where the agent keeps task files");
  agent_cmd->add_option("--ports", agent.ports, "How many free ports to report");
  agent_cmd->add_option("--task-ports", agent.task_ports,
                        "LOW-HIGH: where those ports come from (SHOAL_TASK_PORTS wins)");
  agent_cmd->add_option("--master-grace-ms", agent.master_grace_ms,
                        "Kill every task after the master is unreachable this long");
  agent_cmd->add_option("--heartbeat-interval-ms", agent.heartbeat_interval_ms,
                        "How often to heartbeat (0: the default, 1000)");
  agent_cmd->add_option("--watchdog-ms", agent.watchdog_ms,
                        "Kill the agent and its tasks when it sends no heartbeat this long (0: never)");
  agent_cmd->add_option("--log-flush-ms", agent.log_flush_ms,
                        "Send task output to the master in batches at most this old (0: every read)");
  agent_cmd->add_option("--slurm-place", agent.slurm_place,
                        "ROLE:RANK,...: serve the place of Slurm task SLURM_PROCID with the GPUs Slurm bound");
  agent_cmd->add_flag("--gpus-from-env", agent.gpus_from_env,
                      "The GPUs are those in CUDA_VISIBLE_DEVICES, as the resource manager set it");
  agent_cmd->add_flag("--in-container", agent.in_container,
                      "The agent's container (a Kubernetes pod) bounds its tasks' memory and "
                      "processes; no cgroup of Shoal's own is needed");
  auto* agent_fake = agent_cmd->add_option("--fake-gpus", agent_fake_gpus, "Declare N fake GPUs");
  bool no_task_output = false;
  agent_cmd->add_flag("--no-task-output", no_task_output,
                      "Keep no copy of task output (the master's job directory is on this machine)");

  shoal::cli::AgentDaemonSetFlags daemonset;
  std::string install_from, install_to;
  auto* kubernetes_cmd =
      app.add_subcommand("kubernetes", "Set a Kubernetes cluster up for Shoal's jobs");
  kubernetes_cmd->require_subcommand(1);
  auto* daemonset_cmd = kubernetes_cmd->add_subcommand(
      "agent-daemonset",
      "Print a DaemonSet that installs Shoal's agent on every node, for --agent-host-path "
      "(shoal kubernetes agent-daemonset | kubectl apply -f -)");
  daemonset_cmd->add_option("--agent-image", daemonset.agent_image,
                            "The image the agent comes from (default " +
                                std::string(shoal::backends::kDefaultAgentImage) + ")");
  daemonset_cmd->add_option("--agent-host-path", daemonset.agent_host_path,
                            "Where on each node the agent goes (default " +
                                std::string(shoal::backends::kDefaultAgentHostPath) + ")");
  daemonset_cmd->add_option("--pause-image", daemonset.pause_image,
                            "The image of the container that holds the pod once the agent is "
                            "installed (default " +
                                std::string(shoal::backends::kDefaultPauseImage) + ")");
  daemonset_cmd->add_option("--namespace", daemonset.ns,
                            "The DaemonSet's namespace (default: kubectl's)");
  auto* install_cmd = kubernetes_cmd->add_subcommand(
      "agent-install", "Internal: the agent DaemonSet's init container (atomic copy FROM to TO)");
  install_cmd->add_option("--from", install_from, "The agent directory to copy")->required();
  install_cmd->add_option("--to", install_to, "Where it goes")->required();

  // Listed for --help; main() runs them before parsing (above) when called the way the master
  // calls them.
  auto* mpi_launcher_cmd = app.add_subcommand(
      "mpi-launcher", "Internal: an MPI job's launcher task (mpi-launcher -- PROGRAM...)");
  mpi_launcher_cmd->allow_extras();
  auto* mpi_worker_cmd =
      app.add_subcommand("mpi-worker", "Internal: an MPI job's worker task, hosting its ranks");
  mpi_worker_cmd->allow_extras();
  app.add_subcommand("mpi-rsh", "Internal: Open MPI's remote shell into a worker task (mpi-rsh HOST COMMAND...)")
      ->allow_extras();

  // CLI11 reads an unknown command as a stray argument and says only that a subcommand is
  // required: name the word instead.
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--jobs-dir") {
      ++i;
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    auto all = app.get_subcommands([](CLI::App*) { return true; });
    bool known = false;
    for (const CLI::App* sub : all) known = known || sub->check_name(argv[i]);
    if (!known) {
      std::vector<std::string> names;
      for (const CLI::App* sub : all) {
        if (sub->get_description().rfind("Internal", 0) != 0) names.push_back(sub->get_name());
      }
      std::cerr << "shoal: unknown command '" << absl::CHexEscape(std::string(arg)) << "'; the commands are: "
                << absl::StrJoin(names, ", ") << " (shoal --help)\n";
      return kExitUsage;
    }
    break;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  // Signal handling is done by sigwait threads; block before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);  // wakes a sigwait thread when it should stop
  bool daemon = master_cmd->parsed() || agent_cmd->parsed();
  if (daemon) pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Debian's abseil tracks every Mutex acquisition for deadlock cycles (gRPC locks on each
  // message); that bookkeeping was the master's largest single cost under heartbeat load.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  std::string root = shoal::client::ResolveJobsRoot(jobs_dir);
  std::string self = SelfPath(argv[0]);
  if (run_cmd->parsed() || submit_cmd->parsed()) {
    run.jobs_root = root;
    if (submit_cmd->parsed()) run.detach = true;
    // A backend's flags with another backend are refused: they would be silently ignored.
    for (const auto& provider : backends.providers()) {
      std::vector<std::string> flags;
      bool given = false;
      for (const shoal::backends::RunFlag& flag : provider->Flags()) {
        flags.push_back(flag.name);
        if (backend_flags[flag.name].empty()) continue;
        given = true;
        if (provider->Name() == run.backend) {
          run.backend_flags[flag.name] = backend_flags[flag.name];
        }
      }
      if (given && provider->Name() != run.backend) {
        std::string last = flags.back();
        flags.pop_back();
        std::cerr << "shoal: " << (flags.empty() ? "" : absl::StrJoin(flags, ", ") + " and ")
                  << last << (flags.empty() ? " needs" : " need") << " --backend "
                  << provider->Name() << "\n";
        return kExitUsage;
      }
    }
    run.backends = &backends;
    run.shoal_binary = self;
    if (fake_opt->count() > 0) run.fake_gpus = fake_gpus;
    return shoal::client::RunJob(run);
  }
  if (status_cmd->parsed()) return shoal::client::ShowStatus(root, job, json);
  if (list_cmd->parsed()) return shoal::client::ListJobs(root, json);
  if (logs_cmd->parsed()) return shoal::client::ShowLogs(root, job, task, follow);
  if (kill_cmd->parsed()) return shoal::client::KillJob(root, job);
  if (tensorboard_cmd->parsed()) {
    return shoal::client::ServeTensorBoard(root, job, backends.JobSections());
  }
  if (resume_cmd->parsed()) return shoal::client::ResumeJob(root, job, self, resume_quiet);
  if (serve_cmd->parsed()) {
    if (print_manifests) {
      shoal::cli::ServeFlagsGiven given;
      given.host = serve_host_opt->count() > 0;
      given.token_file = serve_token_opt->count() > 0;
      given.model_repository = serve_repository_opt->count() > 0;
      std::vector<std::string> problems =
          shoal::cli::ServeManifestProblems(manifests, serve, given);
      for (const std::string& problem : problems) std::cerr << "shoal serve: " << problem << "\n";
      if (!problems.empty()) return kExitUsage;
      std::cout << shoal::cli::ServeManifests(manifests, serve);
      return 0;
    }
    for (CLI::Option* opt : manifest_opts) {
      if (opt->count() > 0) {
        std::cerr << "shoal serve: " << opt->get_name() << " only shapes --print-manifests' "
                  << "output; give --print-manifests too\n";
        return kExitUsage;
      }
    }
    if (serve.model_repository.empty()) {
      std::cerr << "shoal serve: --model-repository is required\n";
      return kExitUsage;
    }
    return shoal::serve::RunServer(serve);
  }
  if (ui_cmd->parsed()) {
    ui.jobs_root = root;
    ui.shoal_binary = self;
    return shoal::ui::RunUi(ui);
  }
  if (daemonset_cmd->parsed()) return shoal::cli::PrintAgentDaemonSet(daemonset);
  if (install_cmd->parsed()) return shoal::cli::RunAgentInstall(install_from, install_to);
  if (master_cmd->parsed()) return shoal::cli::RunMasterDaemon(master_job_dir, self, master_recover,
                                                           master_ready_fd);
  if (mpi_launcher_cmd->parsed() || mpi_worker_cmd->parsed()) {
    std::cerr << "shoal: usage: shoal mpi-launcher -- PROGRAM [ARGS...] | shoal mpi-worker; "
                 "both only run as the tasks of a framework: mpi job (docs/frameworks.md)\n";
    return kExitUsage;
  }
  if (agent_cmd->parsed()) {
    if (agent_fake->count() > 0) agent.fake_gpus = agent_fake_gpus;
    agent.keep_task_output = !no_task_output;
    agent.shoal_binary = self;
    return shoal::cli::RunAgentDaemon(agent);
  }
  return kExitUsage;
}

}  // namespace
