// What the agent's stream owes a master that replaces a dead one (agent/master_outbox.h): a
// relayed SDK call is written again until some master answers it, in the order first sent, task
// output until some master's files hold it, and nothing the task does not wait for is repeated
// once acknowledged.
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

// `data`, written by worker:<index> (attempt 0) from byte `offset` of its stdout or stderr.
v1::AgentMessage Output(uint32_t index, uint64_t offset, const std::string& data,
                        bool is_stderr = false) {
  v1::AgentMessage m;
  v1::LogChunk* c = m.mutable_logs()->add_chunks();
  c->mutable_task()->set_role("worker");
  c->mutable_task()->set_index(index);
  c->set_stream(is_stderr ? v1::LogChunk::STREAM_STDERR : v1::LogChunk::STREAM_STDOUT);
  c->set_offset(offset);
  c->set_data(data);
  return m;
}

v1::LogsCommitted CommittedTo(uint32_t index, uint64_t offset, bool is_stderr = false) {
  v1::LogsCommitted c;
  auto* p = c.add_positions();
  p->mutable_task()->set_role("worker");
  p->mutable_task()->set_index(index);
  p->set_stream(is_stderr ? v1::LogChunk::STREAM_STDERR : v1::LogChunk::STREAM_STDOUT);
  p->set_offset(offset);
  return c;
}

// What each message is, in order: "sdk:<id>", "exit:<index>", "out:<index>@<offset>" for each
// output chunk ("err:" for stderr), "other".
std::vector<std::string> Describe(const std::vector<v1::AgentMessage>& messages) {
  std::vector<std::string> out;
  for (const auto& m : messages) {
    if (m.has_sdk()) {
      out.push_back("sdk:" + std::to_string(m.sdk().request_id()));
    } else if (m.has_task_exited()) {
      out.push_back("exit:" + std::to_string(m.task_exited().task().index()));
    } else if (m.has_logs()) {
      for (const auto& c : m.logs().chunks()) {
        out.push_back((c.stream() == v1::LogChunk::STREAM_STDERR ? "err:" : "out:") +
                      std::to_string(c.task().index()) + "@" + std::to_string(c.offset()));
      }
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

// The defect: output written to a master killed before it flushed it to logs.txt was lost (a
// line of 25 missing after `shoal resume`).
TEST(MasterOutboxTest, OutputWrittenToAMasterThatDiedGoesToItsReplacementBeforeHeldMessages) {
  MasterOutbox outbox;
  outbox.Written(Call(1, "{}"));
  outbox.Written(Output(0, 0, "tick 0\n"));
  outbox.Written(Output(1, 0, "tick 0\n"));
  outbox.Hold(Output(0, 7, "tick 1\n"));
  outbox.Hold(Exit(0));
  EXPECT_EQ(outbox.kept_log_bytes(), 21u);
  auto pending = outbox.TakeForNewStream();
  EXPECT_EQ(Describe(pending),
            (std::vector<std::string>{"sdk:1", "out:0@0", "out:1@0", "out:0@7", "exit:0"}));
  EXPECT_EQ(pending[1].logs().chunks(0).data(), "tick 0\n");
  // Written to the new stream, it is kept again until that master commits it.
  for (const auto& m : pending) outbox.Written(m);
  EXPECT_EQ(outbox.kept_log_bytes(), 21u);
}

TEST(MasterOutboxTest, CommittedOutputIsNotSentAgainButAChunkPartlyPastThePositionIs) {
  MasterOutbox outbox;
  outbox.Written(Output(0, 0, "tick 0\n"));
  outbox.Written(Output(0, 7, "tick 1\ntick"));  // the master holds " 2\n"'s start as partial
  outbox.Written(Output(0, 0, "warning\n", /*is_stderr=*/true));
  outbox.Written(Output(1, 0, "tick 0\n"));
  outbox.Committed(CommittedTo(0, 14));
  outbox.Committed(CommittedTo(1, 7));
  EXPECT_EQ(Describe(outbox.TakeForNewStream()),
            (std::vector<std::string>{"out:0@7", "err:0@0"}));
}

TEST(MasterOutboxTest, APositionOfAnotherAttemptLeavesThisAttemptsOutputKept) {
  MasterOutbox outbox;
  v1::AgentMessage second = Output(0, 0, "attempt 1\n");
  second.mutable_logs()->mutable_chunks(0)->mutable_task()->set_attempt(1);
  outbox.Written(second);
  outbox.Committed(CommittedTo(0, 100));  // attempt 0's stdout
  EXPECT_EQ(Describe(outbox.TakeForNewStream()), (std::vector<std::string>{"out:0@0"}));
}

TEST(MasterOutboxTest, KeptOutputPastItsLimitLosesTheOldestChunksButExitsAreAlwaysKept) {
  MasterOutbox outbox;
  const std::string mib(1 << 20, 'x');
  for (uint64_t i = 0; i < 20; ++i) outbox.Hold(Output(i % 2, (i / 2) << 20, mib));
  outbox.Hold(Exit(0));
  EXPECT_LE(outbox.kept_log_bytes(), MasterOutbox::kMaxKeptLogBytes);
  auto pending = outbox.TakeForNewStream();
  std::vector<std::string> described = Describe(pending);
  ASSERT_EQ(described.size(), 9u) << "8 MiB of output, then the exit";
  EXPECT_EQ(described.front(), "out:0@" + std::to_string(6 << 20)) << "the oldest went first";
  EXPECT_EQ(described.back(), "exit:0");
  for (const auto& m : pending) {
    if (m.has_logs()) {
      EXPECT_LE(m.logs().chunks_size() * mib.size(), 2 * (1u << 20));
    }
  }
}

}  // namespace
}  // namespace shoal::agent
