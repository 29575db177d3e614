// The master's control plane refuses bad callers and bad agents, and changes nothing for them.
// A real Master on loopback; the backend grants places but starts nothing, so the test plays
// the agents itself over the real protocol.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "common/clock.h"
#include "common/journal.h"
#include "master/master.h"
#include "shoal/v1/shoal.grpc.pb.h"

namespace shoal::master {
namespace {

class GrantOnlyBackend final : public backends::Backend {
 public:
  explicit GrantOnlyBackend(bool signals_tasks_from_outside = false,
                            std::chrono::milliseconds outside_stop_settle =
                                std::chrono::milliseconds(2000))
      : signals_tasks_from_outside_(signals_tasks_from_outside),
        outside_stop_settle_(outside_stop_settle) {}
  std::string Name() const override { return "test"; }
  // Like Slurm's and YARN's: their resource manager signals tasks and agents itself.
  bool SignalsTasksFromOutside() const override { return signals_tasks_from_outside_; }
  std::chrono::milliseconds OutsideStopSettle() const override { return outside_stop_settle_; }
  absl::StatusOr<std::vector<backends::NodeGrant>> Acquire(const spec::JobSpec&,
                                                           const std::string&) override {
    backends::NodeGrant grant;
    grant.name = "node-a";
    grant.address = "127.0.0.1";
    grant.cpus = 4;
    grant.memory_bytes = 1ull << 30;
    return std::vector<backends::NodeGrant>{grant};
  }
  absl::Status StartAgents(const backends::AgentStartOptions&) override {
    return absl::OkStatus();
  }
  void SetPlaceLostCallback(PlaceLostCallback) override {}
  void TerminatePlace(const std::string&) override {}
  void Release() override {}

 private:
  const bool signals_tasks_from_outside_;
  const std::chrono::milliseconds outside_stop_settle_;
};

class MasterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MasterOptions options = Options();
    options.heartbeat_interval = std::chrono::milliseconds(20);
    auto m = Master::Create(options, std::make_unique<GrantOnlyBackend>(
                                         SignalsTasksFromOutside(), OutsideStopSettle()));
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = std::move(*m);
    ASSERT_TRUE(master_->Start().ok());
    stub_ = v1::Master::NewStub(
        grpc::CreateChannel(master_->address(), grpc::InsecureChannelCredentials()));
  }

  virtual bool SignalsTasksFromOutside() const { return false; }
  virtual std::chrono::milliseconds OutsideStopSettle() const {
    return std::chrono::milliseconds(2000);
  }

  // A one-task job in a fresh directory of this test, on the fake clock.
  MasterOptions Options() {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-master-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    spec::JobSpec job;
    job.name = "svc";
    spec::Role role;
    role.name = "worker";
    role.instances = 1;
    role.argv = {"/bin/true"};
    role.working_dir = "/";
    job.roles.push_back(role);
    job.success_roles = {"worker"};
    MasterOptions options;
    options.job_id = "svc-test";
    options.job_dir = dir_.string();
    options.spec = job;
    options.token = "right-token";
    options.clock = &clock_;
    return options;
  }

  void TearDown() override {
    if (master_) master_->Kill("test over");
    master_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Opens an agent stream with `token`, sends `reg`, returns the first reply (or the status
  // the stream ended with).
  std::pair<std::optional<v1::MasterMessage>, grpc::Status> RegisterWith(
      const std::string& token, const v1::AgentMessage& reg) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->AgentSession(&ctx);
    stream->Write(reg);
    v1::MasterMessage reply;
    std::optional<v1::MasterMessage> got;
    if (stream->Read(&reply)) {
      got = reply;
      ctx.TryCancel();  // done with it; otherwise the stream already ended with its status
    }
    return {got, stream->Finish()};
  }

  static v1::AgentMessage Registration(const std::string& node, int version) {
    v1::AgentMessage m;
    m.mutable_register_()->set_version(static_cast<v1::ProtocolVersion>(version));
    m.mutable_register_()->set_node_name(node);
    m.mutable_register_()->mutable_inventory()->set_address("127.0.0.1");
    m.mutable_register_()->add_free_ports(23456);
    return m;
  }

  std::vector<nlohmann::json> Events(const std::string& type) {
    std::vector<nlohmann::json> out;
    auto all = Journal::ReadAll((dir_ / "events.jsonl").string());
    if (!all.ok()) return out;
    for (auto& r : *all) {
      if (r.value("type", "") == type) out.push_back(r);
    }
    return out;
  }

  // Waits, up to 10 s of real time, for the master's loop to journal a record of `type`.
  bool JournalGets(const std::string& type) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Events(type).empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return !Events(type).empty();
  }

