#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string_view>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backends/backend_registry.h"
#include "client/commands.h"
#include "master/parquet_dataset.h"
#include "master/tensorboard_sidecar.h"
#include "client/job_directory.h"
#include "client/master_client.h"
#include "client/status_render.h"
#include "common/files.h"
#include "common/port_range.h"
#include "process/exec_plan.h"
#include "process/process.h"
#include "process/process_launcher.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "nlohmann/json.hpp"
#include "spec/spec_parser.h"

namespace shoal::client {
namespace {

using Ms = std::chrono::milliseconds;

// Prints task output and the one-line live status without the two tearing each other.
class Console {
 public:
  explicit Console(bool quiet) : live_(!quiet && ::isatty(STDERR_FILENO)), quiet_(quiet) {}

  // Blocks while stdout does (a pager, a slow pipe): that is what slows the stream down.
  // False once stdout is closed (`| head`, a pager that quit): nothing more can be shown.
  bool Output(std::string_view lines) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stdout_closed_) return false;
    ClearStatus();
    errno = 0;
    std::fwrite(lines.data(), 1, lines.size(), stdout);
    if (std::fflush(stdout) != 0 && errno == EPIPE) stdout_closed_ = true;
    DrawStatus();
    return !stdout_closed_;
  }
  void Status(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (line == status_) return;
    status_ = line;
    if (live_) {
      ClearStatus();
      DrawStatus();
    } else if (!quiet_) {
      std::fprintf(stderr, "shoal | %s\n", line.c_str());
    }
  }
  void Message(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    ClearStatus();
    std::fprintf(stderr, "shoal | %s\n", line.c_str());
    DrawStatus();
  }
  // For the signal thread, which must not wait while output is blocked on a stalled stdout:
  // then the message goes to stderr without touching the live line.
  void MessageNow(const std::string& line) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock()) ClearStatus();
    std::fprintf(stderr, "shoal | %s\n", line.c_str());
    if (lock.owns_lock()) DrawStatus();
  }
  // Redraws the live line if nothing else is writing (the signal thread keeps its clock going).
  void TryStatus(const std::string& line) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || !live_ || line == status_) return;
    status_ = line;
    ClearStatus();
    DrawStatus();
  }
  bool live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    ClearStatus();
    live_ = false;
  }

 private:
  void ClearStatus() {
    if (live_ && drawn_) std::fputs("\r\033[K", stderr);
    drawn_ = false;
  }
  void DrawStatus() {
    if (!live_ || status_.empty()) return;
    std::fprintf(stderr, "%s", status_.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  std::mutex mu_;
  bool live_;
  bool quiet_;
  bool stdout_closed_ = false;
  bool drawn_ = false;
  std::string status_;
};

// Starts `shoal master` in a session of its own. `ready_fd` (the write end of a pipe) becomes
// the master's fd 3: it writes one byte there once it listens, and a master that exits before
// that closes it unwritten.
absl::Status StartMaster(const std::string& shoal_binary, const std::string& job_dir, bool recover,
                         int ready_fd, pid_t* pid) {
  std::string log = job_dir + "/master.log";
  process::ProcessSpec spec;
  spec.key = "master";
  spec.argv = {shoal_binary, "master", "--job-dir", job_dir, "--ready-fd", "3"};
  if (recover) spec.argv.push_back("--recover");
  spec.env = InheritedEnvironment({});
  auto plan = process::ExecPlan::Build(spec);
  if (!plan.ok()) return plan.status();
  UniqueFd log_fd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!log_fd.valid()) return ErrnoStatus("start the master: open " + log, errno);
  process::ChildSetup setup;  // stdin: /dev/null
  setup.stdout_fd = setup.stderr_fd = log_fd.get();
  setup.extra_fds[3] = ready_fd;
  // A session of its own: the master outlives this client and never gets the terminal's
  // Ctrl-C; the client decides what an interrupt means. Signals blocked here are unblocked.
  setup.grouping = process::Grouping::kNewSession;
  // The client ignores SIGPIPE (it notices a closed stdout by EPIPE); the master must not
  // inherit that.
  setup.default_signals = std::vector<int>{SIGPIPE};
  setup.die_with_parent = false;
  auto child = process::SystemLauncher().Launch(*plan, setup);
  if (!child.ok()) {
    return absl::Status(child.status().code(),
                        absl::StrCat("start the master ", shoal_binary, ": ",
                                     child.status().message()));
  }
  *pid = child->pid;
  return absl::OkStatus();
}

