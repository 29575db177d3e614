// The agent's end of the SDK protocol for `published` reports: what a task's SDK sends is
// relayed to the master once ParseModelPublication takes it; anything else is refused in the
// agent's log, answered with nothing (the op wants no reply) and relayed nowhere. A real
// SdkServer on an abstract socket; the valid report comes from the C++ SDK's PublishModel.
#include "agent/sdk_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common/model_publication.h"
#include "nlohmann/json.hpp"
#include "shoal/sdk.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace shoal::agent {
namespace {

namespace fs = std::filesystem;

class SdkServerPublishedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SdkServerCallbacks callbacks;
    callbacks.on_request = [this](uint64_t id, const std::string& task, uint32_t attempt,
                                  const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      relayed_.push_back({id, task, attempt, line});
      cv_.notify_all();
    };
    address_ = "@shoal-sdk-server-test-" + std::to_string(::getpid());
    auto server = SdkServer::Create(address_, callbacks);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_->TaskLaunched("worker:0", 1, std::chrono::milliseconds(0));

    previous_logger_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>(
        "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_)));
  }
  void TearDown() override {
    spdlog::set_default_logger(previous_logger_);
    for (const char* name : {"SHOAL_AGENT_SOCKET", "SHOAL_ROLE", "SHOAL_INDEX",
                             "SHOAL_RESTART_COUNT"}) {
      ::unsetenv(name);
    }
  }

  struct Relayed {
    uint64_t id;
    std::string task;
    uint32_t attempt;
    std::string line;
  };

  // Waits until `count` requests were relayed; returns them all.
  std::vector<Relayed> WaitForRelayed(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return relayed_.size() >= count; });
    return relayed_;
  }

  int Connect() {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, address_.data() + 1, address_.size() - 1);
    socklen_t len = offsetof(sockaddr_un, sun_path) + address_.size();
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
    return fd;
  }

  std::string address_;
  std::unique_ptr<SdkServer> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Relayed> relayed_;
  std::ostringstream log_;
  std::shared_ptr<spdlog::logger> previous_logger_;
};

TEST_F(SdkServerPublishedTest, TheSdksReportIsRelayedWithoutAReply) {
  std::string dir = (fs::temp_directory_path() / ("shoal-sdk-server-test-" +
                                                  std::to_string(::getpid())))
                        .string();
  fs::create_directories(dir + "/repo");
  std::ofstream(dir + "/model.pt") << "PK model";
  ::setenv("SHOAL_AGENT_SOCKET", address_.c_str(), 1);
  ::setenv("SHOAL_ROLE", "worker", 1);
  ::setenv("SHOAL_INDEX", "0", 1);
  ::setenv("SHOAL_RESTART_COUNT", "1", 1);
  sdk::PublishOptions options;
  options.repository = dir + "/repo";
  options.step = 1200;
  options.metrics = {{"loss", 0.12}};
  sdk::PublishResult published = sdk::PublishModel(dir + "/model.pt", "mlp", options);
  fs::remove_all(dir);
  ASSERT_TRUE(published.ok) << published.error;

  auto relayed = WaitForRelayed(1);
  ASSERT_EQ(relayed.size(), 1u);
  // The task wants no reply, but the master's acknowledgement of this id spares a resend to a
  // master that replaces a dead one (master_outbox.h).
  EXPECT_NE(relayed[0].id, 0u);
  EXPECT_EQ(relayed[0].task, "worker:0");
  EXPECT_EQ(relayed[0].attempt, 1u);
  auto publication = ParseModelPublication(nlohmann::json::parse(relayed[0].line));
  ASSERT_TRUE(publication.ok()) << publication.status();
  EXPECT_EQ(publication->model, "mlp");
  EXPECT_EQ(publication->version, 1u);
  EXPECT_EQ(publication->repository, dir + "/repo");
  EXPECT_EQ(publication->step, std::optional<int64_t>(1200));
  EXPECT_EQ(publication->metrics, (std::map<std::string, double>{{"loss", 0.12}}));
}

TEST_F(SdkServerPublishedTest, MalformedReportsAreRefusedInTheLogAndGoNowhere) {
  std::string too_many = R"("metrics":{)";
  for (int i = 0; i < 65; ++i) too_many += (i ? "," : "") + ("\"m" + std::to_string(i) + "\":1");
  too_many += "}";
  const std::string head = R"({"op":"published","task":"worker:0","attempt":1,)";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {head + R"("version":3,"repository":"/r"})", "model must be a model name"},
      {head + R"("model":"../etc","version":3,"repository":"/r"})", "model must be a model name"},
      {head + R"("model":"m","version":0,"repository":"/r"})", "version must be an integer >= 1"},
      {head + R"("model":"m","version":"3","repository":"/r"})", "version must be an integer"},
      {head + R"("model":"m","version":3})", "repository must be a non-empty string"},
      {head + R"("model":"m","version":3,"repository":"/r","step":-5})",
       "step must be an integer >= 0"},
      {head + R"("model":"m","version":3,"repository":"/r","metrics":[1]})",
       "metrics must be an object"},
      {head + R"("model":"m","version":3,"repository":"/r","metrics":{"loss":"low"}})",
       "metric 'loss' must be a finite number"},
      {head + R"("model":"m","version":3,"repository":"/r","metrics":{"deep":{"a":1}}})",
       "metric 'deep' must be a finite number"},
      {head + R"("model":"m","version":3,"repository":"/r",)" + too_many + "}",
       "metrics has 65 entries; at most 64"},
  };
  int fd = Connect();
  std::string lines;
  for (const auto& [line, why] : bad) lines += line + "\n";
  // A stale attempt's report is dropped as quietly as its checkpoints; then a good one, which
  // tells the test that everything before it was handled.
  lines += R"({"op":"published","task":"worker:0","attempt":0,"model":"m","version":2,)"
           R"("repository":"/r"})" "\n";
  lines += head + R"("model":"m","version":3,"repository":"/r"})" "\n";
  ASSERT_EQ(::send(fd, lines.data(), lines.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(lines.size()));
  auto relayed = WaitForRelayed(1);
  ASSERT_EQ(relayed.size(), 1u);
  EXPECT_NE(relayed[0].line.find(R"("version":3)"), std::string::npos) << relayed[0].line;
  // No reply came back for any of them.
  char buffer[256];
  EXPECT_EQ(::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  ::close(fd);
  spdlog::default_logger()->flush();
  std::string log = log_.str();
  for (const auto& [line, why] : bad) {
    EXPECT_NE(log.find("task worker:0 attempt 1: refused a 'published' report: " + why),
              std::string::npos)
        << why << "\nlog:\n" << log;
  }
}

}  // namespace
}  // namespace shoal::agent
