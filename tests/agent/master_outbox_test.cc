// What the agent's stream owes a master that replaces a dead one (agent/master_outbox.h): a
// relayed SDK call is written again until some master answers it, in the order first sent, and
// nothing the task does not wait for is repeated once acknowledged.
#include "agent/master_outbox.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shoal::agent {
namespace {

v1::AgentMessage Call(uint64_t request_id, const std::string& json) {
  v1::AgentMessage m;
  m.mutable_sdk()->set_request_id(request_id);
  m.mutable_sdk()->mutable_task()->set_role("worker");
  m.mutable_sdk()->set_json(json);
  return m;
}

v1::AgentMessage Exit(uint32_t index) {
  v1::AgentMessage m;
  m.mutable_task_exited()->mutable_task()->set_role("worker");
  m.mutable_task_exited()->mutable_task()->set_index(index);
  return m;
}

v1::AgentMessage Heartbeat() {
  v1::AgentMessage m;
  m.mutable_heartbeat()->set_sequence(1);
  return m;
}

// What each message is, in order: "sdk:<id>", "exit:<index>", "other".
std::vector<std::string> Describe(const std::vector<v1::AgentMessage>& messages) {
  std::vector<std::string> out;
  for (const auto& m : messages) {
    if (m.has_sdk()) {
      out.push_back("sdk:" + std::to_string(m.sdk().request_id()));
    } else if (m.has_task_exited()) {
      out.push_back("exit:" + std::to_string(m.task_exited().task().index()));
    } else {
      out.push_back("other");
    }
  }
  return out;
}

// The defect: a lease written to a master killed before it handled it was never answered, and
// the task timed out (AgentTimeout) although a new master took over.
TEST(MasterOutboxTest, ACallWrittenToAMasterThatDiedGoesToItsReplacement) {
  MasterOutbox outbox;
  outbox.Written(Call(1, R"({"op":"lease","epoch":0})"));
  EXPECT_EQ(outbox.unanswered(), 1u);
  std::vector<v1::AgentMessage> resend = outbox.TakeForNewStream();
  ASSERT_EQ(Describe(resend), (std::vector<std::string>{"sdk:1"}));
  EXPECT_EQ(resend[0].sdk().json(), R"({"op":"lease","epoch":0})");
}

TEST(MasterOutboxTest, AnAnsweredCallIsNotSentAgain) {
  MasterOutbox outbox;
  outbox.Written(Call(1, "{}"));
  outbox.Written(Call(2, "{}"));
  outbox.Answered(1);
  EXPECT_EQ(Describe(outbox.TakeForNewStream()), (std::vector<std::string>{"sdk:2"}));
}

TEST(MasterOutboxTest, ACallIsResentToEveryNewStreamUntilAnswered) {
  MasterOutbox outbox;
  outbox.Written(Call(3, "{}"));
  for (int stream = 0; stream < 3; ++stream) {
    auto pending = outbox.TakeForNewStream();
    ASSERT_EQ(Describe(pending), (std::vector<std::string>{"sdk:3"})) << "stream " << stream;
    for (const auto& m : pending) outbox.Written(m);
  }
  outbox.Answered(3);
  EXPECT_TRUE(outbox.TakeForNewStream().empty());
}

TEST(MasterOutboxTest, UnansweredCallsGoBeforeWhatWasHeldWhileNoStreamWasOpen) {
  MasterOutbox outbox;
  outbox.Written(Call(2, "{}"));
  outbox.Written(Call(1, "{}"));
  outbox.Hold(Exit(0));
  outbox.Hold(Call(4, "{}"));
  outbox.Hold(Exit(1));
  auto pending = outbox.TakeForNewStream();
  EXPECT_EQ(Describe(pending),
            (std::vector<std::string>{"sdk:1", "sdk:2", "exit:0", "sdk:4", "exit:1"}));
  EXPECT_EQ(outbox.held(), 0u);
  // A held call, once written, is kept until answered like the others.
  for (const auto& m : pending) outbox.Written(m);
  EXPECT_EQ(outbox.unanswered(), 3u);
}

TEST(MasterOutboxTest, WhatABrokenStreamRefusedIsHeldAgainInOrderAndOnlyOnce) {
  MasterOutbox outbox;
  outbox.Written(Call(1, "{}"));
  outbox.Hold(Exit(0));
  outbox.Hold(Call(2, "{}"));
  auto pending = outbox.TakeForNewStream();
  // The new stream broke after the registration: nothing of `pending` went out.
  for (const auto& m : pending) outbox.Hold(m);
  EXPECT_EQ(Describe(outbox.TakeForNewStream()),
            (std::vector<std::string>{"sdk:1", "exit:0", "sdk:2"}));
}

TEST(MasterOutboxTest, ReportsWithoutARequestIdAndMessagesAboutNowAreNotKept) {
  MasterOutbox outbox;
  outbox.Written(Call(0, R"({"op":"checkpointed"})"));  // an older agent's report
  outbox.Written(Exit(0));
  outbox.Hold(Heartbeat());
  v1::AgentMessage samples;
  samples.mutable_resources();
  outbox.Hold(samples);
  EXPECT_EQ(outbox.unanswered(), 0u);
  EXPECT_TRUE(outbox.TakeForNewStream().empty());
}

TEST(MasterOutboxTest, HeldOutputStopsAtItsLimitButExitsAreAlwaysKept) {
  MasterOutbox outbox;
  v1::AgentMessage chunk;
  chunk.mutable_log()->set_data(std::string(1 << 20, 'x'));
  for (int i = 0; i < 20; ++i) outbox.Hold(chunk);
  outbox.Hold(Exit(0));
  auto pending = outbox.TakeForNewStream();
  ASSERT_FALSE(pending.empty());
  EXPECT_LT(pending.size(), 21u) << "output past the limit is dropped";
  EXPECT_EQ(Describe({pending.back()}), (std::vector<std::string>{"exit:0"}));
}

}  // namespace
}  // namespace shoal::agent
