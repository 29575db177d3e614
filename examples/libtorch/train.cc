// Data-parallel training of a tiny MLP with libtorch (C++), for Shoal's `framework: pytorch`.
//
// Everything this process knows about its place in the job comes from the torchrun
// environment that Shoal (or torchrun itself) gives every worker:
//   MASTER_ADDR, MASTER_PORT  rank 0's address and reserved port: the c10d::TCPStore
//   RANK, WORLD_SIZE          this worker's rank and the number of workers
//   LOCAL_RANK, LOCAL_WORLD_SIZE
//   OMP_NUM_THREADS           torch's intra-op threads (optional, default 1)
//   SHOAL_JOB_DIR             optional, only reported
// A missing or malformed variable is an error: exit status 2.
//
// The data set is synthetic: 4 Gaussian classes in 8 dimensions, drawn from torch's RNG with
// a fixed seed, so every rank builds the same 2048 training and 512 held-out samples (checked
// across ranks). Every global batch is split between the ranks (rank r takes every
// WORLD_SIZE-th sample from r on); gradients are summed with one ProcessGroupGloo allreduce per
// step and divided by the global batch size, so every rank takes the same optimizer step.
// At the end the ranks all-reduce the held-out accuracy and compare a checksum of the weights.
//
// Rank 0 prints `epoch E/N loss L` per epoch, a JSON line with the metric, and last
// `final_accuracy=0.xxx`. Exit status: 0 success; 1 accuracy below --min-accuracy, ranks that
// disagree, or a runtime error (e.g. a peer that never came); 2 bad flags or environment.

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shoal/sdk.h"

