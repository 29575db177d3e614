#include "ui/journal_timeline.h"

#include "gtest/gtest.h"
#include "ui_test_support.h"

namespace shoal::ui {
namespace {

using nlohmann::json;

// A job whose worker:1 died, was restarted by restart-task, and finished.
constexpr char kJournal[] = R"({"type":"job_submitted","ts":1000,"job_id":"j","tasks":2}
{"type":"task_state","task":"worker:0","to":"pending","rank":0,"ts":1000}
{"type":"task_state","task":"worker:1","to":"pending","rank":1,"ts":1000}
{"type":"queued","ts":1001}
{"type":"admitted","ts":1500,"backend":"local","nodes":[]}
{"type":"job_state","to":"starting","reason":"waiting for agents","ts":1500}
{"type":"rendezvous","generation":0,"world_size":2,"ranks":[{"task":"worker:0","node":"n0","rank":0},{"task":"worker:1","node":"n1","rank":1}],"ts":1600}
{"type":"task_state","task":"worker:0","attempt":0,"from":"pending","to":"starting","ts":1610}
{"type":"task_state","task":"worker:1","attempt":0,"from":"pending","to":"starting","ts":1610}
{"type":"task_state","task":"worker:0","attempt":0,"from":"starting","to":"running","pid":10,"ts":1700}
{"type":"task_state","task":"worker:1","attempt":0,"from":"starting","to":"running","pid":11,"ts":1700}
{"type":"job_state","to":"running","reason":"","ts":1700}
{"type":"checkpoint","task":"worker:0","step":50,"ts":2500}
{"type":"model_published","task":"worker:0","model":"mlp","version":3,"repository":"/m","step":50,"metrics":{"loss":0.12},"ts":2600}
{"type":"failure_handled","task":"worker:1","attempt":0,"action":"restart-task","cause":"killed by signal 9","restart":1,"delay_ms":100,"ts":3000}
{"type":"task_state","task":"worker:1","attempt":0,"from":"running","to":"failed","exit_code":0,"signal":9,"reason":"killed by signal 9","ts":3000}
{"type":"task_state","task":"worker:1","attempt":1,"to":"pending","ts":3000}
{"type":"task_state","task":"worker:1","attempt":1,"from":"pending","to":"starting","ts":3100}
{"type":"task_state","task":"worker:1","attempt":1,"from":"starting","to":"running","pid":12,"ts":3200}
{"type":"resumed","task":"worker:1","attempt":1,"step":50,"ts":3300}
{"type":"task_state","task":"worker:0","attempt":0,"from":"running","to":"succeeded","exit_code":0,"signal":0,"ts":5000}
{"type":"task_state","task":"worker:1","attempt":1,"from":"running","to":"succeeded","exit_code":0,"signal":0,"ts":5100}
{"type":"job_finished","outcome":"succeeded","reason":"ok","ts":5200}
{"type":"job_state","to":"succeeded","reason":"ok","ts":5200}
)";

const json* FindEvent(const json& timeline, const std::string& kind) {
  for (const auto& e : timeline["events"]) {
    if (e["kind"] == kind) return &e;
  }
  return nullptr;
}

TEST(JournalTimelineTest, EachTaskHasItsGenerationsAndTheRestartIsMarked) {
  json t = TimelineFromJournal(kJournal, 9999);
  EXPECT_EQ(t["start_unix_ms"], 1000);
  EXPECT_EQ(t["end_unix_ms"], 5200);
  EXPECT_FALSE(t["truncated"].get<bool>());
  ASSERT_EQ(t["tasks"].size(), 2u);
  const json& w1 = t["tasks"][1];
  EXPECT_EQ(w1["task"], "worker:1");
  ASSERT_EQ(w1["generations"].size(), 2u);
  EXPECT_EQ(w1["generations"][0]["attempt"], 0);
  EXPECT_EQ(w1["generations"][0]["from_ms"], 1610);
  EXPECT_EQ(w1["generations"][0]["to_ms"], 3000);
  EXPECT_EQ(w1["generations"][0]["state"], "failed");
  EXPECT_EQ(w1["generations"][0]["signal"], 9);
  EXPECT_EQ(w1["generations"][0]["node"], "n1");
  EXPECT_EQ(w1["generations"][1]["attempt"], 1);
  EXPECT_EQ(w1["generations"][1]["from_ms"], 3100);
  EXPECT_EQ(w1["generations"][1]["state"], "succeeded");
  EXPECT_EQ(t["tasks"][0]["generations"].size(), 1u);
  const json* failure = FindEvent(t, "failure");
  ASSERT_NE(failure, nullptr);
  EXPECT_EQ((*failure)["task"], "worker:1");
  EXPECT_NE((*failure)["text"].get<std::string>().find("signal 9"), std::string::npos);
  ASSERT_NE(FindEvent(t, "restart"), nullptr);
  ASSERT_NE(FindEvent(t, "checkpoint_saved"), nullptr);
  ASSERT_NE(FindEvent(t, "checkpoint_resumed"), nullptr);
  const json* published = FindEvent(t, "model_published");
  ASSERT_NE(published, nullptr);
  EXPECT_EQ((*published)["task"], "worker:0");
  EXPECT_EQ((*published)["text"], "mlp version 3 published at step 50 (loss 0.12)");
  ASSERT_EQ(t["world_size"].size(), 1u);
  EXPECT_EQ(t["world_size"][0][1], 2);
  std::vector<std::string> phases;
  for (const auto& p : t["phases"]) phases.push_back(p["name"]);
  EXPECT_EQ(phases, (std::vector<std::string>{"submitted", "queued", "admission", "starting", "running"}));
  EXPECT_EQ(t["phases"].back()["to_ms"], 5200);
}

TEST(JournalTimelineTest, APartlyWrittenLastLineIsSkippedAndSaid) {
  std::string journal = kJournal;
  journal.resize(journal.find("{\"type\":\"resumed\"") + 20);  // cut inside a line
  json t = TimelineFromJournal(journal, 9999);
  EXPECT_TRUE(t["truncated"].get<bool>());
  EXPECT_EQ(t["tasks"][1]["generations"].size(), 2u);
  EXPECT_EQ(t["tasks"][1]["generations"][1]["to_ms"], 0);  // still running as far as we know
  EXPECT_EQ(t["end_unix_ms"], 0);
}

TEST(JournalTimelineTest, AMissingJournalIsNotFound) {
  testing::TempDir dir;
  auto t = JobTimeline(dir.path() + "/gone", 1);
  EXPECT_TRUE(absl::IsNotFound(t.status()));
}

TEST(JournalTimelineTest, GarbageNeverThrows) {
  for (const char* text : {"", "\n\n", "not json\n", "[1,2]\n{\"type\":5}\n",
                           "{\"type\":\"task_state\",\"task\":7,\"to\":[]}\n"}) {
    json t = TimelineFromJournal(text, 1);
    EXPECT_TRUE(t.is_object()) << text;
  }
}

}  // namespace
}  // namespace shoal::ui
