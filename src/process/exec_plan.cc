#include "process/exec_plan.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "process/process_launcher.h"

namespace shoal::process {
namespace {

constexpr char kDefaultPath[] = "/usr/local/bin:/usr/bin:/bin";

// Where the child failed, with errno. The child shares the agent's memory and the agent's
// thread sleeps until it has exec'd or exited (CLONE_VM | CLONE_VFORK), so the child writes
// this straight into the parent's record, as glibc's posix_spawn does: no pipe per launch.
enum ChildStage : int32_t { kRedirect = 1, kChdir = 2, kAffinity = 3, kExec = 4, kCgroup = 5 };
struct ChildError {
  int32_t stage;
  int32_t err;
};

// The child runs on a stack of ours that no sanitizer knows, and it never returns (it execs or
// _exits), so its code is built without ASan's and TSan's instrumentation: an instrumented frame
// poisons redzones in that stack's shadow which nothing unpoisons, and the next child on the same
// stack (or ASan's own no-return hook, __asan_handle_no_return, which was inserted before the call
// to RunChild) then hit them: the false stack-buffer-overflow docs/design/0011-sanitizers.md tells
// of. The plain build is unchanged.
#define SHOAL_CHILD_SIDE ABSL_ATTRIBUTE_NO_SANITIZE_ADDRESS ABSL_ATTRIBUTE_NO_SANITIZE_THREAD

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

void WaitForChild(pid_t pid) {
  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// Everything the child touches, as raw pointers into storage owned by the parent's stack frame.
struct ChildArgs {
  pid_t parent;  // the agent; the child dies with it
  bool die_with_parent;
  Grouping grouping;
  const int* default_signals;  // 0-terminated; nullptr: every signal
  int stdio[3];
  const int* extra_targets;  // the child's fd numbers for extra_sources, extra_count of each
  const int* extra_sources;
  int extra_count;
  const char* const* cgroup_procs;  // cgroup.procs files to join, nullptr-terminated
  ChildError* error;                // the parent's; stage 0 until the child fails
  int max_fd;
  char* const* argv;
  char* const* envp;
  const char* const* exec_paths;
  const char* working_dir;  // nullptr: stay
  const cpu_set_t* cpus;    // nullptr: no pinning
};

// _exit without the sanitizers' interceptor of it, which would run their end-of-process checks
// in this child on state it shares with the agent (under TSan, the agent's own exit status
// then turns to 66 for a "thread leak" the child reported).
[[noreturn]] SHOAL_CHILD_SIDE void ChildExit(int status) {
  for (;;) ::syscall(SYS_exit_group, status);
}

[[noreturn]] SHOAL_CHILD_SIDE void ChildFail(ChildError* error, int32_t stage, int err) {
  *static_cast<volatile int32_t*>(&error->err) = err;
  *static_cast<volatile int32_t*>(&error->stage) = stage;
  ChildExit(127);
}

// Runs in the forked child: async-signal-safe calls only (no malloc, no locks, no stdio).
[[noreturn]] SHOAL_CHILD_SIDE void RunChild(const ChildArgs& a) {
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  if (a.default_signals == nullptr) {
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);  // EINVAL is fine
    }
  } else {
    for (const int* sig = a.default_signals; *sig != 0; ++sig) ::sigaction(*sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // A session of its own, not only a process group, as torchrun gives its workers: with
  // autogroup scheduling (the kernel's default on desktops and many servers) a session is a
  // scheduling group, and tasks left in the agent's session share one group's CPU weight with
  // each other and with the agent. A new session is also a new process group (pgid = pid).
  switch (a.grouping) {
    case Grouping::kNewSession:
      if (::setsid() < 0) ::setpgid(0, 0);
      break;
    case Grouping::kNewProcessGroup:
      ::setpgid(0, 0);
      break;
    case Grouping::kCallersGroup:
      break;
  }
  // A task never outlives its agent: if the agent dies (even by SIGKILL) the kernel kills the
  // task. Checked after, in case the agent died before the prctl took effect.
  if (a.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != a.parent) ChildExit(127);
  }

  // Join the task's cgroups before exec: "0" is the writing process, so no handshake with the
  // parent is needed (and the parent can stay suspended, as in vfork).
  for (const char* const* procs = a.cgroup_procs; *procs != nullptr; ++procs) {
    int fd = ::open(*procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0) ChildFail(a.error, kCgroup, errno);
    ssize_t w = ::write(fd, "0", 1);
    int err = errno;
    ::close(fd);
    if (w != 1) ChildFail(a.error, kCgroup, err);
  }

  for (int i = 0; i < 3; ++i) {
    if (::dup2(a.stdio[i], i) < 0) ChildFail(a.error, kRedirect, errno);
  }
  if (a.working_dir != nullptr && ::chdir(a.working_dir) != 0) {
    ChildFail(a.error, kChdir, errno);
  }
  if (a.cpus != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), a.cpus) != 0) {
    ChildFail(a.error, kAffinity, errno);
  }
  // Nothing but 0-2 may survive exec: not the agent's fds, nor those of its other children.
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < a.max_fd; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  // Handed-over fds, after the sweep: dup2 clears close-on-exec on the copy. Their sources lie
  // above every target (Spawn sees to it), so no dup2 overwrites a source still to be copied.
  for (int i = 0; i < a.extra_count; ++i) {
    if (::dup2(a.extra_sources[i], a.extra_targets[i]) < 0) ChildFail(a.error, kRedirect, errno);
  }
  // Like execvp: keep looking after "not here", remember "here but not allowed".
  int err = ENOENT;
  bool saw_eacces = false;
  for (const char* const* path = a.exec_paths; *path != nullptr; ++path) {
    ::execve(*path, a.argv, a.envp);
    err = errno;
    if (err == EACCES) {
      saw_eacces = true;
    } else if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ELOOP &&
               err != ENAMETOOLONG && err != ENODEV && err != ETIMEDOUT) {
      break;
    }
  }
  if (saw_eacces && (err == ENOENT || err == ENOTDIR)) err = EACCES;
  ChildFail(a.error, kExec, err);
}

}  // namespace