namespace {

constexpr int kUsageError = 2;
constexpr int kFeatures = 8;
constexpr int kClasses = 4;
constexpr int kHidden = 32;
constexpr int64_t kTrainSamples = 2048;
constexpr int64_t kTestSamples = 512;
constexpr uint64_t kDataSeed = 20240501;
constexpr uint64_t kModelSeed = 7;

struct Flags {
  int epochs = 10;
  double min_accuracy = 0.9;
  int batch_size = 64;  // global: split between the ranks
  double lr = 0.05;
  int timeout_s = 120;  // rendezvous and collectives
  std::string publish;  // model name: rank 0 publishes the trained model as TorchScript
};

struct Env {
  std::string master_addr;
  uint16_t master_port = 0;
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int threads = 1;
  std::string job_dir;  // empty outside Shoal
};

// Thrown for bad flags and environment: main() prints it and exits 2.
struct UsageError {
  std::string message;
};

template <typename T>
std::optional<T> ParseNumber(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// from_chars for double is in libstdc++ 11+, but strtod is simpler to reason about for "0.9".
std::optional<double> ParseDouble(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

int64_t EnvInt(const char* name, int64_t min, int64_t max, std::optional<int64_t> fallback) {
  const char* raw = std::getenv(name);
  if (raw == nullptr) {
    if (fallback) return *fallback;
    throw UsageError{std::string(name) +
                     " is not set: this program expects the torchrun environment (MASTER_ADDR, "
                     "MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), as Shoal's "
                     "framework: pytorch or torchrun provide"};
  }
  auto v = ParseNumber<int64_t>(raw);
  if (!v || *v < min || *v > max) {
    throw UsageError{std::string(name) + "='" + raw + "' is not an integer in [" +
                     std::to_string(min) + ", " + std::to_string(max) + "]"};
  }
  return *v;
}

Env ReadEnv() {
  Env env;
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    throw UsageError{std::string("MASTER_ADDR is ") + (addr == nullptr ? "not set" : "empty") +
                     ": this program expects the torchrun environment (MASTER_ADDR, MASTER_PORT, "
                     "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), as Shoal's framework: "
                     "pytorch or torchrun provide"};
  }
  env.master_addr = addr;
  env.master_port = static_cast<uint16_t>(EnvInt("MASTER_PORT", 1, 65535, std::nullopt));
  env.world_size = static_cast<int>(EnvInt("WORLD_SIZE", 1, 1 << 20, std::nullopt));
  env.rank = static_cast<int>(EnvInt("RANK", 0, env.world_size - 1, std::nullopt));
  env.local_world_size =
      static_cast<int>(EnvInt("LOCAL_WORLD_SIZE", 1, env.world_size, std::nullopt));
  env.local_rank = static_cast<int>(EnvInt("LOCAL_RANK", 0, env.local_world_size - 1, std::nullopt));
  env.threads = static_cast<int>(EnvInt("OMP_NUM_THREADS", 1, 4096, 1));
  if (const char* dir = std::getenv("SHOAL_JOB_DIR")) env.job_dir = dir;
  return env;
}

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "usage: libtorch-trainer [--epochs N] [--min-accuracy X] [--batch-size N] [--lr X]\n"
               "                        [--timeout-s N] [--publish NAME]\n"
               "Run under torchrun's environment (Shoal framework: pytorch sets it).\n"
               "  --epochs N        passes over the 2048 training samples (default 10)\n"
               "  --min-accuracy X  exit 1 when held-out accuracy is below X (default 0.9)\n"
               "  --batch-size N    global batch, split between the ranks (default 64)\n"
               "  --lr X            SGD learning rate, momentum 0.9 (default 0.05)\n"
               "  --timeout-s N     rendezvous and collective timeout (default 120)\n"
               "  --publish NAME    rank 0 publishes the trained model as a new version of NAME\n"
               "                    in $SHOAL_MODEL_REPOSITORY (the job's publish section)\n");
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      PrintUsage(stdout);
      std::exit(0);
    }
    std::string name = arg;
    std::optional<std::string> value;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    auto next = [&]() -> std::string {
      if (value) return *value;
      if (i + 1 >= argc) throw UsageError{name + " needs a value"};
      return argv[++i];
    };
    auto int_flag = [&](int min, int max) {
      std::string text = next();
      auto v = ParseNumber<int>(text);
      if (!v || *v < min || *v > max) {
        throw UsageError{name + " '" + text + "' is not an integer in [" + std::to_string(min) +
                         ", " + std::to_string(max) + "]"};
      }
      return *v;
    };
    auto double_flag = [&](double min, double max) {
      std::string text = next();
      auto v = ParseDouble(text);
      if (!v || *v < min || *v > max) {
        char range[64];
        std::snprintf(range, sizeof range, "[%g, %g]", min, max);
        throw UsageError{name + " '" + text + "' is not a number in " + range};
      }
      return *v;
    };
    if (name == "--epochs") {
      flags.epochs = int_flag(1, 100000);
    } else if (name == "--min-accuracy") {
      flags.min_accuracy = double_flag(0.0, 1.0);
    } else if (name == "--batch-size") {
      flags.batch_size = int_flag(1, static_cast<int>(kTrainSamples));
    } else if (name == "--lr") {
      flags.lr = double_flag(1e-9, 100.0);
    } else if (name == "--timeout-s") {
      flags.timeout_s = int_flag(1, 86400);
    } else if (name == "--publish") {
      flags.publish = next();
    } else {
      throw UsageError{"unknown argument '" + arg + "' (see --help)"};
    }
  }
  return flags;
}