  FakeClock clock_;
  std::filesystem::path dir_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<v1::Master::Stub> stub_;
};

TEST_F(MasterServiceTest, ClientWithoutTheTokenIsRefusedAndLearnsNothing) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer wrong-token");
  v1::JobStatus status;
  grpc::Status st = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &status);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(status.job_id().empty());
}

TEST_F(MasterServiceTest, KillWithoutTheTokenChangesNothing) {
  grpc::ClientContext ctx;  // no authorization at all
  v1::KillReply reply;
  grpc::Status st = stub_->Kill(&ctx, v1::KillRequest(), &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Events("kill_requested").empty());
}

TEST_F(MasterServiceTest, WatcherWithoutTheTokenIsRefusedAndLearnsNothing) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer wrong-token");
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub_->Watch(&ctx, v1::WatchRequest());
  v1::WatchEvent event;
  EXPECT_FALSE(stream->Read(&event));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// The watch stream (what `shoal run` follows): the status first, every change after it, and
// the end of the stream once the job has finished. Several at once, each served without a
// thread of its own.
TEST_F(MasterServiceTest, WatchersGetTheStatusFirstAndTheStreamEndsWithTheJob) {
  constexpr int kWatchers = 3;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::WatchEvent>>> streams;
  for (int i = 0; i < kWatchers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->AddMetadata("authorization", "Bearer right-token");
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    streams.push_back(stub_->Watch(contexts.back().get(), v1::WatchRequest()));
  }
  for (auto& stream : streams) {
    v1::WatchEvent first;
    ASSERT_TRUE(stream->Read(&first));
    EXPECT_TRUE(first.has_status());
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer right-token");
    v1::KillReply reply;
    ASSERT_TRUE(stub_->Kill(&ctx, v1::KillRequest(), &reply).ok());
  }
  for (auto& stream : streams) {
    v1::WatchEvent event;
    v1::JobStatus last;
    while (stream->Read(&event)) {
      if (event.has_status()) last = event.status();
    }
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(last.job_id(), "svc-test");
    EXPECT_EQ(last.state(), v1::JOB_STATE_KILLED) << last.DebugString();
    EXPECT_NE(last.finished_unix_ms(), 0);
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer right-token");
  v1::JobStatus status;
  ASSERT_TRUE(stub_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.state(), v1::JOB_STATE_KILLED);
}

// A watcher that goes away, and one still open when the master stops, hold nothing up.
TEST_F(MasterServiceTest, MasterStopsWithWatchersOpenOrGone) {
  grpc::ClientContext gone;
  gone.AddMetadata("authorization", "Bearer right-token");
  auto gone_stream = stub_->Watch(&gone, v1::WatchRequest());
  v1::WatchEvent event;
  ASSERT_TRUE(gone_stream->Read(&event));
  gone.TryCancel();
  EXPECT_FALSE(gone_stream->Read(&event));
  gone_stream->Finish();

  grpc::ClientContext open;
  open.AddMetadata("authorization", "Bearer right-token");
  auto open_stream = stub_->Watch(&open, v1::WatchRequest());
  ASSERT_TRUE(open_stream->Read(&event));
  master_.reset();  // the job still runs: the stream is cut, not finished
  while (open_stream->Read(&event)) {
  }
  EXPECT_FALSE(open_stream->Finish().ok());
}

TEST_F(MasterServiceTest, AgentWithoutTheTokenIsRefused) {
  auto [reply, st] = RegisterWith("wrong-token", Registration("node-a", 1));
  EXPECT_FALSE(reply.has_value());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Events("agent_registered").empty());
}

TEST_F(MasterServiceTest, AgentOfAnotherProtocolVersionIsRefusedWithTheReason) {
  auto [reply, st] = RegisterWith("right-token", Registration("node-a", 99));
  ASSERT_TRUE(reply.has_value()) << st.error_message();
  ASSERT_TRUE(reply->has_register_reply());
  EXPECT_FALSE(reply->register_reply().accepted());
  EXPECT_NE(reply->register_reply().reason().find("protocol version 99"), std::string::npos)
      << reply->register_reply().reason();
  EXPECT_TRUE(Events("agent_registered").empty());
  EXPECT_EQ(Events("agent_refused").size(), 1u);
}

TEST_F(MasterServiceTest, AgentForANodeThatWasNotGrantedIsRefused) {
  auto [reply, st] = RegisterWith("right-token", Registration("node-zzz", 1));
  ASSERT_TRUE(reply.has_value()) << st.error_message();
  EXPECT_FALSE(reply->register_reply().accepted());
  EXPECT_NE(reply->register_reply().reason().find("node-zzz"), std::string::npos);
  EXPECT_TRUE(Events("rendezvous").empty());
}

