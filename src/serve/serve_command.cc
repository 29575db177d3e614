#include "serve/serve_command.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <arpa/inet.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/local_address.h"
#include "serve/frontends/inference_grpc_server.h"
#include "serve/frontends/inference_http_server.h"
#include "serve/repository/hdfs_repository_mirror.h"
#include "serve/repository/model_manager.h"
#include "serve/repository/model_repository.h"
#include "serve/repository/repository_watcher.h"
#include "serve/runtime/backend_loader.h"
#include "serve/runtime/cpu_kernels.h"
#include "serve/runtime/model_backend.h"

namespace shoal::serve {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// The CPUs this process may run on (its affinity mask, as taskset or a cgroup cpuset set it).
int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The token from `path` (surrounding whitespace dropped); never echoed anywhere.

// Buffers of this size and larger are mmapped on their own and unmapped when freed.
constexpr int kMallocMmapThresholdBytes = 256 << 10;

// glibc raises its mmap threshold to the size of each mmapped block freed (up to 32 MiB), and
// its trim threshold to twice that. After one large request, a gRPC call's buffers (the 1 MiB
// slices gRPC serializes a response into, the read slices a request arrives in, tensors up to
// 32 MiB) are carved from the per-thread arena of whichever of the server's many threads
// handles it, up to 8 arenas per CPU; small blocks allocated after them pin each arena's top,
// so nothing is returned when they are freed. Measured (issue 23, 2 CPUs): 40 sequential 60 MB
// ModelInfer calls left the RSS at 712 MiB from 175 MiB, with under 1 MiB in use in each of 14
// arenas holding 29 to 80 MiB; with the threshold pinned it comes back to 261 MiB. Pinning it
// (mallopt turns the adjustment off) keeps every large block out of the arenas, at the cost of
// an mmap and its page faults per large block.
//
// Turning the adjustment off also leaves the trim threshold at glibc's 128 KiB: a free that
// left more than that at the top of an instance thread's arena gave it back (madvise), and
// the next batch faulted it in again. With an LSTM at batch 128 (its activations freed after
// every batch), page faults and madvise took 4 % of the server's CPU, ~3 us a request; with
// 4 MiB kept at each arena's top, none (1 MiB still left a quarter of them). ReturnFreedMemory
// gives back what the arenas hold past kTrimWhenFreeBytes in all, every 2 s. An explicit
// GLIBC_TUNABLES setting of either threshold wins.
constexpr int kMallocTrimThresholdBytes = 4 << 20;
constexpr size_t kTrimWhenFreeBytes = 32 << 20;

void PinMallocThresholds() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  auto tuned = [&](const char* name) {
    return tunables != nullptr && std::strstr(tunables, name) != nullptr;
  };
  if (!tuned("glibc.malloc.mmap_threshold")) {
    mallopt(M_MMAP_THRESHOLD, kMallocMmapThresholdBytes);
  }
  if (!tuned("glibc.malloc.trim_threshold")) {
    mallopt(M_TRIM_THRESHOLD, kMallocTrimThresholdBytes);
  }
}

// Free memory the arenas hold past kTrimWhenFreeBytes goes back to the system within
// trim_interval. Blocks under the mmap threshold still come from the arenas of the threads
// that answered the requests, and a burst of large requests leaves many of them free there
// (72 MiB after 24 calls of 16 MiB while other servers shared the 2 CPUs). Trimming when that
// much is free returns it after the load without a cost per request; mallinfo2 and
// malloc_trim walk the arenas, which every 2 s is negligible.
void ReturnFreedMemory() {
  struct mallinfo2 info = mallinfo2();
  if (info.fordblks >= kTrimWhenFreeBytes) malloc_trim(0);
}

using Clock = std::chrono::steady_clock;

// While the listeners stop, a second signal is looked for this often.
constexpr std::chrono::milliseconds kStopPoll{20};