absl::StatusOr<ExecPlan> ExecPlan::Build(const ProcessSpec& spec) {
  if (spec.argv.empty() || spec.argv.front().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("process '", spec.key, "': argv must name a command"));
  }
  ExecPlan plan;
  for (const std::string& arg : spec.argv) {
    if (HasNul(arg)) {
      return absl::InvalidArgumentError(
          absl::StrCat("process '", spec.key, "': argv contains a NUL byte"));
    }
    plan.argv_.push_back(arg);
  }
  std::string path_value;
  bool env_has_path = false;
  for (const auto& [name, value] : spec.env) {
    if (name.empty() || name.find('=') != std::string::npos || HasNul(name) || HasNul(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("process '", spec.key, "': invalid environment variable name '", name,
                       "'"));
    }
    plan.envp_.push_back(absl::StrCat(name, "=", value));
    if (name == "PATH") {
      env_has_path = true;
      path_value = value;
    }
  }
  const std::string& command = plan.argv_.front();
  if (command.find('/') != std::string::npos) {
    plan.exec_paths_.push_back(command);
  } else {
    if (!env_has_path) {
      const char* agent_path = std::getenv("PATH");
      path_value = agent_path != nullptr ? agent_path : kDefaultPath;
    }
    plan.search_path_ = path_value;
    for (absl::string_view dir : absl::StrSplit(path_value, ':')) {
      // An empty entry means the current directory, i.e. the working directory of the child.
      plan.exec_paths_.push_back(dir.empty() ? command : absl::StrCat(dir, "/", command));
    }
  }
  plan.working_dir_ = spec.working_dir;
  if (HasNul(plan.working_dir_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("process '", spec.key, "': working_dir contains a NUL byte"));
  }
  CPU_ZERO(&plan.cpus_);
  for (uint32_t cpu : spec.cpu_affinity) {
    if (cpu >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("process '", spec.key, "': CPU ", cpu,
                                                     " is beyond CPU_SETSIZE (", CPU_SETSIZE, ")"));
    }
    CPU_SET(cpu, &plan.cpus_);
    plan.pin_cpus_ = true;
  }
  return plan;
}

absl::Status ExecPlan::ChildFailure(int stage, int err) const {
  std::string what = absl::StrCat("cannot start '", command(), "'");
  switch (stage) {
    case kRedirect:
      absl::StrAppend(&what, ": redirecting stdin/stdout/stderr");
      break;
    case kChdir:
      absl::StrAppend(&what, ": working directory '", working_dir_, "'");
      break;
    case kAffinity: {
      std::vector<int> cpus;
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &cpus_)) cpus.push_back(cpu);
      }
      absl::StrAppend(&what, ": pinning to CPUs {", absl::StrJoin(cpus, ","), "}");
      break;
    }
    case kCgroup:
      return ErrnoStatus(absl::StrCat("cannot start '", command(), "': joining its cgroup"), err);
    case kExec:
    default:
      absl::StrAppend(&what, ": exec");
      break;
  }
  absl::Status status = ErrnoStatus(what, err);
  if (stage == kExec && !search_path_.empty()) {
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), " (searched PATH=", search_path_, ")"));
  }
  return status;
}