// Time is the fake clock's: the agent stays connected but sends nothing, and three missed
// heartbeats pass without anyone sleeping for them.
TEST_F(MasterServiceTest, SilentAgentIsDeclaredLostOnceItsHeartbeatsAreMissed) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer right-token");
  auto stream = stub_->AgentSession(&ctx);
  ASSERT_TRUE(stream->Write(Registration("node-a", 1)));
  v1::MasterMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.register_reply().accepted()) << reply.register_reply().reason();
  EXPECT_TRUE(Events("agent_silent").empty());
  clock_.Advance(std::chrono::seconds(10));
  ASSERT_TRUE(JournalGets("agent_silent"));
  auto silent = Events("agent_silent");
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].value("node", ""), "node-a");
  ctx.TryCancel();
  stream->Finish();
}

// The registration deadline is a timer of the master's loop on the master's clock: 30 s of it
// pass in an instant, and nobody sleeps for them.
TEST_F(MasterServiceTest, AgentThatNeverRegistersFailsTheJobOnceTheRegisterTimeoutHasPassed) {
  // Admitted means the deadline is set: both happen in one batch of the loop, journalled after.
  ASSERT_TRUE(JournalGets("admitted"));
  EXPECT_TRUE(Events("job_finished").empty());
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(JournalGets("job_finished")) << "the register timeout never fired";
  auto finished = Events("job_finished");
  EXPECT_EQ(finished[0].value("outcome", ""), "failed");
  EXPECT_NE(finished[0].value("reason", "").find("node-a did not register within 30.0s"),
            std::string::npos)
      << finished[0].dump();
}

class ResourceManagerSignalsTasksTest : public MasterServiceTest {
 protected:
  bool SignalsTasksFromOutside() const override { return true; }

  using AgentStream = grpc::ClientReaderWriter<v1::AgentMessage, v1::MasterMessage>;

  // Plays the agent of node-a until its task runs, then reports it killed by SIGKILL that the
  // agent did not send (the resource manager's).
  std::unique_ptr<AgentStream> AgentWhoseTaskWasKilled(grpc::ClientContext* ctx) {
    ctx->AddMetadata("authorization", "Bearer right-token");
    auto stream = stub_->AgentSession(ctx);
    EXPECT_TRUE(stream->Write(Registration("node-a", 1)));
    v1::MasterMessage reply;
    while (stream->Read(&reply) && !reply.has_launch()) {
    }
    EXPECT_TRUE(reply.has_launch());
    v1::AgentMessage started;
    *started.mutable_task_started()->mutable_task() = reply.launch().task();
    started.mutable_task_started()->set_pid(4242);
    EXPECT_TRUE(stream->Write(started));
    v1::AgentMessage exited;
    *exited.mutable_task_exited()->mutable_task() = reply.launch().task();
    exited.mutable_task_exited()->set_signal(SIGKILL);
    EXPECT_TRUE(stream->Write(exited));
    return stream;
  }

