#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/job_directory.h"
#include "client/master_client.h"
#include "client/status_render.h"
#include "common/files.h"
#include "spec/inventory.h"
#include "spec/spec_parser.h"

extern char** environ;

namespace shoal::client {
namespace {

using Ms = std::chrono::milliseconds;

// Prints task output and the one-line live status without the two tearing each other.
class Console {
 public:
  explicit Console(bool quiet) : live_(!quiet && ::isatty(STDERR_FILENO)), quiet_(quiet) {}

  void Output(const std::string& lines) {
    std::lock_guard<std::mutex> lock(mu_);
    ClearStatus();
    std::fwrite(lines.data(), 1, lines.size(), stdout);
    std::fflush(stdout);
    DrawStatus();
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
  bool drawn_ = false;
  std::string status_;
};

absl::Status StartMaster(const RunOptions& options, const std::string& job_dir, pid_t* pid) {
  std::string log = job_dir + "/master.log";
  std::vector<std::string> args = {options.shoal_binary, "master", "--job-dir", job_dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A session of its own: the master outlives this client and never gets the terminal's
  // Ctrl-C; the client decides what an interrupt means. Signals blocked here are unblocked.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  int rc = ::posix_spawn(pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoStatus("start the master " + options.shoal_binary, rc);
  return absl::OkStatus();
}

std::string TailOf(const std::string& path, size_t max_bytes) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  return text->size() > max_bytes ? text->substr(text->size() - max_bytes) : *text;
}

// Waits for the master to publish its address; fails if it exits first.
absl::Status WaitForMaster(const std::string& job_dir, pid_t pid, Ms timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(job_dir + "/master.json")) return absl::OkStatus();
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return absl::InternalError(absl::StrCat("the master exited before it was ready:\n",
                                              TailOf(job_dir + "/master.log", 2000)));
    }
    std::this_thread::sleep_for(Ms(1));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the master did not start within ", timeout.count() / 1000, "s; see ",
                   job_dir, "/master.log"));
}

}  // namespace

int RunJob(const RunOptions& options) {
  auto spec = spec::ParseJobSpecFile(options.job_file);
  if (!spec.ok()) {
    std::cerr << "shoal: invalid job file:\n" << spec.status().message() << "\n";
    return kExitUsage;
  }
  spec::InventoryOptions inv_options;
  inv_options.fake_gpus = options.fake_gpus;
  spec::MachineInventory machine = spec::DetectLocalInventory(inv_options);
  if (auto st = spec::CheckFitsMachine(*spec, machine); !st.ok()) {
    std::cerr << "shoal: the job can never run on this machine:\n" << st.message() << "\n";
    return kExitUsage;
  }
  auto text = ReadFile(options.job_file);
  auto token = NewToken();
  if (!text.ok() || !token.ok()) {
    std::cerr << "shoal: " << (text.ok() ? token.status() : text.status()).message() << "\n";
    return kExitJobFailed;
  }
  std::string job_id = NewJobId(spec->name);
  std::string job_dir = absl::StrCat(options.jobs_root, "/", job_id);
  nlohmann::json submit = {
      {"job_id", job_id},
      {"source_path", std::filesystem::absolute(options.job_file).string()},
      {"base_dir", std::filesystem::absolute(options.job_file).parent_path().string()},
      {"jobs_root", options.jobs_root},
      {"listen_host", options.listen_host},
      {"backend", "local"},
  };
  if (options.fake_gpus) submit["fake_gpus"] = *options.fake_gpus;
  absl::Status st = MakeDirs(job_dir);
  if (st.ok()) st = WriteFileAtomically(job_dir + "/spec.yaml", *text);
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
  sigaddset(&signals, SIGUSR1);  // only used to wake the signal thread when following ends
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  pid_t master_pid = -1;
  st = StartMaster(options, job_dir, &master_pid);
  if (st.ok()) st = WaitForMaster(job_dir, master_pid, Ms(15000));
  if (!st.ok()) {
    std::cerr << "shoal: " << st.message() << "\n";
    return kExitJobFailed;
  }
  if (options.detach) {
    std::cout << job_id << "\n";
    return kExitOk;
  }

  auto client = MasterClient::Connect(job_dir);
  if (!client.ok()) {
    std::cerr << "shoal: " << client.status().message() << "\n";
    return kExitJobFailed;
  }
  Console console(options.quiet);
  console.Message(absl::StrCat("job ", job_id, " (", spec->TotalTasks(), " tasks) in ", job_dir));

  std::atomic<bool> done{false}, interrupted{false};
  std::mutex status_mu;
  nlohmann::json last_status;
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
      if (sig > 0 && !interrupted.exchange(true)) {
        console.Message(absl::StrCat("interrupted: stopping every task of ", job_id));
        kill_sent_at = std::chrono::steady_clock::now();
        auto kst = (*client)->Kill(absl::StrCat("interrupted by ", sigabbrev_np(sig) ? "SIG" : "",
                                                sigabbrev_np(sig) ? sigabbrev_np(sig) : "signal"));
        if (!kst.ok()) console.Message(std::string(kst.message()));
      } else if (sig > 0) {
        console.Message("still stopping; the master kills what is left within a few seconds");
      }
      // Should the master never confirm, stop following rather than hang the terminal.
      if (interrupted && std::chrono::steady_clock::now() - kill_sent_at > Ms(10000)) {
        (*client)->Cancel();
      }
      // Keep the live line's clock moving while nothing changes.
      std::lock_guard<std::mutex> lock(status_mu);
      if (!last_status.is_null() && console.live()) {
        console.Status(StatusLine(last_status, elapsed()));
      }
    }
  });

  absl::Status watch = (*client)->Watch(
      /*logs=*/true,
      [&](const nlohmann::json& status) {
        std::lock_guard<std::mutex> lock(status_mu);
        last_status = status;
        console.Status(StatusLine(status, elapsed()));
      },
      [&](const std::string& lines) { console.Output(lines); },
      [&](const std::string& notice) { console.Message(notice); });
  done = true;
  ::pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  console.Done();

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

}  // namespace shoal::client