namespace {

SHOAL_CHILD_SIDE int ChildEntry(void* args) { RunChild(*static_cast<const ChildArgs*>(args)); }

// The child's stack while it shares our memory: one per spawning thread, kept for the thread's
// life. Spawns run on several threads at once (a master starts TensorBoard while its backend
// starts agents), and two children on one stack smash each other's frames; under CLONE_VFORK a
// thread's own child is done with the stack before the thread can spawn again.
constexpr size_t kChildStackSize = 256 * 1024;

class ChildStack {
 public:
  ChildStack()
      : base_(::mmap(nullptr, kChildStackSize, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0)) {}
  ~ChildStack() {
    if (base_ != MAP_FAILED) ::munmap(base_, kChildStackSize);
  }
  ChildStack(const ChildStack&) = delete;
  ChildStack& operator=(const ChildStack&) = delete;
  char* base() const { return base_ == MAP_FAILED ? nullptr : static_cast<char*>(base_); }

 private:
  void* const base_;
};

// The kernel's struct clone_args (linux/sched.h, version 2: 88 bytes), spelt out here because
// that header clashes with <sched.h>.
struct CloneArgs {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
};
constexpr uint64_t kCloneIntoCgroup = 0x200000000ULL;

}  // namespace

#if defined(__x86_64__)
// clone3 with a function to run on the child's stack, which glibc 2.36 does not offer. The child
// starts on the new stack, calls fn(arg) and exits with its result; the parent returns the pid
// (or -errno). syscall clobbers only rcx and r11, so r8/r9 carry fn and arg into the child.
extern "C" long ShoalClone3(CloneArgs* args, size_t size, int (*fn)(void*), void* arg);
asm(R"(
  .text
  .globl ShoalClone3
  .type ShoalClone3, @function
ShoalClone3:
  mov %rdx, %r8
  mov %rcx, %r9
  mov $435, %eax
  syscall
  test %rax, %rax
  jnz 1f
  xor %ebp, %ebp
  mov %r9, %rdi
  call *%r8
  mov %eax, %edi
  mov $60, %eax
  syscall
  hlt
1:
  ret
  .size ShoalClone3, .-ShoalClone3
)");
#endif

bool ExecPlan::CanStartInCgroup() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<ExecPlan::Child> ExecPlan::Spawn(const ChildSetup& setup) const {
  const int into_cgroup_fd = setup.into_cgroup_fd;
  // Everything the child reads is laid out now, before the clone.
  std::vector<char*> argv;
  for (const std::string& arg : argv_) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& var : envp_) envp.push_back(const_cast<char*>(var.c_str()));
  envp.push_back(nullptr);
  std::vector<const char*> exec_paths;
  for (const std::string& path : exec_paths_) exec_paths.push_back(path.c_str());
  exec_paths.push_back(nullptr);
  std::vector<const char*> procs;
  for (const std::string& p : setup.cgroup_procs) procs.push_back(p.c_str());
  procs.push_back(nullptr);

  std::vector<int> default_signals;
  if (setup.default_signals) {
    default_signals = *setup.default_signals;
    default_signals.push_back(0);
  }
  UniqueFd dev_null[2];  // for reading, for writing
  int stdio[3] = {setup.stdin_fd, setup.stdout_fd, setup.stderr_fd};
  for (int i = 0; i < 3; ++i) {
    if (stdio[i] >= 0) continue;
    UniqueFd& null = dev_null[i == 0 ? 0 : 1];
    if (!null.valid()) {
      null.Reset(::open("/dev/null", (i == 0 ? O_RDONLY : O_WRONLY) | O_CLOEXEC));
      if (!null.valid()) return ErrnoStatus("open /dev/null", errno);
    }
    stdio[i] = null.get();
  }
  // The child dup2()s onto 0-2 and then onto the extra targets, so every source must live above
  // all of them.
  int lowest_source = 3;
  for (const auto& [target, source] : setup.extra_fds) {
    if (target <= 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot start '", command(), "': fd ", target, " is one of stdin/out/err"));
    }
    lowest_source = std::max(lowest_source, target + 1);
  }
  std::vector<UniqueFd> copies;
  std::vector<int> extra_targets, extra_sources;
  for (const auto& [target, source] : setup.extra_fds) {
    int fd = source;
    if (fd < lowest_source) {
      fd = ::fcntl(source, F_DUPFD_CLOEXEC, lowest_source);
      if (fd < 0) return ErrnoStatus("dup", errno);
      copies.emplace_back(fd);
    }
    extra_targets.push_back(target);
    extra_sources.push_back(fd);
  }
  UniqueFd stdio_copies[3];
  for (int i = 0; i < 3; ++i) {
    if (stdio[i] < lowest_source) {
      int dup = ::fcntl(stdio[i], F_DUPFD_CLOEXEC, lowest_source);
      if (dup < 0) return ErrnoStatus("dup", errno);
      stdio_copies[i].Reset(dup);
      stdio[i] = dup;
    }
  }
  ChildError error{};
  ChildArgs args{};
  args.parent = ::getpid();
  args.die_with_parent = setup.die_with_parent;
  args.grouping = setup.grouping;
  args.default_signals = setup.default_signals ? default_signals.data() : nullptr;
  for (int i = 0; i < 3; ++i) args.stdio[i] = stdio[i];
  args.extra_targets = extra_targets.data();
  args.extra_sources = extra_sources.data();
  args.extra_count = static_cast<int>(extra_targets.size());
  args.cgroup_procs = procs.data();
  args.error = &error;
  long open_max = ::sysconf(_SC_OPEN_MAX);
  args.max_fd = open_max > 0 && open_max < (1 << 20) ? static_cast<int>(open_max) : (1 << 16);
  args.argv = argv.data();
  args.envp = envp.data();
  args.exec_paths = exec_paths.data();
  args.working_dir = working_dir_.empty() ? nullptr : working_dir_.c_str();
  args.cpus = pin_cpus_ ? &cpus_ : nullptr;

  thread_local ChildStack child_stack;
  char* stack = child_stack.base();
  if (stack == nullptr) return ErrnoStatus("allocate the child's stack", ENOMEM);
