#include "master/agent_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "shoal/v1/shoal.pb.h"

namespace shoal::master {
namespace {

using ::testing::ElementsAre;

// The transport's side of a stream, as seen from the registry: what was sent, and whether it
// was closed.
class RecordingConnection : public AgentConnection {
 public:
  bool Send(const v1::MasterMessage& message) override {
    sent.push_back(message.shutdown().reason());
    return true;
  }
  void Close() override { closed = true; }
  std::vector<std::string> sent;
  bool closed = false;
};

v1::MasterMessage Shutdown(const std::string& reason) {
  v1::MasterMessage m;
  m.mutable_shutdown()->set_reason(reason);
  return m;
}

TEST(AgentRegistryTest, SessionsRegisterForANodeAndAreForgottenWhenTheyEnd) {
  AgentRegistry agents;
  uint64_t a = agents.NextId(), b = agents.NextId();
  EXPECT_NE(a, b);
  agents.Add(a, std::make_shared<RecordingConnection>());
  agents.Add(b, std::make_shared<RecordingConnection>());
  EXPECT_EQ(agents.ForNode("n1"), nullptr);
  agents.Register(*agents.Find(a), "n1");
  EXPECT_EQ(agents.ForNode("n1"), agents.Find(a));
  EXPECT_EQ(agents.registered(), 1u);

  AgentSession unregistered = agents.Remove(b);
  EXPECT_EQ(unregistered.node, "");
  AgentSession gone = agents.Remove(a);
  EXPECT_EQ(gone.node, "n1");
  EXPECT_EQ(agents.ForNode("n1"), nullptr);
  EXPECT_EQ(agents.registered(), 0u);
  EXPECT_EQ(agents.Remove(a).id, 0u);  // twice: nothing
}

TEST(AgentRegistryTest, MessagesWaitForTheFlushInOrder) {
  AgentRegistry agents;
  auto c1 = std::make_shared<RecordingConnection>();
  auto c2 = std::make_shared<RecordingConnection>();
  agents.Add(1, c1);
  agents.Add(2, c2);
  agents.Register(*agents.Find(1), "n1");
  agents.Send(*agents.Find(2), Shutdown("direct"));
  agents.SendToRegistered(Shutdown("everyone registered"));
  agents.Send(*agents.Find(1), Shutdown("after"));
  EXPECT_TRUE(c1->sent.empty());  // not before the journal is durable
  agents.Flush();
  EXPECT_THAT(c1->sent, ElementsAre("everyone registered", "after"));
  EXPECT_THAT(c2->sent, ElementsAre("direct"));
  agents.Flush();
  EXPECT_EQ(c1->sent.size(), 2u);
}

TEST(AgentRegistryTest, DroppingANodeClosesItsStreams) {
  AgentRegistry agents;
  auto c1 = std::make_shared<RecordingConnection>();
  auto c2 = std::make_shared<RecordingConnection>();
  agents.Add(1, c1);
  agents.Add(2, c2);
  agents.Register(*agents.Find(1), "n1");
  agents.Register(*agents.Find(2), "n2");
  agents.DropNode("n1");
  EXPECT_TRUE(c1->closed);
  EXPECT_FALSE(c2->closed);
  EXPECT_EQ(agents.Find(1), nullptr);
  EXPECT_EQ(agents.ForNode("n1"), nullptr);
  EXPECT_NE(agents.ForNode("n2"), nullptr);
}

TEST(AgentRegistryTest, SilentNodesAreThoseNotHeardFromWithinTheLimit) {
  AgentRegistry agents;
  auto quiet = std::make_shared<RecordingConnection>();
  auto chatty = std::make_shared<RecordingConnection>();
  auto never_registered = std::make_shared<RecordingConnection>();
  Clock::TimePoint t0{std::chrono::seconds(100)};
  quiet->Touch(t0);
  chatty->Touch(t0 + std::chrono::seconds(2));
  never_registered->Touch(t0);
  agents.Add(1, quiet);
  agents.Add(2, chatty);
  agents.Add(3, never_registered);
  agents.Register(*agents.Find(1), "quiet");
  agents.Register(*agents.Find(2), "chatty");
  EXPECT_THAT(agents.SilentNodes(t0 + std::chrono::seconds(3), std::chrono::seconds(2)),
              ElementsAre("quiet"));
  EXPECT_TRUE(agents.SilentNodes(t0 + std::chrono::seconds(2), std::chrono::seconds(2)).empty());
}

}  // namespace
}  // namespace shoal::master