// The trained MLP as TorchScript that `shoal serve` loads: the C++ frontend's modules cannot be
// scripted, so the same computation is defined in TorchScript over copies of the weights.
// Input: FP32 [batch, kFeatures]; output: FP32 logits [batch, kClasses].
torch::jit::Module ExportTorchScript(torch::nn::Sequential& model) {
  torch::jit::Module exported("LibtorchMlp");
  auto first = model[0]->as<torch::nn::Linear>();
  auto second = model[2]->as<torch::nn::Linear>();
  torch::NoGradGuard no_grad;
  exported.register_parameter("w1", first->weight.detach().clone(), /*is_buffer=*/false);
  exported.register_parameter("b1", first->bias.detach().clone(), false);
  exported.register_parameter("w2", second->weight.detach().clone(), false);
  exported.register_parameter("b2", second->bias.detach().clone(), false);
  exported.define(R"(
def forward(self, x: Tensor) -> Tensor:
    hidden = torch.relu(torch.matmul(x, self.w1.t()) + self.b1)
    return torch.matmul(hidden, self.w2.t()) + self.b2
)");
  exported.eval();
  return exported;
}

// The address of this machine's interface that routes to MASTER_ADDR: what the other ranks can
// reach us on (127.0.0.1 when the master is local). A UDP connect() sends nothing; it only
// makes the kernel pick the route and source address. Empty if MASTER_ADDR does not resolve.
std::string LocalAddressTowards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  if (::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res) != 0) return {};
  std::string result;
  for (addrinfo* ai = res; ai != nullptr && result.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[NI_MAXHOST];
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof text, nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      result = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return result;
}

// Waits until something listens on host:port (rank 0's store), for at most `timeout`. Only a
// shortcut: TCPStore's client retries a refused connection itself, but in 1.13 only once a
// second, and libtorch takes about half a second to load, so the other ranks almost always
// find no server on their first try and lose a second. Throws when nothing listens in time.
void WaitForListener(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0) {
    throw std::runtime_error(std::string("cannot resolve MASTER_ADDR: ") + ::gai_strerror(rc));
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool up = false;
  while (!up && std::chrono::steady_clock::now() < deadline) {
    for (addrinfo* ai = res; ai != nullptr && !up; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      up = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
      ::close(fd);
    }
    if (!up) ::usleep(20 * 1000);
  }
  ::freeaddrinfo(res);
  if (!up) {
    throw std::runtime_error("nothing listens there after " +
                             std::to_string(timeout.count() / 1000) + "s (is rank 0 running?)");
  }
}

// Gloo's transport devices, chosen as torch.distributed does for GLOO_SOCKET_IFNAME (one device
// per listed interface); otherwise the interface that routes to MASTER_ADDR, which works with
// loopback and multi-host jobs alike. createDefaultDevice (bind to whatever this hostname
// resolves to) is only the last resort: in containers the hostname often resolves to an
// address other ranks cannot reach, or to nothing.
std::vector<std::shared_ptr<::gloo::transport::Device>> GlooDevices(const Env& env,
                                                                    std::string& described) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  if (const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME"); ifnames && *ifnames) {
    std::string list = ifnames;
    size_t start = 0;
    while (start <= list.size()) {
      size_t comma = list.find(',', start);
      std::string name = list.substr(start, comma == std::string::npos ? std::string::npos
                                                                        : comma - start);
      if (!name.empty()) {
        devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        described += (described.empty() ? "interface " : ",") + name;
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (!devices.empty()) return devices;
  }
  std::string local = LocalAddressTowards(env.master_addr, env.master_port);
  if (!local.empty()) {
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
    described = "address " + local + " (route to MASTER_ADDR)";
    return devices;
  }
  devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  described = "default device (hostname)";
  return devices;
}

struct Dataset {
  torch::Tensor x_train, y_train, x_test, y_test;
};

// Four Gaussian blobs (unit variance) around random centres. Drawn in float64: the CPU kernels
// for float32 normal_ have an AVX2 path, so float32 draws could differ between machines.
Dataset MakeDataset() {
  auto gen = at::detail::createCPUGenerator(kDataSeed);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor centres = torch::randn({kClasses, kFeatures}, gen, f64) * 2.0;
  auto draw = [&](int64_t n, torch::Tensor& x, torch::Tensor& y) {
    y = torch::randint(0, kClasses, {n}, gen, torch::kLong);
    x = (centres.index_select(0, y) + torch::randn({n, kFeatures}, gen, f64))
            .to(torch::kFloat32);
  };
  Dataset d;
  draw(kTrainSamples, d.x_train, d.y_train);
  draw(kTestSamples, d.x_test, d.y_test);
  return d;
}

// A position-weighted sum, so that swapped or shifted values change it too.
double Checksum(const std::vector<torch::Tensor>& tensors) {
  double sum = 0;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    torch::Tensor flat = t.detach().to(torch::kFloat64).reshape({-1});
    torch::Tensor weights =
        torch::arange(offset + 1, offset + flat.numel() + 1, torch::kFloat64) * 1e-3 + 1.0;
    sum += (flat * weights).sum().item<double>();
    offset += flat.numel();
  }
  return sum;
}

