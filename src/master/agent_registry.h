#pragma once

// The job's agents as the master's loop sees them: one session per agent stream, the node each
// registered for, and the messages queued for them until the journal is durable.
// Runs on the master's loop, except NextId (any thread).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "master/control_plane.h"

namespace shoal::master {

struct AgentSession {
  uint64_t id = 0;
  std::shared_ptr<AgentConnection> connection;
  std::string node;
  bool registered = false;
  std::vector<uint32_t> free_ports;
  std::string address;
  std::string leaving;  // why the agent said it is stopping, if it did
};

class AgentRegistry {
 public:
  AgentRegistry();
  ~AgentRegistry();

  // A fresh session id. Thread-safe: the transport learns it before the loop adds the session.
  uint64_t NextId() { return next_id_.fetch_add(1); }
  void Add(uint64_t id, std::shared_ptr<AgentConnection> connection);
  AgentSession* Find(uint64_t id);
  // The registered session of `node`, or null.
  AgentSession* ForNode(const std::string& node);
  void Register(AgentSession& session, const std::string& node);
  // Forgets a session whose stream ended; returns it (node empty if it never registered).
  AgentSession Remove(uint64_t id);
  // Gives up the agent of `node`: its sessions are closed and forgotten at once, so nothing more
  // is sent into them and their late disconnect cannot be mistaken for a replacement's.
  void DropNode(const std::string& node);
  // Registered nodes whose agent was not heard from for longer than `limit`.
  std::vector<std::string> SilentNodes(Clock::TimePoint now, Clock::Duration limit) const;
  size_t registered() const { return node_sessions_.size(); }
  std::map<uint64_t, AgentSession>& sessions() { return sessions_; }

  // Queues `message` for the session's agent; Flush sends it. An agent never acts on a change
  // the journal could lose: the master flushes only after the journal's sync.
  void Send(AgentSession& session, const v1::MasterMessage& message);
  void SendToRegistered(const v1::MasterMessage& message);
  void Flush();
  void CloseAll();

 private:
  std::atomic<uint64_t> next_id_{1};
  std::map<uint64_t, AgentSession> sessions_;
  std::map<std::string, uint64_t> node_sessions_;  // registered node -> session id
  std::vector<std::pair<std::shared_ptr<AgentConnection>, std::unique_ptr<v1::MasterMessage>>>
      outbox_;
};

}  // namespace shoal::master
