// Control-plane scale of one master, over loopback gRPC, with simulated agents:
//  1. rendezvous: N agents (one task each) connect and register at once; measured from the
//     first connect to the moment every agent holds its TaskLaunch.
//  2. heartbeat: A agents x T tasks heartbeat once a second; the master's CPU use (its own
//     process, from /proc/<pid>/stat) over a steady window, as a percentage of one core.
// The master runs the real Master class in a child process with a backend that grants N
// simulated nodes; the agents are gRPC callback-API clients speaking the real protocol.
// Prints one JSON object.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "master/master.h"
#include "nlohmann/json.hpp"
#include "shoal/v1/shoal.grpc.pb.h"

namespace {

using namespace shoal;
using SteadyClock = std::chrono::steady_clock;
std::atomic<int> registered{0};  // RegisterReply messages received, over all simulated agents

class SimulatedBackend final : public backends::Backend {
 public:
  SimulatedBackend(uint32_t nodes, uint32_t tasks_per_node) : nodes_(nodes), per_node_(tasks_per_node) {}
  std::string Name() const override { return "simulated"; }
  absl::StatusOr<std::vector<backends::NodeGrant>> Acquire(const spec::JobSpec&, const std::string&) override {
    std::vector<backends::NodeGrant> grants;
    for (uint32_t i = 0; i < nodes_; ++i) {
      backends::NodeGrant grant;
      grant.name = "sim-" + std::to_string(i);
      grant.address = "127.0.0.1";
      grant.cpus = static_cast<double>(per_node_);
      grant.memory_bytes = uint64_t{1} << 40;
      grants.push_back(std::move(grant));
    }
    return grants;
  }
  absl::Status StartAgents(const backends::AgentStartOptions&) override { return absl::OkStatus(); }
  void SetPlaceLostCallback(PlaceLostCallback) override {}
  void TerminatePlace(const std::string&) override {}
  void Release() override {}

 private:
  uint32_t nodes_, per_node_;
};

// Runs in the child: a real master for a job of nodes x per_node tasks. Writes its address to
// `fd` and serves until killed.
[[noreturn]] void RunMaster(int fd, const std::string& dir, uint32_t nodes, uint32_t per_node) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as `shoal master` does
  spec::JobSpec job;
  job.name = "bench";
  spec::Role role;
  role.name = "worker";
  role.instances = nodes * per_node;
  role.argv = {"/bin/true"};
  role.resources.cpus = 1;
  role.working_dir = "/";
  job.roles.push_back(role);
  job.success_roles = {"worker"};
  master::MasterOptions options;
  options.job_id = "bench";
  options.job_dir = dir;
  options.spec = job;
  options.token = "bench-token";
  options.register_timeout = std::chrono::seconds(120);
  auto m = master::Master::Create(options, std::make_unique<SimulatedBackend>(nodes, per_node));
  if (!m.ok() || !(*m)->Start().ok()) _exit(2);
  std::string address = (*m)->address() + "\n";
  if (write(fd, address.data(), address.size()) < 0) _exit(2);
  close(fd);
  for (;;) pause();
}

// One simulated agent: the real protocol over its own connection.
class SimAgent final : public grpc::ClientBidiReactor<v1::AgentMessage, v1::MasterMessage> {
 public:
  SimAgent(v1::Master::Stub* stub, std::string node, uint32_t tasks, std::atomic<int>* launched_agents,
           std::atomic<int>* launches, uint32_t tasks_per_agent)
      : node_(std::move(node)), tasks_(tasks), launched_agents_(launched_agents), launches_(launches),
        tasks_per_agent_(tasks_per_agent) {
    context_.AddMetadata("authorization", "Bearer bench-token");
    stub->async()->AgentSession(&context_, this);
    v1::AgentMessage reg;
    auto* r = reg.mutable_register_();
    r->set_version(v1::PROTOCOL_VERSION_CURRENT);
    r->set_node_name(node_);
    r->mutable_inventory()->set_address("127.0.0.1");
    for (uint32_t p = 0; p < tasks_; ++p) r->add_free_ports(20000 + p);
    Enqueue(reg);
    StartRead(&in_);
    StartCall();
  }