void AllreduceInPlace(c10d::ProcessGroup& pg, torch::Tensor& t, c10d::ReduceOp op) {
  std::vector<torch::Tensor> tensors{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  pg.allreduce(tensors, opts)->wait();
}

// {min, max} of a double over the ranks.
std::pair<double, double> MinMax(c10d::ProcessGroup& pg, double v) {
  torch::Tensor lo = torch::full({1}, v, torch::kFloat64);
  torch::Tensor hi = lo.clone();
  AllreduceInPlace(pg, lo, c10d::ReduceOp::MIN);
  AllreduceInPlace(pg, hi, c10d::ReduceOp::MAX);
  return {lo.item<double>(), hi.item<double>()};
}

// Rank r's share of a range of samples: every world-th index from r on.
torch::Tensor Shard(const torch::Tensor& indices, int rank, int world) {
  return indices.slice(0, rank, indices.size(0), world);
}

// `stage` says what was under way, for the error message if something throws.
int Run(const Flags& flags, const Env& env, std::string& stage) {
  const bool chief = env.rank == 0;
  torch::set_num_threads(env.threads);
  const auto timeout = std::chrono::milliseconds(int64_t{flags.timeout_s} * 1000);

  // Rendezvous: rank 0 serves the store on MASTER_PORT, every rank (rank 0 too) is a client.
  c10d::TCPStoreOptions store_opts;
  store_opts.port = env.master_port;
  store_opts.isServer = chief;
  store_opts.numWorkers = static_cast<size_t>(env.world_size);
  store_opts.waitWorkers = true;
  store_opts.timeout = timeout;
  stage = "connecting to the store at " + env.master_addr + ":" + std::to_string(env.master_port);
  if (!chief) WaitForListener(env.master_addr, env.master_port, timeout);
  auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_opts);

  stage = "forming the gloo group (waiting for all " + std::to_string(env.world_size) +
          " ranks)";
  auto pg_opts = c10d::ProcessGroupGloo::Options::create(timeout);
  std::string device_text;
  pg_opts->devices = GlooDevices(env, device_text);
  pg_opts->threads = 1;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, pg_opts);
  std::fprintf(stderr,
               "rank %d/%d (local %d/%d): gloo on %s, store %s:%u, %d torch thread(s)%s%s\n",
               env.rank, env.world_size, env.local_rank, env.local_world_size,
               device_text.c_str(), env.master_addr.c_str(), unsigned{env.master_port},
               env.threads, env.job_dir.empty() ? "" : ", job dir ", env.job_dir.c_str());

  stage = "checking the data";
  Dataset data = MakeDataset();
  double data_sum = Checksum({data.x_train, data.y_train, data.x_test, data.y_test});
  if (auto [lo, hi] = MinMax(*pg, data_sum); lo != hi) {
    std::fprintf(stderr, "rank %d: the ranks generated different data (checksums %.17g..%.17g)\n",
                 env.rank, lo, hi);
    return 1;
  }

  torch::manual_seed(kModelSeed);
  torch::nn::Sequential model(torch::nn::Linear(kFeatures, kHidden), torch::nn::ReLU(),
                              torch::nn::Linear(kHidden, kClasses));
  std::vector<torch::Tensor> params = model->parameters();
  // As DDP does: start every rank from rank 0's weights.
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> pieces;
    for (auto& p : params) pieces.push_back(p.reshape({-1}));
    std::vector<torch::Tensor> flat{torch::cat(pieces)};
    pg->broadcast(flat)->wait();
    int64_t offset = 0;
    for (auto& p : params) {
      p.copy_(flat[0].slice(0, offset, offset + p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(flags.lr).momentum(0.9));

  const int64_t global_batch = flags.batch_size;
  const int64_t steps_per_epoch = (kTrainSamples + global_batch - 1) / global_batch;
  int64_t grad_numel = 0;
  for (auto& p : params) grad_numel += p.numel();
  torch::Tensor grad_buffer = torch::zeros({grad_numel}, torch::kFloat32);

  double timed_ms = 0;
  int64_t timed_steps = 0;
  double last_epoch_loss = 0;
  namespace F = torch::nn::functional;
  for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
    model->train();
    stage = "training (epoch " + std::to_string(epoch) + ")";
    // The same permutation on every rank: seeded by the epoch only.
    auto epoch_gen = at::detail::createCPUGenerator(kDataSeed + static_cast<uint64_t>(epoch));
    torch::Tensor order = torch::randperm(kTrainSamples, epoch_gen, torch::kLong);
    double local_loss = 0;  // summed over this rank's samples
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      auto t0 = std::chrono::steady_clock::now();
      int64_t begin = step * global_batch;
      int64_t end = std::min(begin + global_batch, kTrainSamples);
      torch::Tensor idx = Shard(order.slice(0, begin, end), env.rank, env.world_size);
      torch::Tensor x = data.x_train.index_select(0, idx);
      torch::Tensor y = data.y_train.index_select(0, idx);

      optimizer.zero_grad();
      // Summed here and divided by the global batch: after the SUM allreduce every rank holds
      // the gradient of the global batch's mean loss, however unevenly the batch was split.
      torch::Tensor loss_sum =
          F::cross_entropy(model->forward(x), y, F::CrossEntropyFuncOptions().reduction(torch::kSum));
      (loss_sum / static_cast<double>(end - begin)).backward();
      local_loss += loss_sum.item<double>();

      int64_t offset = 0;
      for (auto& p : params) {
        auto slot = grad_buffer.slice(0, offset, offset + p.numel());
        if (p.grad().defined()) {
          slot.copy_(p.grad().reshape({-1}));
        } else {
          slot.zero_();  // an empty shard: this rank contributes nothing
        }
        offset += p.numel();
      }
      AllreduceInPlace(*pg, grad_buffer, c10d::ReduceOp::SUM);
      offset = 0;
      for (auto& p : params) {
        auto reduced = grad_buffer.slice(0, offset, offset + p.numel()).view_as(p);
        if (p.grad().defined()) {
          p.mutable_grad().copy_(reduced);
        } else {
          p.mutable_grad() = reduced.clone();
        }
        offset += p.numel();
      }
      optimizer.step();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                      .count();
      // Like the Python demo: the first epoch is warmup (unless it is the only one).
      if (epoch > 1 || flags.epochs == 1) {
        timed_ms += ms;
        ++timed_steps;
      }
    }
    torch::Tensor epoch_loss = torch::full({1}, local_loss, torch::kFloat64);
    AllreduceInPlace(*pg, epoch_loss, c10d::ReduceOp::SUM);
    last_epoch_loss = epoch_loss.item<double>() / static_cast<double>(kTrainSamples);
    if (chief) {
      std::printf("epoch %d/%d loss %.4f\n", epoch, flags.epochs, last_epoch_loss);
      std::fflush(stdout);
    }
  }

  // Held-out accuracy: each rank scores its shard, the counts are summed.
  stage = "evaluating";
  model->eval();
  torch::Tensor counts = torch::zeros({2}, torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    torch::Tensor idx = Shard(torch::arange(kTestSamples, torch::kLong), env.rank, env.world_size);
    torch::Tensor pred = model->forward(data.x_test.index_select(0, idx)).argmax(1);
    counts[0] = pred.eq(data.y_test.index_select(0, idx)).sum().item<double>();
    counts[1] = static_cast<double>(idx.size(0));
  }
  AllreduceInPlace(*pg, counts, c10d::ReduceOp::SUM);
  const double accuracy = counts[0].item<double>() / counts[1].item<double>();

  // The ranks must have trained the same model.
  const double weights_sum = Checksum(params);
  auto [lo, hi] = MinMax(*pg, weights_sum);
  const bool agree = lo == hi;
  pg->barrier()->wait();

  int rc = 0;
  if (!agree) {
    std::fprintf(stderr, "rank %d: weight checksums differ between ranks: %.17g .. %.17g\n",
                 env.rank, lo, hi);
    rc = 1;
  }
  if (accuracy < flags.min_accuracy) {
    if (chief) {
      std::fprintf(stderr, "held-out accuracy %.4f is below --min-accuracy %.4f\n", accuracy,
                   flags.min_accuracy);
    }
    rc = 1;
  }
  if (chief && rc == 0 && !flags.publish.empty()) {
    stage = "publishing";
    const std::string saved = (env.job_dir.empty() ? std::string(".") : env.job_dir) +
                              "/libtorch-trainer-" + flags.publish + ".pt";
    ExportTorchScript(model).save(saved);
    shoal::sdk::PublishOptions options;
    options.step = static_cast<uint64_t>(flags.epochs) * static_cast<uint64_t>(steps_per_epoch);
    options.metrics = {{"accuracy", accuracy}, {"loss", last_epoch_loss}};
    shoal::sdk::PublishResult published = shoal::sdk::PublishModel(saved, flags.publish, options);
    std::remove(saved.c_str());
    if (!published.ok) {
      std::fprintf(stderr, "libtorch-trainer: %s\n", published.error.c_str());
      rc = 1;
    } else {
      std::printf("published %s version %" PRIu64 " (%s)\n", flags.publish.c_str(),
                  published.version, published.path.c_str());
    }
  }
  if (chief) {
    std::printf("weights checksum %.17g (%s across %d ranks)\n", weights_sum,
                agree ? "identical" : "DIFFERENT", env.world_size);
    std::printf(
        "{\"metric\": \"accuracy\", \"value\": %.4f, \"mean_step_ms\": %.3f, \"steps\": %" PRId64
        ", \"world_size\": %d}\n",
        accuracy, timed_steps > 0 ? timed_ms / static_cast<double>(timed_steps) : 0.0,
        timed_steps, env.world_size);
    std::printf("final_accuracy=%.3f\n", accuracy);
    std::fflush(stdout);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  Env env;
  try {
    flags = ParseFlags(argc, argv);
    env = ReadEnv();
    if (flags.batch_size < env.world_size) {
      throw UsageError{"--batch-size " + std::to_string(flags.batch_size) +
                       " is smaller than WORLD_SIZE " + std::to_string(env.world_size) +
                       ": every rank needs a share of each global batch"};
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "libtorch-trainer: %s\n", e.message.c_str());
    return kUsageError;
  }
  std::string stage = "starting";
  try {
    return Run(flags, env, stage);
  } catch (const c10::Error& e) {
    // Timeouts, refused connections, a peer that died mid-collective; without the C++ backtrace.
    std::fprintf(stderr, "libtorch-trainer: rank %d failed while %s: %s\n", env.rank,
                 stage.c_str(), e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    // gloo's own exceptions, our rendezvous errors.
    std::fprintf(stderr, "libtorch-trainer: rank %d failed while %s: %s\n", env.rank,
                 stage.c_str(), e.what());
    return 1;
  }
}
