#include "master/tensorboard_sidecar.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "process/exec_plan.h"
#include "process/process_launcher.h"
#include "common/files.h"
#include "process/process.h"

namespace shoal::master {

namespace {
constexpr char kSetupTensorBoard[] = "/var/cache/shoal/venvs/tensorboard/bin/tensorboard";

bool Executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

bool OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (!dir.empty() && Executable(dir + "/" + name)) return true;
    start = end + 1;
  }
  return false;
}
}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveTensorBoardCommand(
    const spec::TensorBoardConfig& config) {
  if (!config.command.empty()) {
    const std::string& program = config.command.front();
    bool found = program.find('/') != std::string::npos ? Executable(program) : OnPath(program);
    if (!found) {
      return absl::NotFoundError(absl::StrCat("tensorboard.command: '", program,
                                              "' is not an executable program"));
    }
    return config.command;
  }
  if (Executable(kSetupTensorBoard)) return std::vector<std::string>{kSetupTensorBoard};
  if (OnPath("tensorboard")) return std::vector<std::string>{"tensorboard"};
  return absl::NotFoundError(absl::StrCat(
      "tensorboard: no TensorBoard at ", kSetupTensorBoard,
      " nor on PATH; run ./setup.sh (it installs one) or give tensorboard.command"));
}

std::string TensorBoardLogdir(const spec::TensorBoardConfig& config, const std::string& job_dir) {
  return config.logdir.empty() ? job_dir + "/tensorboard" : config.logdir;
}

absl::StatusOr<std::unique_ptr<TensorBoardSidecar>> TensorBoardSidecar::Start(
    const std::vector<std::string>& command, const std::string& logdir,
    const std::string& log_path, std::function<void(const std::string&)> on_url,
    std::function<void(const std::string&)> on_failure) {
  if (auto st = MakeDirs(logdir); !st.ok()) return st;
  process::ProcessSpec spec;
  spec.key = "tensorboard";
  spec.argv = command;
  // Loopback: TensorBoard serves every file under logdir to whoever connects, unauthenticated.
  for (const char* arg : {"--logdir", logdir.c_str(), "--host", "127.0.0.1", "--port", "0"}) {
    spec.argv.emplace_back(arg);
  }
  spec.env = InheritedEnvironment({"SHOAL_AGENT_TOKEN"});
  auto plan = process::ExecPlan::Build(spec);
  if (!plan.ok()) return plan.status();
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  }
  int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  process::ChildSetup setup;
  setup.stdin_fd = dev_null;
  setup.stdout_fd = setup.stderr_fd = log;
  auto child = process::SystemLauncher().Launch(*plan, setup);
  ::close(log);
  if (dev_null >= 0) ::close(dev_null);
  if (!child.ok()) return child.status();
  std::unique_ptr<TensorBoardSidecar> sidecar(new TensorBoardSidecar());
  sidecar->pid_ = child->pid;
  int pidfd = child->exit_fd.Release();
  sidecar->watcher_ = std::thread([s = sidecar.get(), pidfd, log_path, on_url, on_failure] {
    s->Watch(pidfd, log_path, on_url, on_failure);
  });
  return sidecar;
}

void TensorBoardSidecar::Watch(int pidfd, std::string log_path,
                               std::function<void(const std::string&)> on_url,
                               std::function<void(const std::string&)> on_failure) {
  // "TensorBoard 2.21.0 at http://127.0.0.1:42377/ (Press CTRL+C to quit)"
  static const std::regex serving(R"(TensorBoard \S+ at (http://\S+))");
  bool announced = false;
  for (;;) {
    pollfd p{pidfd, POLLIN, 0};
    int ready = ::poll(&p, 1, 100);
    if (!announced) {
      auto text = ReadFile(log_path);
      std::smatch m;
      if (text.ok() && std::regex_search(*text, m, serving)) {
        announced = true;
        on_url(m[1].str());
      }
    }
    if (ready > 0) break;
  }
  ::close(pidfd);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  if (!announced) {
    auto text = ReadFile(log_path);
    std::string tail = text.ok() ? text->substr(text->size() > 300 ? text->size() - 300 : 0) : "";
    on_failure(absl::StrCat("TensorBoard exited before serving (see ", log_path, "): ", tail));
  }
}

TensorBoardSidecar::~TensorBoardSidecar() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    // The watcher reaps it; SIGKILL if TensorBoard does not stop within 2 s.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline && ProcessRunning(pid_)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (ProcessRunning(pid_)) ::kill(pid_, SIGKILL);
  }
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace shoal::master