std::string TailOf(const std::string& path, size_t max_bytes) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  return text->size() > max_bytes ? text->substr(text->size() - max_bytes) : *text;
}

// Starts the master and waits until it listens (its address is in master.json by then); fails
// if it exits first. Woken by the master itself through a pipe, not by polling the directory.
absl::StatusOr<pid_t> StartMasterAndWait(const std::string& shoal_binary,
                                         const std::string& job_dir, bool recover, Ms timeout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
  UniqueFd ready(fds[0]), writer(fds[1]);
  if (writer.get() <= 3) {  // dup2 onto fd 3 must not be a no-op that keeps CLOEXEC
    writer.Reset(::fcntl(fds[1], F_DUPFD_CLOEXEC, 4));
    if (!writer.valid()) return ErrnoStatus("dup", errno);
  }
  pid_t pid = -1;
  absl::Status started = StartMaster(shoal_binary, job_dir, recover, writer.get(), &pid);
  writer.Reset();  // from now on only the master holds it
  SHOAL_RETURN_IF_ERROR(started);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("the master did not start within ", timeout.count() / 1000, "s; see ",
                       job_dir, "/master.log"));
    }
    pollfd p{ready.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoStatus("wait for the master", errno);
    if (rc == 0) continue;  // the deadline check above reports it
    char byte;
    ssize_t n = ::read(ready.get(), &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n == 1) return pid;
    // Closed unwritten: the master exited before it listened. Reap it if it is gone already.
    int status = 0;
    ::waitpid(pid, &status, WNOHANG);
    return absl::InternalError(absl::StrCat("the master exited before it was ready:\n",
                                            TailOf(job_dir + "/master.log", 2000)));
  }
}

}  // namespace

int FollowJob(const std::string& shoal_binary, const std::string& job_dir,
              const std::string& job_id, uint32_t total_tasks, bool quiet,
              const sigset_t& signals, uint64_t log_offset);