  void Heartbeat() {
    v1::AgentMessage hb;
    hb.mutable_heartbeat()->set_sequence(++seq_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& t : running_) {
        auto* p = hb.mutable_heartbeat()->add_tasks();
        *p->mutable_task() = t;
        p->set_step(seq_);
      }
    }
    Enqueue(hb);
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_register_reply()) registered.fetch_add(1);
    if (in_.has_launch()) {
      v1::AgentMessage started;
      *started.mutable_task_started()->mutable_task() = in_.launch().task();
      started.mutable_task_started()->set_pid(1);
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_.push_back(in_.launch().task());
      }
      Enqueue(started);
      if (++launches_here_ == tasks_per_agent_) launched_agents_->fetch_add(1);
      launches_->fetch_add(1);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    writing_ = ok && !out_.empty();
    if (writing_) StartWrite(&out_.front());
  }

  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  void Enqueue(const v1::AgentMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    out_.push_back(m);
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  grpc::ClientContext context_;
  std::string node_;
  uint32_t tasks_;
  std::atomic<int>* launched_agents_;
  std::atomic<int>* launches_;
  uint32_t tasks_per_agent_;
  uint32_t launches_here_ = 0;
  uint64_t seq_ = 0;
  v1::MasterMessage in_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::AgentMessage> out_;
  std::vector<v1::TaskId> running_;
  bool writing_ = false;
  bool done_ = false;
};

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(content.substr(content.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    rest >> field;
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Scenario {
  pid_t master_pid;
  std::string address;
  std::string dir;
};

Scenario StartMasterProcess(uint32_t nodes, uint32_t per_node, const std::string& name) {
  std::string dir = (std::filesystem::temp_directory_path() /
                     ("shoal-bench-" + name + "-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A fresh process (fork + exec), not a fork of this one: gRPC's threads do not survive fork.
  int fds[2];
  if (pipe(fds) != 0) std::exit(1);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 3);
    std::string n = std::to_string(nodes), t = std::to_string(per_node);
    execl("/proc/self/exe", "control_plane_bench", "--serve-master", dir.c_str(), n.c_str(),
          t.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string address;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') address += c;
  close(fds[0]);
  return {pid, address, dir};
}

void StopMasterProcess(const Scenario& s) {
  kill(s.master_pid, SIGKILL);
  waitpid(s.master_pid, nullptr, 0);
  if (!std::getenv("SHOAL_BENCH_KEEP")) std::filesystem::remove_all(s.dir);
}

struct Agents {
  std::vector<std::unique_ptr<v1::Master::Stub>> stubs;
  std::vector<std::unique_ptr<SimAgent>> agents;
  std::atomic<size_t> connected{0};  // agents[0, connected) are ready for other threads
  std::atomic<int> launched_agents{0};
  std::atomic<int> launches{0};
};

// Opens one connection per agent (as separate machines would have) and waits until each is
// established, so that the timed part measures the master, not this process creating sockets.
void OpenChannels(Agents& a, const std::string& address, uint32_t count) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (uint32_t i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    channels.back()->GetState(/*try_to_connect=*/true);
  }
  for (auto& c : channels) {
    c->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30));
    a.stubs.push_back(v1::Master::NewStub(c));
  }
}

void Connect(Agents& a, const std::string& address, uint32_t count, uint32_t per_agent) {
  if (a.stubs.empty()) OpenChannels(a, address, count);
  a.agents.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    a.agents.push_back(std::make_unique<SimAgent>(a.stubs.back().get(), "sim-" + std::to_string(i),
                                                  per_agent, &a.launched_agents, &a.launches, per_agent));
    a.connected.store(i + 1);
  }
}