#if defined(__SANITIZE_ADDRESS__)
  // ASan never sees a frame on this stack unwind (the child execs), so nothing earlier users
  // of these pages left in its shadow may fail this child's checks.
  ASAN_UNPOISON_MEMORY_REGION(stack, kChildStackSize);
#endif

  // clone(CLONE_VM | CLONE_VFORK), as posix_spawn does: no copy of the agent's page tables (a
  // fork of a process holding gRPC took 2-3 ms; this takes a fraction), and this thread sleeps
  // until the child has exec'd or failed. CLONE_PIDFD hands over the pidfd with no pid race.
  // Every signal stays blocked across it, so no handler of the agent runs in the child before
  // the child has reset the dispositions.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  int pidfd = -1;
  pid_t pid = -1;
  int clone_errno = 0;
#if defined(__x86_64__)
#if defined(__SANITIZE_THREAD__)
  // TSan intercepts clone() and treats the child as a fork's, resetting its own thread state;
  // with CLONE_VM that state is the agent's, and every later happens-before is lost (false
  // races in ProcessSupervisorTest). The raw clone3 below goes past the interceptor.
  const bool raw_clone3 = true;
#else
  const bool raw_clone3 = into_cgroup_fd >= 0;
#endif
  if (raw_clone3) {
    // Born inside its tracking cgroup: no migration, which would cost the kernel an RCU grace
    // period (~15 ms measured) on the launch path.
    CloneArgs ca{};
    ca.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | (into_cgroup_fd >= 0 ? kCloneIntoCgroup : 0);
    ca.pidfd = reinterpret_cast<uint64_t>(&pidfd);
    ca.exit_signal = SIGCHLD;
    ca.stack = reinterpret_cast<uint64_t>(stack);
    ca.stack_size = kChildStackSize;
    ca.cgroup = into_cgroup_fd >= 0 ? static_cast<uint64_t>(into_cgroup_fd) : 0;
    long rc = ShoalClone3(&ca, sizeof ca, ChildEntry, &args);
    if (rc < 0) {
      clone_errno = static_cast<int>(-rc);
    } else {
      pid = static_cast<pid_t>(rc);
    }
  } else
#endif
  {
    pid = ::clone(ChildEntry, stack + kChildStackSize, CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD,
                  &args, &pidfd);
    clone_errno = errno;
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    return ErrnoStatus(absl::StrCat("cannot start '", command(), "': clone"), clone_errno);
  }
  Child child;
  child.pid = pid;
  child.pidfd.Reset(pidfd);

  // The child has exec'd (the record is untouched) or written where it failed and exited.
  int32_t stage = *static_cast<volatile int32_t*>(&error.stage);
  if (stage == 0) return child;
  WaitForChild(pid);
  return ChildFailure(stage, *static_cast<volatile int32_t*>(&error.err));
}

}  // namespace shoal::process
