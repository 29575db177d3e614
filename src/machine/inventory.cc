#include "machine/inventory.h"

#include <algorithm>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/unique_fd.h"
#include "process/exec_plan.h"
#include "process/process.h"
#include "process/process_launcher.h"
#include "spdlog/spdlog.h"

namespace shoal::machine {
namespace {

// A wedged driver can make nvidia-smi hang; inventory must still come back.
constexpr std::chrono::seconds kGpuQueryTimeout(10);

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return ss.str();
}

std::string DetectHostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::vector<uint32_t> DetectCores() {
  // Start at the common mask size and grow: machines with more than 1024 CPUs exist, and
  // sched_getaffinity fails with EINVAL when the mask is too small.
  for (int ncpus = CPU_SETSIZE; ncpus <= (1 << 20); ncpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    if (set == nullptr) break;
    size_t size = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(size, set);
    if (::sched_getaffinity(0, size, set) == 0) {
      std::vector<uint32_t> cores;
      for (int c = 0; c < ncpus; ++c) {
        if (CPU_ISSET_S(c, size, set)) cores.push_back(static_cast<uint32_t>(c));
      }
      CPU_FREE(set);
      if (!cores.empty()) return cores;
      break;
    }
    int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) break;
  }
  long online = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<uint32_t> cores;
  for (long c = 0; c < online; ++c) cores.push_back(static_cast<uint32_t>(c));
  return cores;
}

uint64_t MemTotalBytes(const std::string& root) {
  if (auto meminfo = ReadSmallFile(root + "/proc/meminfo")) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
      line = absl::StripAsciiWhitespace(line);
      absl::ConsumeSuffix(&line, "kB");
      uint64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) && kib > 0) return kib * 1024;
    }
  }
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) return static_cast<uint64_t>(pages) * page_size;
  return 0;
}

// The smallest limit in `file` from the cgroup directory `dir` up to the hierarchy's root
// `mount`: a parent's limit binds its children, and inside a container without a cgroup
// namespace the process's path does not exist under the mount, so only the root is readable.
std::optional<uint64_t> SmallestLimitUpTo(const std::string& mount, std::string dir,
                                          const std::string& file) {
  std::optional<uint64_t> smallest;
  while (true) {
    if (auto text = ReadSmallFile(absl::StrCat(mount, dir, "/", file))) {
      uint64_t value = 0;
      // "max" (v2) means no limit; v1 writes a huge page-rounded number instead.
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) && value > 0 &&
          (!smallest || value < *smallest)) {
        smallest = value;
      }
    }
    if (dir.empty() || dir == "/") break;
    size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
  return smallest;
}

std::optional<uint64_t> CgroupMemoryLimit(const std::string& root) {
  auto cgroups = ReadSmallFile(root + "/proc/self/cgroup");
  if (!cgroups) return std::nullopt;
  std::optional<uint64_t> smallest;
  auto take = [&smallest](std::optional<uint64_t> limit) {
    if (limit && (!smallest || *limit < *smallest)) smallest = limit;
  };
  // Lines are "hierarchy-id:controllers:path"; v2 is "0::path". The standard mount points are
  // assumed (hybrid systems mount v2 under unified/).
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    std::string path(parts[2]);
    if (parts[0] == "0" && parts[1].empty()) {
      take(SmallestLimitUpTo(root + "/sys/fs/cgroup", path, "memory.max"));
      take(SmallestLimitUpTo(root + "/sys/fs/cgroup/unified", path, "memory.max"));
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      if (controller == "memory") {
        take(SmallestLimitUpTo(root + "/sys/fs/cgroup/memory", path, "memory.limit_in_bytes"));
      }
    }
  }
  return smallest;
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::optional<std::string> FindProgram(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    return IsExecutableFile(name) ? std::optional<std::string>(name) : std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return std::nullopt;
}

// Runs `argv` with stdout captured and a deadline. nullopt when it cannot start, runs past the
// deadline (it is then killed) or exits non-zero.
std::optional<std::string> RunAndCapture(process::ProcessLauncher& launcher,
                                         const std::vector<std::string>& argv,
                                         std::chrono::milliseconds timeout) {
  process::ProcessSpec spec;
  spec.key = argv.front();
  spec.argv = argv;
  spec.env = InheritedEnvironment({});
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  UniqueFd reader(fds[0]), writer(fds[1]);
  process::ChildSetup setup;  // stdin and stderr: /dev/null
  setup.stdout_fd = writer.get();
  setup.grouping = process::Grouping::kCallersGroup;
  setup.default_signals = std::vector<int>{};  // dispositions inherited, as with posix_spawn
  setup.die_with_parent = false;
  absl::StatusOr<process::LaunchedProcess> child = launcher.Start(spec, setup);
  writer.Reset();
  if (!child.ok()) return std::nullopt;

  std::string out;
  bool timed_out = false;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd pfd = {reader.get(), POLLIN, 0};
    int n = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      timed_out = n == 0;
      break;
    }
    char buf[4096];
    ssize_t got = ::read(reader.get(), buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    // Only a few bytes per GPU are expected; refuse to buffer a runaway program.
    if (out.size() < (1 << 20)) out.append(buf, static_cast<size_t>(got));
  }
  reader.Reset();
  if (timed_out) launcher.Signal(child->pid, SIGKILL, process::SignalTarget::kProcess);
  std::optional<process::ProcessExit> exit = launcher.Wait(child->pid);
  if (timed_out || !exit || exit->signal != 0 || exit->exit_code != 0) return std::nullopt;
  return out;
}

std::vector<std::string> DetectGpus(const InventoryOptions& options) {
  std::vector<std::string> gpus;
  if (options.fake_gpus) {
    for (uint32_t i = 0; i < *options.fake_gpus; ++i) gpus.push_back(std::to_string(i));
    return gpus;
  }
  std::optional<std::string> program = FindProgram(options.nvidia_smi);
  if (!program) return gpus;
  std::optional<std::string> out =
      RunAndCapture(options.launcher != nullptr ? *options.launcher : process::SystemLauncher(),
                    {*program, "--query-gpu=index", "--format=csv,noheader"}, kGpuQueryTimeout);
  if (!out) {
    spdlog::warn("{} failed or timed out; this machine is taken to have no GPUs", *program);
    return gpus;
  }
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    uint32_t index = 0;
    // Anything but a bare index (a warning line, say) is not a GPU.
    if (!line.empty() && absl::ascii_isdigit(static_cast<unsigned char>(line.front())) &&
        absl::SimpleAtoi(line, &index)) {
      gpus.push_back(std::to_string(index));
    }
  }
  return gpus;
}

}  // namespace

MachineInventory DetectLocalInventory(const InventoryOptions& options) {
  MachineInventory inventory;
  inventory.hostname = DetectHostname();
  inventory.cores = DetectCores();
  inventory.cpus = static_cast<double>(inventory.cores.size());
  inventory.memory_bytes = MemTotalBytes(options.root_dir);
  if (std::optional<uint64_t> limit = CgroupMemoryLimit(options.root_dir)) {
    if (inventory.memory_bytes == 0 || *limit < inventory.memory_bytes) {
      inventory.memory_bytes = *limit;
    }
  }
  inventory.gpus = DetectGpus(options);
  return inventory;
}

}  // namespace shoal::machine
