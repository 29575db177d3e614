#include "master/agent_registry.h"

#include "shoal/v1/shoal.pb.h"

namespace shoal::master {

AgentRegistry::AgentRegistry() = default;
AgentRegistry::~AgentRegistry() = default;

void AgentRegistry::Add(uint64_t id, std::shared_ptr<AgentConnection> connection) {
  AgentSession s;
  s.id = id;
  s.connection = std::move(connection);
  sessions_[id] = std::move(s);
}

AgentSession* AgentRegistry::Find(uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

AgentSession* AgentRegistry::ForNode(const std::string& node) {
  auto it = node_sessions_.find(node);
  if (it == node_sessions_.end()) return nullptr;
  return Find(it->second);
}

void AgentRegistry::Register(AgentSession& session, const std::string& node) {
  session.registered = true;
  session.node = node;
  node_sessions_[node] = session.id;
}

AgentSession AgentRegistry::Remove(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return {};
  AgentSession s = std::move(it->second);
  sessions_.erase(it);
  if (s.registered) {
    node_sessions_.erase(s.node);
  } else {
    s.node.clear();
  }
  return s;
}

void AgentRegistry::DropNode(const std::string& node) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.registered && it->second.node == node) {
      it->second.connection->Close();
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  node_sessions_.erase(node);
}

std::vector<std::string> AgentRegistry::SilentNodes(Clock::TimePoint now,
                                                    Clock::Duration limit) const {
  std::vector<std::string> silent;
  for (const auto& [id, s] : sessions_) {
    if (s.registered && now - s.connection->last_seen() > limit) silent.push_back(s.node);
  }
  return silent;
}

void AgentRegistry::Send(AgentSession& session, const v1::MasterMessage& message) {
  outbox_.emplace_back(session.connection, std::make_unique<v1::MasterMessage>(message));
}

void AgentRegistry::SendToRegistered(const v1::MasterMessage& message) {
  for (auto& [id, s] : sessions_) {
    if (s.registered) Send(s, message);
  }
}

void AgentRegistry::Flush() {
  for (auto& [connection, message] : outbox_) connection->Send(*message);
  outbox_.clear();
}

void AgentRegistry::CloseAll() {
  for (auto& [id, s] : sessions_) s.connection->Close();
}

}  // namespace shoal::master
