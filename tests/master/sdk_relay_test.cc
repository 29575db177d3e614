// The master's side of the `published` report: a publication relayed by an agent is journaled
// as model_published (and becomes the job's last publication); one whose fields the master
// would not take from a task, or of an attempt that is not current, records nothing.
#include "master/sdk_relay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "master/journal_records.h"
#include "shoal/v1/shoal.pb.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

class RecordingHost final : public SdkRelay::Host {
 public:
  explicit RecordingHost(JournaledState* job) : job_(job) {}
  void Record(JournalRecord record) override {
    JournalEntry entry{record, 1796460031092000};
    ASSERT_TRUE(Apply(entry, *job_, RecordSource::kLive, Clock::TimePoint{}).ok());
    records.push_back(std::move(record));
  }
  void Reply(uint64_t, uint64_t request_id, const nlohmann::json& reply) override {
    replies.emplace_back(request_id, reply);
  }
  uint64_t PostAfter(std::chrono::milliseconds, std::function<void()>) override { return 0; }
  void Checkpointed() override {}

  std::vector<JournalRecord> records;
  std::vector<std::pair<uint64_t, nlohmann::json>> replies;

 private:
  JournaledState* job_;
};

class SdkRelayPublishedTest : public ::testing::Test {
 protected:
  SdkRelayPublishedTest()
      : spec_(*spec::ParseJobSpec(R"(
name: publisher
roles:
  trainer:
    instances: 1
    command: ["/bin/true"]
)",
                                  "job.yaml", "/tmp", /*sections=*/{})),
        job_("publisher-1", spec_),
        host_(&job_),
        relay_(&job_, &host_, &clock_) {}

  void Relay(const std::string& json, uint32_t attempt = 0, uint64_t request_id = 0) {
    v1::AgentMessage m;
    m.mutable_sdk()->set_request_id(request_id);
    m.mutable_sdk()->mutable_task()->set_role("trainer");
    m.mutable_sdk()->mutable_task()->set_index(0);
    m.mutable_sdk()->mutable_task()->set_attempt(attempt);
    m.mutable_sdk()->set_json(json);
    relay_.OnRequest(/*session=*/1, m);
  }

  spec::JobSpec spec_;
  JournaledState job_;
  FakeClock clock_;
  RecordingHost host_;
  SdkRelay relay_;
};

TEST_F(SdkRelayPublishedTest, APublicationIsJournaledAndBecomesTheLast) {
  Relay(R"({"op":"published","task":"trainer:0","attempt":0,"model":"mlp","version":7,)"
        R"("repository":"/srv/models","step":1200,"metrics":{"loss":0.12}})");
  Relay(R"({"op":"published","task":"trainer:0","attempt":0,"model":"mlp","version":8,)"
        R"("repository":"/srv/models"})");
  ASSERT_EQ(host_.records.size(), 2u);
  EXPECT_EQ(ToJson(host_.records[0]),
            nlohmann::json::parse(R"({"type":"model_published","task":"trainer:0","model":"mlp",
              "version":7,"repository":"/srv/models","step":1200,"metrics":{"loss":0.12}})"));
  ASSERT_TRUE(job_.last_publication.has_value());
  EXPECT_EQ(job_.last_publication->record.version, 8u);
  EXPECT_FALSE(job_.last_publication->record.step.has_value());
  EXPECT_EQ(job_.last_publication->unix_ms, 1796460031092);
  EXPECT_TRUE(host_.replies.empty() ||
              std::all_of(host_.replies.begin(), host_.replies.end(),
                          [](const auto& r) { return r.first == 0; }))
      << "a published report wants no answer";
}

TEST_F(SdkRelayPublishedTest, AReportTheMasterWouldNotTakeRecordsNothing) {
  for (const char* bad : {
           R"({"op":"published","model":"mlp","version":"7","repository":"/r"})",
           R"({"op":"published","model":"../x","version":7,"repository":"/r"})",
           R"({"op":"published","model":"mlp","version":7,"repository":"/r","step":"1"})",
           R"({"op":"published","model":"mlp","version":7,"repository":"/r","metrics":{"a":[1]}})",
           R"({"op":"published","model":"mlp","version":7,"repository":""})",
       }) {
    Relay(bad);
  }
  Relay(R"({"op":"published","model":"mlp","version":7,"repository":"/r"})", /*attempt=*/3);
  EXPECT_TRUE(host_.records.empty());
  EXPECT_FALSE(job_.last_publication.has_value());
}

// The agent keeps a relayed report until the master acknowledges it, to send it again to the
// master that replaces a dead one (agent/master_outbox.h): every report with a request id gets
// an answer, taken or refused.
TEST_F(SdkRelayPublishedTest, ReportsWithARequestIdAreAcknowledged) {
  Relay(R"({"op":"checkpointed","task":"trainer:0","attempt":0,"step":40})", 0, /*request_id=*/5);
  Relay(R"({"op":"published","model":"mlp","version":7,"repository":"/r"})", 0, 6);
  Relay(R"({"op":"published","model":"../x","version":7,"repository":"/r"})", 0, 7);
  ASSERT_EQ(host_.replies.size(), 3u);
  EXPECT_EQ(host_.replies[0], std::make_pair(uint64_t{5}, nlohmann::json{{"ok", true}}));
  EXPECT_EQ(host_.replies[1], std::make_pair(uint64_t{6}, nlohmann::json{{"ok", true}}));
  EXPECT_EQ(host_.replies[2].first, 7u);
  EXPECT_EQ(host_.replies[2].second["ok"], false);
  EXPECT_EQ(host_.records.size(), 2u) << "the checkpoint and the good publication";
}

}  // namespace
}  // namespace shoal::master