int RunJob(const RunOptions& options) {
  // Read once: these bytes are validated here and stored as the job's spec.yaml, which is what
  // the master runs. A second read could see a file edited meanwhile, or an emptied pipe.
  auto job_file = spec::ReadJobFile(options.job_file, options.backends->JobSections());
  if (!job_file.ok()) {
    std::cerr << "shoal: invalid job file:\n" << job_file.status().message() << "\n";
    return kExitUsage;
  }
  const spec::JobSpec& job = job_file->spec;
  if (job.tensorboard.configured) {
    if (auto command = master::ResolveTensorBoardCommand(job.tensorboard); !command.ok()) {
      std::cerr << "shoal: invalid job file:\n"
                << options.job_file << ": " << command.status().message() << "\n";
      return kExitUsage;
    }
  }
  // Listed once, here, so that an empty or missing dataset is refused before anything starts
  // and every master of the job (a recovering one too) hands out the same shards.
  std::vector<std::string> dataset_files;
  if (!job.dataset.parquet.empty()) {
    const char* webhdfs = std::getenv("SHOAL_WEBHDFS");
    auto files = master::ListParquetDataset(job.dataset.parquet, webhdfs ? webhdfs : "");
    if (!files.ok()) {
      std::cerr << "shoal: invalid job file:\n"
                << options.job_file << ":" << job.dataset.parquet_line
                << ": dataset.parquet: " << files.status().message() << "\n";
      return kExitUsage;
    }
    dataset_files = std::move(*files);
  }
  // Read by every agent of the job (the backends pass this environment on): refused here,
  // before anything starts, rather than half-honoured on some machines.
  std::optional<PortRange> task_ports;
  if (const char* ports = std::getenv("SHOAL_TASK_PORTS"); ports != nullptr && *ports != '\0') {
    auto range = ParsePortRange(ports);
    if (!range.ok()) {
      std::cerr << "shoal: SHOAL_TASK_PORTS='" << ports << "': " << range.status().message()
                << "\n";
      return kExitUsage;
    }
    task_ports = *range;
  }
  // The backend's own checks, before anything exists: its flags, whether the job can ever
  // run there, whether its cluster answers. What they settle is recorded in submit.json.
  const backends::BackendProvider* backend = options.backends->Find(options.backend);
  if (backend == nullptr) {
    std::cerr << "shoal: unknown backend '" << options.backend << "'; use "
              << options.backends->NamesForMessages() << "\n";
    return kExitUsage;
  }
  backends::PreflightRequest preflight_request;
  preflight_request.job = &job;
  preflight_request.flags = options.backend_flags;
  preflight_request.listen_host = options.listen_host;
  preflight_request.fake_gpus = options.fake_gpus;
  preflight_request.task_ports = task_ports;
  absl::StatusOr<backends::Preflight> preflight = backend->Check(preflight_request);
  if (!preflight.ok()) {
    std::cerr << "shoal: " << preflight.status().message() << "\n";
    return kExitUsage;
  }
  auto token = NewToken();
  if (!token.ok()) {
    std::cerr << "shoal: " << token.status().message() << "\n";
    return kExitJobFailed;
  }
  std::string job_id = NewJobId(job.name);
  std::string job_dir = absl::StrCat(options.jobs_root, "/", job_id);
  nlohmann::json submit = {
      {"job_id", job_id},
      {"source_path", std::filesystem::absolute(options.job_file).string()},
      {"base_dir", std::filesystem::absolute(options.job_file).parent_path().string()},
      {"jobs_root", options.jobs_root},
      {"listen_host", preflight->listen_host},
      {"backend", options.backend},
  };
  if (!preflight->settings.empty()) submit[options.backend] = preflight->settings;
  if (options.fake_gpus) submit["fake_gpus"] = *options.fake_gpus;
  if (!job.dataset.parquet.empty()) submit["dataset_files"] = dataset_files;
  absl::Status st = MakeDirs(job_dir);
  if (st.ok()) st = WriteFileAtomically(job_dir + "/spec.yaml", job_file->text);
  if (st.ok()) st = WriteFileAtomically(job_dir + "/token", *token + "\n", 0600);
  if (st.ok()) st = WriteFileAtomically(job_dir + "/submit.json", submit.dump(2));
  if (!st.ok()) {
    std::cerr << "shoal: cannot create the job directory: " << st.message() << "\n";
    return kExitJobFailed;
  }

  // Signals are taken by a dedicated thread (sigwait), so block them before any thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);  // only used to wake the signal thread when following ends
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto master_pid = StartMasterAndWait(options.shoal_binary, job_dir, /*recover=*/false, Ms(15000));
  if (!master_pid.ok()) {
    std::cerr << "shoal: " << master_pid.status().message() << "\n";
    return kExitJobFailed;
  }
  if (options.detach) {
    std::cout << job_id << "\n";
    return kExitOk;
  }
  return FollowJob(options.shoal_binary, job_dir, job_id, job.TotalTasks(), options.quiet,
                   signals, /*log_offset=*/0);
}