  // Moves the fake clock on until the job has finished; returns its journal record. With
  // `agent`, heartbeats on it as it goes, so that the agent is never silent for long.
  nlohmann::json FinishedAfterSettling(
      AgentStream* agent = nullptr) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (Events("job_finished").empty() && std::chrono::steady_clock::now() < deadline) {
      if (agent != nullptr) {
        v1::AgentMessage beat;
        beat.mutable_heartbeat()->set_sequence(1);
        agent->Write(beat);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      clock_.Advance(std::chrono::milliseconds(agent != nullptr ? 20 : 500));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto finished = Events("job_finished");
    return finished.empty() ? nlohmann::json() : finished.front();
  }
};

// Slurm taking a node down SIGKILLs the task and the agent in no fixed order: the agent may
// report its task killed by signal 9 just before it says it is leaving. The task is lost with
// its place, not a task failure of its own.
TEST_F(ResourceManagerSignalsTasksTest, ATaskKilledAsItsAgentGoesIsLostWithItsPlace) {
  grpc::ClientContext ctx;
  auto stream = AgentWhoseTaskWasKilled(&ctx);
  v1::AgentMessage leaving;
  leaving.set_leaving("slurmstepd sent SIGTERM");
  ASSERT_TRUE(stream->Write(leaving));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both handled before the end
  ctx.TryCancel();
  stream->Finish();
  // The clock moves on only once the master has seen the agent go: moved before, it would
  // show the agent silent (the master checks heartbeats as soon as time passes).
  ASSERT_TRUE(JournalGets("agent_disconnected"));

  auto finished = FinishedAfterSettling();
  ASSERT_FALSE(finished.is_null()) << "the job never finished";
  EXPECT_EQ(finished.value("outcome", ""), "failed");
  std::string reason = finished.value("reason", "");
  EXPECT_NE(reason.find("worker:0 lost"), std::string::npos) << reason;
  EXPECT_NE(reason.find("slurmstepd sent SIGTERM"), std::string::npos) << reason;
}

// The same SIGKILL with the agent staying is the task's own failure, once the settling time
// has shown that no cancellation or loss explains it.
TEST_F(ResourceManagerSignalsTasksTest, ATaskKilledWhileItsAgentStaysIsATaskFailure) {
  grpc::ClientContext ctx;
  auto stream = AgentWhoseTaskWasKilled(&ctx);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(Events("job_finished").empty()) << "judged before the settling time";

  auto finished = FinishedAfterSettling(stream.get());
  ctx.TryCancel();
  stream->Finish();
  ASSERT_FALSE(finished.is_null()) << "the job never finished";
  std::string reason = finished.value("reason", "");
  EXPECT_NE(reason.find("killed by signal 9"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("lost"), std::string::npos) << reason;
}

// Spark's backend reports a stage's kill at once: its settling time is the backend's, shorter.
class ShortSettleTest : public ResourceManagerSignalsTasksTest {
 protected:
  std::chrono::milliseconds OutsideStopSettle() const override {
    return std::chrono::milliseconds(300);
  }

  // Moves the fake clock on by `total` in 20 ms steps, heartbeating on `agent` as it goes.
  void AdvanceWithHeartbeats(AgentStream* agent, std::chrono::milliseconds total) {
    for (auto moved = std::chrono::milliseconds(0); moved < total;
         moved += std::chrono::milliseconds(20)) {
      v1::AgentMessage beat;
      beat.mutable_heartbeat()->set_sequence(1);
      agent->Write(beat);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      clock_.Advance(std::chrono::milliseconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
};

TEST_F(ShortSettleTest, ATaskKilledWhileItsAgentStaysIsJudgedAfterTheBackendsSettlingTime) {
  grpc::ClientContext ctx;
  auto stream = AgentWhoseTaskWasKilled(&ctx);
  AdvanceWithHeartbeats(stream.get(), std::chrono::milliseconds(260));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(Events("job_finished").empty()) << "judged before the backend's settling time";
  AdvanceWithHeartbeats(stream.get(), std::chrono::milliseconds(200));
  EXPECT_TRUE(JournalGets("job_finished"))
      << "not judged once the backend's 300 ms had passed (long before the default 2 s)";
  ctx.TryCancel();
  stream->Finish();
  auto finished = Events("job_finished");
  ASSERT_FALSE(finished.empty());
  EXPECT_NE(finished[0].value("reason", "").find("killed by signal 9"), std::string::npos)
      << finished[0].dump();
}

// A listening socket on a loopback port with SO_REUSEPORT, as a gRPC server's is by default:
// the socket of a previous master that has not finished exiting.
class LingeringListener {
 public:
  LingeringListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~LingeringListener() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

class MasterPortTest : public MasterServiceTest {
 protected:
  void SetUp() override {}  // each test makes its master on a port of its choosing

  std::unique_ptr<Master> MasterOn(uint16_t port, std::chrono::milliseconds patience) {
    MasterOptions options = Options();
    options.listen_port = port;
    options.listen_patience = patience;
    auto m = Master::Create(options, std::make_unique<GrantOnlyBackend>());
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
};

TEST_F(MasterPortTest, AMasterNeverSharesItsPortWithASocketStillListeningThere) {
  LingeringListener previous;
  auto master = MasterOn(previous.port(), std::chrono::milliseconds(200));
  ASSERT_NE(master, nullptr);
  absl::Status started = master->Start();
  // With SO_REUSEPORT the master would have bound beside the old socket, and the kernel would
  // have split new connections between a master and a socket nobody accepts on.
  ASSERT_FALSE(started.ok()) << "the master shares port " << previous.port();
  EXPECT_NE(started.message().find(absl::StrCat(":", previous.port())), std::string::npos)
      << started.message();
  EXPECT_NE(started.message().find("in use"), std::string::npos) << started.message();
  master_ = std::move(master);
}

TEST_F(MasterPortTest, ARecoveringMasterWaitsForItsPredecessorToLetGoOfThePort) {
  LingeringListener previous;
  uint16_t port = previous.port();
  auto master = MasterOn(port, std::chrono::seconds(20));
  ASSERT_NE(master, nullptr);
  std::thread release([&previous] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    previous.Close();
  });
  absl::Status started = master->Start();
  release.join();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(master->address(), absl::StrCat("127.0.0.1:", port));
  master_ = std::move(master);
}

}  // namespace
}  // namespace shoal::master