const char* SignalName(int signal_number) {
  return signal_number == SIGINT ? "SIGINT" : "SIGTERM";
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The signal of `signals` that arrives before `deadline`, or 0.
int WaitForSignalUntil(const sigset_t& signals, Clock::time_point deadline) {
  while (true) {
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return 0;
    auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec wait{static_cast<time_t>(nanos / 1'000'000'000),
                  static_cast<long>(nanos % 1'000'000'000)};
    int got = sigtimedwait(&signals, nullptr, &wait);
    if (got > 0) return got;
    // EAGAIN: the time is up (checked above); EINTR: another signal, wait on.
  }
}

// A second signal while draining or stopping: whoever sent it wants the process gone now.
[[noreturn]] void ExitAtOnce(int signal_number) {
  std::cerr << "shoal serve: second signal (" << SignalName(signal_number)
            << "): exiting at once, without the requests in flight" << std::endl;
  std::fflush(nullptr);
  std::_Exit(kExitFailure);
}

}  // namespace

int RunServer(const ServeOptions& options) {
  PinMallocThresholds();  // before any thread has an arena
  // Before any thread starts (setenv) and before the TorchScript runtime loads OpenBLAS and runs
  // its first kernel; said once the server starts, so that a refused start prints only why.
  std::optional<std::string> blas_kernels = ChooseOpenBlasKernels();
  std::optional<std::string> aten_kernels = ChooseAtenKernels();

  // Signals are taken by sigwait below; block them before any thread starts, so that every
  // thread inherits the mask and none is killed by them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string token_file = options.token_file;
  if (token_file.empty()) {
    if (const char* env = std::getenv("SHOAL_SERVE_TOKEN_FILE")) token_file = env;
  }
  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(token_file);
    if (!read.ok()) {
      std::cerr << "shoal serve: " << read.status().message() << "\n";
      return kExitUsage;
    }
    token = *read;
  } else if (!common::IsLoopbackHost(options.host)) {
    std::cerr << "shoal serve: --host " << options.host
              << " is not a loopback address, so callers must authenticate: give --token-file "
                 "FILE (they then send Authorization: Bearer <the file's content>)\n";
    return kExitUsage;
  }

  // An hdfs:// repository is served from a local copy that follows it.
  std::string repository_dir = options.model_repository;
  std::unique_ptr<HdfsRepositoryMirror> mirror;
  if (!options.repository_cache_dir.empty() &&
      !absl::StartsWith(options.model_repository, "hdfs://")) {
    std::cerr << "shoal serve: --repository-cache-dir is only for an hdfs:// --model-repository "
                 "(a local one is served where it is)\n";
    return kExitUsage;
  }
  if (absl::StartsWith(options.model_repository, "hdfs://")) {
    HdfsMirrorOptions copy;
    copy.uri = options.model_repository;
    copy.cache_dir = options.repository_cache_dir;
    copy.poll_interval = std::chrono::milliseconds(options.repository_poll_ms);
    auto started = HdfsRepositoryMirror::Start(copy);
    if (!started.ok()) {
      std::cerr << "shoal serve: " << started.status().message() << "\n";
      return kExitUsage;
    }
    mirror = std::move(*started);
    repository_dir = mirror->local_dir();
    std::cerr << "shoal serve: copying " << options.model_repository << " (WebHDFS "
              << mirror->location().webhdfs << ") into " << repository_dir << std::endl;
  }
  absl::StatusOr<RepositoryScan> scan = ScanModelRepository(repository_dir);
  if (!scan.ok()) {
    std::cerr << "shoal serve: " << scan.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend = LoadTorchBackend();
  if (!backend.ok()) {
    std::cerr << "shoal serve: " << backend.status().message() << "\n";
    return kExitFailure;
  }
  int cpus = AvailableCpus();
  auto models = std::make_unique<ModelManager>(backend->get(), SystemClock::Get(), cpus,
                                               repository_dir);

  // Set on SIGTERM, before the listeners close: the front ends then say they are not ready.
  std::atomic<bool> draining{false};
  HttpServerOptions http_options;
  http_options.draining = &draining;
  http_options.host = options.host;
  http_options.port = options.http_port;
  http_options.threads = options.http_threads > 0 ? options.http_threads : cpus;
  http_options.max_body_bytes = options.max_request_bytes;
  http_options.backend_description = (*backend)->Description();
  http_options.auth_token = token;
  absl::StatusOr<std::unique_ptr<InferenceHttpServer>> http =
      InferenceHttpServer::Start(http_options, models.get());
  if (!http.ok()) {
    std::cerr << "shoal serve: " << http.status().message() << "\n";
    return kExitFailure;
  }
  GrpcServerOptions grpc_options;
  grpc_options.draining = &draining;
  grpc_options.host = options.host;
  grpc_options.port = options.grpc_port;
  grpc_options.threads = options.grpc_threads;
  grpc_options.max_message_bytes = options.max_request_bytes;
  grpc_options.auth_token = token;
  absl::StatusOr<std::unique_ptr<InferenceGrpcServer>> grpc =
      InferenceGrpcServer::Start(grpc_options, models.get());
  if (!grpc.ok()) {
    std::cerr << "shoal serve: " << grpc.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << "shoal serve: listening on http://" << options.host << ":" << (*http)->port()
            << "\nshoal serve: listening on grpc://" << options.host << ":" << (*grpc)->port()
            << std::endl;
  if (blas_kernels) std::cerr << "shoal serve: " << *blas_kernels << "\n";
  if (aten_kernels) std::cerr << "shoal serve: " << *aten_kernels << "\n";
  std::cerr << "shoal serve: " << http_options.backend_description << ", " << cpus
            << " CPU(s); loading " << scan->models.size() << " model(s) from "
            << options.model_repository << std::endl;

  // Written by the loader thread, read after it is joined.
  std::unique_ptr<RepositoryWatcher> watcher;
  std::thread loader([&] {
    models->LoadRepository(*scan);
    if (!models->IsLoaded()) return;  // cancelled
    std::cerr << "shoal serve: ready" << std::endl;
    if (options.repository_poll_ms > 0) {
      RepositoryWatcherOptions watch;
      watch.repository_dir = repository_dir;
      watch.poll_interval = std::chrono::milliseconds(options.repository_poll_ms);
      watch.settle_time = std::chrono::milliseconds(options.repository_settle_ms);
      watcher = std::make_unique<RepositoryWatcher>(watch, models.get(), SystemClock::Get(), *scan);
    }
  });

  int signal_number = 0;
  const timespec trim_interval{2, 0};
  while ((signal_number = sigtimedwait(&signals, nullptr, &trim_interval)) < 0) {
    (*backend)->ReleaseIdleMemory();
    ReturnFreedMemory();
  }
  const char* signal_name = SignalName(signal_number);
  bool drain = signal_number == SIGTERM && options.drain_seconds > 0;
  if (drain) {
    draining.store(true);
    std::cerr << "shoal serve: " << signal_name << ", shutting down: draining for "
              << options.drain_seconds
              << " s (/v2/health/ready answers 503, requests are still answered; a second "
                 "SIGTERM or SIGINT exits at once)"
              << std::endl;
    auto drain_end = Clock::now() + std::chrono::seconds(options.drain_seconds);
    if (int again = WaitForSignalUntil(signals, drain_end); again > 0) ExitAtOnce(again);
  } else {
    std::cerr << "shoal serve: " << signal_name << ", shutting down" << std::endl;
  }
  // Stop taking requests and finish the ones being answered, on a thread of its own so that a
  // second signal, or the end of --finish-seconds, can still end the process; then stop
  // loading (the model being warmed up finishes first) and the models' instances.
  auto stop_started = Clock::now();
  std::atomic<bool> listeners_stopped{false};
  std::thread stopper([&] {
    std::thread grpc_stop([&] { (*grpc)->Stop(); });
    (*http)->Stop();
    grpc_stop.join();
    listeners_stopped.store(true);
  });
  auto finish_end = stop_started + std::chrono::seconds(options.finish_seconds);
  while (!listeners_stopped.load()) {
    if (int again = WaitForSignalUntil(signals, std::min(finish_end, Clock::now() + kStopPoll));
        again > 0) {
      ExitAtOnce(again);
    }
    if (!listeners_stopped.load() && Clock::now() >= finish_end) {
      std::cerr << "shoal serve: requests still in flight " << options.finish_seconds
                << " s after the listeners closed (--finish-seconds); exiting without them"
                << std::endl;
      std::fflush(nullptr);
      std::_Exit(kExitFailure);
    }
  }
  stopper.join();
  double finish_took = SecondsSince(stop_started);
  models->Cancel();
  loader.join();
  watcher.reset();
  mirror.reset();
  http->reset();
  grpc->reset();
  models.reset();
  if (drain) {
    std::cerr << "shoal serve: stopped: drained for " << options.drain_seconds
              << " s, then closed the listeners and finished the requests in flight in "
              << absl::StrFormat("%.2f", finish_took) << " s" << std::endl;
  } else {
    std::cerr << "shoal serve: stopped: closed the listeners and finished the requests in "
                 "flight in "
              << absl::StrFormat("%.2f", finish_took) << " s" << std::endl;
  }
  return kExitOk;
}

}  // namespace shoal::serve