namespace {

pid_t MasterPid(const std::string& job_dir) {
  auto text = ReadFile(job_dir + "/master.json");
  if (!text.ok()) return -1;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  return j.is_object() ? j.value("pid", -1) : -1;
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Where `shoal resume` starts the output: the last 64 KiB of logs.txt, from a line's start.
uint64_t RecentOutputOffset(const std::string& path) {
  constexpr uint64_t kRecent = 64 * 1024;
  uint64_t size = FileSize(path);
  if (size <= kRecent) return 0;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return 0;
  std::string tail(kRecent, '\0');
  ssize_t n = ::pread(fd.get(), tail.data(), tail.size(), static_cast<off_t>(size - kRecent));
  if (n <= 0) return 0;
  size_t nl = std::string_view(tail.data(), static_cast<size_t>(n)).find('\n');
  return nl == std::string::npos ? size : size - kRecent + nl + 1;
}

// Prints logs.txt from `*offset` to its end through `print` (as the master would have sent
// it), unless `stop` is set meanwhile.
void CatchUpFromLogFile(const std::string& job_dir, uint64_t* offset,
                        const std::atomic<bool>& stop,
                        const std::function<void(uint64_t, const std::string&)>& print) {
  std::string path = job_dir + "/logs.txt";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return;  // said by the caller: bytes not shown
  std::string chunk;
  while (!stop) {
    chunk.resize(1 << 20);
    ssize_t n = ::pread(fd.get(), chunk.data(), chunk.size(), static_cast<off_t>(*offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    chunk.resize(static_cast<size_t>(n));
    print(*offset, chunk);
  }
}

// Starts a master that takes the job over from its journal. Returns its pid.
absl::StatusOr<pid_t> StartRecoveringMaster(const std::string& shoal_binary,
                                            const std::string& job_dir) {
  // The new master publishes master.json when it listens; the stale one must not stay behind
  // for the clients that read it meanwhile.
  std::error_code ec;
  std::filesystem::remove(job_dir + "/master.json", ec);
  return StartMasterAndWait(shoal_binary, job_dir, /*recover=*/true, Ms(15000));
}

}  // namespace

int FollowJob(const std::string& shoal_binary, const std::string& job_dir,
              const std::string& job_id, uint32_t total_tasks, bool quiet,
              const sigset_t& signals, uint64_t log_offset) {
  auto connected = MasterClient::Connect(job_dir);
  if (!connected.ok()) {
    std::cerr << "shoal: " << connected.status().message() << "\n";
    return kExitJobFailed;
  }
  // Replaced when a new master takes over; the signal thread uses it too.
  std::mutex client_mu;
  std::shared_ptr<MasterClient> client = std::move(*connected);
  auto current_client = [&] {
    std::lock_guard<std::mutex> lock(client_mu);
    return client;
  };
  // A closed stdout (`| head`, a pager that quit) is seen as EPIPE, and the client detaches
  // and says so, rather than die of SIGPIPE without a word.
  ::signal(SIGPIPE, SIG_IGN);
  Console console(quiet);
  console.Message(absl::StrCat("job ", job_id, " (", total_tasks, " tasks) in ", job_dir));
  if (log_offset > 0) {
    console.Message(absl::StrCat("earlier output is not repeated here; `shoal logs ", job_id,
                                 "` has every line"));
  }

  std::atomic<bool> done{false}, interrupted{false}, hung_up{false};
  std::mutex status_mu;
  nlohmann::json last_status;
  std::string last_queue_reason;
  auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  std::thread signal_thread([&] {
    timespec tick{0, 100'000'000};
    auto kill_sent_at = std::chrono::steady_clock::time_point{};
    while (!done) {
      int sig = ::sigtimedwait(&signals, nullptr, &tick);
      if (sig == SIGUSR1) continue;
      if (sig == SIGHUP) {
        // The terminal went away (a closed ssh session): the job goes on without this client,
        // as with --detach. Stopping a long training run because a connection dropped would
        // lose hours; `shoal kill` stops it on purpose.
        hung_up = true;
        current_client()->Cancel();
        continue;
      }
      if (sig > 0 && !interrupted.exchange(true)) {
        // Asked before anything is printed: printing may wait on a stalled stdout.
        auto kst = current_client()->Kill(absl::StrCat("interrupted by ", sigabbrev_np(sig) ? "SIG" : "",
                                                sigabbrev_np(sig) ? sigabbrev_np(sig) : "signal"));
        kill_sent_at = std::chrono::steady_clock::now();
        console.MessageNow(absl::StrCat("interrupted: stopping every task of ", job_id));
        if (!kst.ok()) console.MessageNow(std::string(kst.message()));
      } else if (sig > 0) {
        console.MessageNow("still stopping; the master kills what is left within a few seconds");
      }
      // Should the master never confirm, stop following rather than hang the terminal.
      if (interrupted && std::chrono::steady_clock::now() - kill_sent_at > Ms(10000)) {
        current_client()->Cancel();
      }
      // Keep the live line's clock moving while nothing changes.
      std::lock_guard<std::mutex> lock(status_mu);
      if (!last_status.is_null() && console.live()) {
        console.TryStatus(StatusLine(last_status, elapsed()));
      }
    }
  });

  // The next byte of the job's logs.txt to print. The master sends output from where this
  // client asks, at the pace this client prints it; after a new master takes over, it goes on
  // from here, so no line is lost or printed twice.
  uint64_t next_offset = log_offset;
  std::atomic<bool> output_closed{false};
  auto print_output = [&](uint64_t offset, const std::string& lines) {
    if (offset + lines.size() <= next_offset) return;  // printed before a reconnection
    if (offset > next_offset) {
      console.Message(absl::StrCat("bytes ", next_offset, "-", offset,
                                   " of the job's output were not received; `shoal logs ", job_id,
                                   "` has every line"));
    }
    size_t skip = offset < next_offset ? static_cast<size_t>(next_offset - offset) : 0;
    if (!console.Output(std::string_view(lines).substr(skip)) && !output_closed.exchange(true)) {
      current_client()->Cancel();  // nobody reads the output any more: stop following
    }
    next_offset = offset + lines.size();
  };

  absl::Status watch;
  int recoveries = 0;
  while (true) {
    watch = current_client()->Watch(
        /*logs=*/true, next_offset,
        [&](const nlohmann::json& status) {
          std::lock_guard<std::mutex> lock(status_mu);
          last_status = status;
          console.Status(StatusLine(status, elapsed()));
          // Why the job waits is worth a line even with --quiet: it may wait for long.
          std::string state = status.value("state", "");
          std::string reason = state == "queued" ? status.value("reason", "") : "";
          if (quiet && !reason.empty() && reason != last_queue_reason) {
            console.Message(absl::StrCat("queued: ", reason));
          }
          last_queue_reason = reason;
        },
        print_output, [&](const std::string& notice) { console.Message(notice); });
    std::string state;
    {
      std::lock_guard<std::mutex> lock(status_mu);
      state = last_status.value("state", "");
    }
    bool finished = state == "succeeded" || state == "failed" || state == "killed";
    if (finished || interrupted || hung_up || output_closed) break;
    // The stream ended before the job did. A master that died is replaced by one that rebuilds
    // the job from its journal; the agents keep the tasks running meanwhile.
    pid_t pid = MasterPid(job_dir);
    for (int i = 0; i < 50 && pid > 0 && ProcessRunning(pid); ++i) {
      std::this_thread::sleep_for(Ms(20));  // a master that is exiting normally gets a moment
    }
    if (pid > 0 && ProcessRunning(pid)) break;
    if (auto file = ReadStatusFile(job_dir)) {
      std::string s2 = file->value("state", "");
      if (s2 == "succeeded" || s2 == "failed" || s2 == "killed") break;
    }
    if (++recoveries > 3) {
      console.Message("the master died again; giving up (shoal resume tries once more)");
      break;
    }
    int status = 0;
    if (pid > 0) ::waitpid(pid, &status, WNOHANG);  // reap it if it was ours
    console.Message(absl::StrCat("the master of ", job_id,
                                 " died; starting a new one from the job's journal"));
    auto new_pid = StartRecoveringMaster(shoal_binary, job_dir);
    if (!new_pid.ok()) {
      console.Message(std::string(new_pid.status().message()));
      break;
    }
    auto reconnected = MasterClient::Connect(job_dir);
    if (!reconnected.ok()) {
      console.Message(std::string(reconnected.status().message()));
      break;
    }
    std::lock_guard<std::mutex> lock(client_mu);
    client = std::move(*reconnected);
  }
  if (hung_up || output_closed) {
    done = true;
    ::pthread_kill(signal_thread.native_handle(), SIGUSR1);
    signal_thread.join();
    console.Done();
    // The terminal may be gone; said anyway for a client whose stderr goes to a file.
    std::cerr << "shoal | " << (hung_up ? "hung up" : "the output was closed")
              << ": detached from job " << job_id << ", which keeps running (shoal status "
              << job_id << ", shoal logs " << job_id << ", shoal kill " << job_id << ")\n";
    return hung_up ? kExitHangup : kExitOutputClosed;
  }
  // A master that ended (or died) before this client took all of the output: the rest is in
  // logs.txt, which this client reads itself.
  if (!interrupted) CatchUpFromLogFile(job_dir, &next_offset, interrupted, print_output);
  done = true;
  ::pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  KeepUntilExit(std::move(client));  // `shoal run` ends the moment the outcome is printed
  console.Done();
  if (uint64_t size = FileSize(job_dir + "/logs.txt"); size > next_offset) {
    std::cerr << "shoal | " << size - next_offset << " bytes of the job's output were not shown; `shoal logs "
              << job_id << "` has every line\n";
  }

  std::string state = last_status.value("state", "");
  bool terminal = state == "succeeded" || state == "failed" || state == "killed";
  if (!terminal) {
    if (auto file = ReadStatusFile(job_dir)) {
      last_status = *file;
      state = last_status.value("state", "");
      terminal = state == "succeeded" || state == "failed" || state == "killed";
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!terminal) {
    std::cerr << "shoal | lost the master of job " << job_id << " (" << watch.message()
              << "); see " << job_dir << "/master.log\n";
    return interrupted ? kExitInterrupted : kExitJobFailed;
  }
  std::cerr << "shoal | " << OutcomeLine(last_status, secs) << "\n";
  if (state == "succeeded") return kExitOk;
  if (interrupted) return kExitInterrupted;
  return kExitJobFailed;
}

int ResumeJob(const std::string& jobs_root, const std::string& job, const std::string& shoal_binary,
              bool quiet) {
  auto job_dir = FindJob(jobs_root, job);
  if (!job_dir.ok()) {
    std::cerr << "shoal: " << job_dir.status().message() << "\n";
    return kExitUsage;
  }
  std::string job_id = std::filesystem::path(*job_dir).filename().string();
  if (auto file = ReadStatusFile(*job_dir)) {
    std::string state = file->value("state", "");
    if (state == "succeeded" || state == "failed" || state == "killed") {
      std::cerr << "shoal: job " << job_id << " has already ended (" << state
                << "); nothing to resume\n";
      return state == "succeeded" ? kExitOk : kExitJobFailed;
    }
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  pid_t pid = MasterPid(*job_dir);
  if (pid > 0 && ProcessRunning(pid)) {
    std::cerr << "shoal | the master of " << job_id << " is alive; following it\n";
  } else {
    std::cerr << "shoal | starting a new master for " << job_id << " from its journal\n";
    auto started = StartRecoveringMaster(shoal_binary, *job_dir);
    if (!started.ok()) {
      std::cerr << "shoal: " << started.status().message() << "\n";
      return kExitJobFailed;
    }
  }
  uint32_t tasks = 0;
  if (auto file = ReadStatusFile(*job_dir)) tasks = file->value("tasks", nlohmann::json::array()).size();
  return FollowJob(shoal_binary, *job_dir, job_id, tasks, quiet, signals,
                   RecentOutputOffset(*job_dir + "/logs.txt"));
}

}  // namespace shoal::client