void Disconnect(Agents& a) {
  for (auto& agent : a.agents) agent->Cancel();
  for (auto& agent : a.agents) agent->WaitDone();
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::seconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  while (!cond()) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--serve-master") {
    RunMaster(3, argv[2], static_cast<uint32_t>(std::stoul(argv[3])),
              static_cast<uint32_t>(std::stoul(argv[4])));
  }
  uint32_t rendezvous_agents = 1024, reps = 3, hb_agents = 1000, hb_tasks = 10, hb_seconds = 10,
           hb_period_ms = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    uint32_t v = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    if (flag == "--agents") rendezvous_agents = v;
    else if (flag == "--reps") reps = v;
    else if (flag == "--hb-agents") hb_agents = v;
    else if (flag == "--hb-tasks") hb_tasks = v;
    else if (flag == "--hb-seconds") hb_seconds = v;
    else if (flag == "--hb-period-ms") hb_period_ms = v;
  }
  rlimit nofile;
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);

  nlohmann::json result;
  // 1. Rendezvous of N agents, measured `reps` times on fresh masters.
  std::vector<double> rendezvous_ms;
  for (uint32_t r = 0; r < reps; ++r) {
    Scenario s = StartMasterProcess(rendezvous_agents, 1, "rdzv");
    Agents a;
    registered = 0;
    OpenChannels(a, s.address, rendezvous_agents);
    auto start = SteadyClock::now();
    Connect(a, s.address, rendezvous_agents, 1);
    double connect_ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
    WaitFor([&] { return registered.load() == static_cast<int>(rendezvous_agents); }, std::chrono::seconds(60));
    double registered_ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
    bool ok = WaitFor([&] { return a.launched_agents.load() == static_cast<int>(rendezvous_agents); },
                      std::chrono::seconds(60));
    double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
    std::fprintf(stderr, "rendezvous of %u agents: %.1f ms%s (sessions opened by %.1f ms, all registered by %.1f ms)\n",
                 rendezvous_agents, ms, ok ? "" : " (TIMED OUT)", connect_ms, registered_ms);
    rendezvous_ms.push_back(ok ? ms : -1);
    Disconnect(a);
    StopMasterProcess(s);
  }
  result["rendezvous"] = {{"agents", rendezvous_agents},
                          {"runs_ms", rendezvous_ms},
                          {"median_ms", Percentile(rendezvous_ms, 0.5)},
                          {"max_ms", Percentile(rendezvous_ms, 1.0)},
                          {"target_ms", 1000},
                          {"target_met", Percentile(rendezvous_ms, 1.0) > 0 &&
                                             Percentile(rendezvous_ms, 1.0) < 1000}};

  // 2. Heartbeats of hb_agents x hb_tasks tasks, once a second.
  {
    Scenario s = StartMasterProcess(hb_agents, hb_tasks, "hb");
    Agents a;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> sent{0};
    // Spread each second's heartbeats evenly, as independent agents would.
    std::thread beater([&] {
      auto next = SteadyClock::now();
      while (!stop) {
        for (size_t i = 0; i < hb_agents && !stop; ++i) {
          if (i < a.connected.load()) {
            a.agents[i]->Heartbeat();
            ++sent;
          }
          next += std::chrono::microseconds(hb_period_ms * 1000ull / hb_agents);
          std::this_thread::sleep_until(next);
        }
      }
    });
    // Agents heartbeat from the moment they connect, as real ones do.
    Connect(a, s.address, hb_agents, hb_tasks);
    bool ok = WaitFor([&] { return a.launches.load() == static_cast<int>(hb_agents * hb_tasks); },
                      std::chrono::seconds(120));
    std::fprintf(stderr, "heartbeat scenario: %d tasks running%s\n", a.launches.load(), ok ? "" : " (TIMED OUT)");
    // Settle past the launch burst: measure the steady state only.
    std::this_thread::sleep_for(std::chrono::seconds(3));
    double cpu0 = ProcessCpuSeconds(s.master_pid);
    uint64_t sent0 = sent.load();
    auto t0 = SteadyClock::now();
    std::this_thread::sleep_for(std::chrono::seconds(hb_seconds));
    double cpu1 = ProcessCpuSeconds(s.master_pid);
    double wall = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    uint64_t beats = sent.load() - sent0;
    stop = true;
    beater.join();
    double percent = 100.0 * (cpu1 - cpu0) / wall;
    // A heartbeat the master failed to see in time would show as agent_silent: count them, so
    // a master too slow to keep up cannot pass by going quiet.
    int silent = 0;
    {
      std::ifstream events(s.dir + "/events.jsonl");
      std::string line;
      while (std::getline(events, line)) silent += line.find("\"agent_silent\"") != std::string::npos;
    }
    std::fprintf(stderr, "master CPU with %u tasks heartbeating: %.2f%% of one core\n", hb_agents * hb_tasks, percent);
    result["heartbeat"] = {{"agents", hb_agents},
                           {"tasks", hb_agents * hb_tasks},
                           {"window_s", wall},
                           {"agent_heartbeats_per_s", beats / wall},
                           {"task_reports_per_s", beats * hb_tasks / wall},
                           {"master_cpu_percent_of_one_core", percent},
                           {"agents_declared_silent", silent},
                           {"target_percent", 10},
                           {"target_met", ok && silent == 0 && percent < 10}};
    Disconnect(a);
    StopMasterProcess(s);
  }
  std::cout << result.dump(2) << std::endl;
  return 0;
}
