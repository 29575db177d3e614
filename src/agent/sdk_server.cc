#include "agent/sdk_server.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/model_publication.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace shoal::agent {
namespace {

constexpr size_t kMaxLineBytes = 1 << 20;

std::string ErrorLine(const std::string& message) {
  return nlohmann::json{{"ok", false}, {"error", message}}.dump();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SdkServer>> SdkServer::Create(std::string address,
                                                             SdkServerCallbacks callbacks) {
  auto server = std::unique_ptr<SdkServer>(new SdkServer(std::move(address), std::move(callbacks)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string& a = server->address_;
  if (a.empty() || a.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad SDK socket address '", a, "'"));
  }
  std::memcpy(addr.sun_path, a.data(), a.size());
  socklen_t len = offsetof(sockaddr_un, sun_path) + a.size();
  if (a[0] == '@') {
    addr.sun_path[0] = '\0';
  } else {
    ::unlink(a.c_str());
    len += 1;
  }
  server->listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!server->listen_fd_.valid() ||
      ::bind(server->listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(server->listen_fd_.get(), 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on the SDK socket ", a, ": ", std::strerror(errno)));
  }
  server->epoll_fd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  server->wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->epoll_fd_.valid() || !server->wake_fd_.valid()) {
    return absl::InternalError(absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
  }
  for (int fd : {server->listen_fd_.get(), server->wake_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(server->epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

SdkServer::SdkServer(std::string address, SdkServerCallbacks callbacks)
    : address_(std::move(address)), callbacks_(std::move(callbacks)) {}

SdkServer::~SdkServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  if (!address_.empty() && address_[0] != '@') ::unlink(address_.c_str());
}

void SdkServer::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

std::string SdkServer::TaskLaunched(const std::string& task, uint32_t attempt,
                                    std::chrono::milliseconds progress_timeout,
                                    const std::string& progress_file, std::string* error) {
  TaskEntry e;
  e.attempt = attempt;
  e.timeout = progress_timeout;
  if (!progress_file.empty()) {
    auto slot = ProgressSlot::Create(progress_file);
    if (slot.ok()) {
      e.slot = std::move(*slot);
    } else if (error != nullptr) {
      *error = std::string(slot.status().message());
    }
  }
  std::string path = e.slot ? e.slot->path() : "";
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_[task] = std::move(e);
  }
  // The watchdog's next look may now be due sooner (a board is looked at, not heard from).
  Wake();
  return path;
}

void SdkServer::RefreshFromSlot(TaskEntry& e) {
  if (!e.slot) return;
  std::optional<ProgressSlot::Report> report = e.slot->Read();
  if (!report || report->monotonic_ns <= e.slot_seen_ns) return;
  e.slot_seen_ns = report->monotonic_ns;
  e.step = report->step;
  e.step_changed = true;
  // The report's own time: a hang is measured from the last step, not from when it was seen.
  e.last_progress = std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::nanoseconds(report->monotonic_ns)));
  e.armed = e.timeout.count() > 0;
}

void SdkServer::TaskEnded(const std::string& task, uint32_t attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(task);
  if (it != tasks_.end() && it->second.attempt == attempt) tasks_.erase(it);
}

void SdkServer::Reply(uint64_t request_id, const std::string& json_line) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_replies_.emplace_back(request_id, json_line);
  }
  Wake();
}

std::vector<TaskStep> SdkServer::TakeProgress() {
  std::vector<TaskStep> changed;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [task, e] : tasks_) {
    RefreshFromSlot(e);
    if (!e.step_changed) continue;
    e.step_changed = false;
    changed.push_back({task, e.attempt, e.step});
  }
  return changed;
}

void SdkServer::Loop() {
  epoll_event events[64];
  while (true) {
    int n = ::epoll_wait(epoll_fd_.get(), events, 64, NextWatchdogTimeoutMs());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listen_fd_.get()) {
        Accept();
      } else if (fd == wake_fd_.get()) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof(v));
      } else {
        if (events[i].events & EPOLLOUT) {
          auto it = connections_.find(fd);
          if (it != connections_.end()) FlushTo(it->second);
        }
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadFrom(fd);
      }
    }
    std::vector<std::pair<uint64_t, std::string>> replies;
    {
      std::lock_guard<std::mutex> lock(mu_);
      replies.swap(pending_replies_);
    }
    for (auto& [id, line] : replies) {
      auto it = request_fd_.find(id);
      if (it == request_fd_.end()) continue;
      auto [fd, serial] = it->second;
      request_fd_.erase(it);
      auto c = connections_.find(fd);
      if (c != connections_.end() && c->second.serial == serial) QueueReply(fd, line);
    }
    CheckWatchdogs();
  }
}

void SdkServer::Accept() {
  while (true) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    // Only processes of the agent's own user may talk to it.
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) {
      ::close(fd);
      continue;
    }
    Connection c;
    c.fd.Reset(fd);
    c.serial = next_serial_++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
    connections_[fd] = std::move(c);
  }
}

void SdkServer::ReadFrom(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  char buf[16384];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      it->second.in.append(buf, n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    // EOF or error: handle the complete lines, then drop the connection.
    std::string in = std::move(it->second.in);
    size_t start = 0, nl;
    while ((nl = in.find('\n', start)) != std::string::npos) {
      HandleLine(fd, in.substr(start, nl - start));
      start = nl + 1;
    }
    CloseConnection(fd);
    return;
  }
  std::string& in = it->second.in;
  size_t start = 0, nl;
  while ((nl = in.find('\n', start)) != std::string::npos) {
    std::string line = in.substr(start, nl - start);
    start = nl + 1;
    HandleLine(fd, line);
    if (connections_.find(fd) == connections_.end()) return;
  }
  in.erase(0, start);
  if (in.size() > kMaxLineBytes) {
    QueueReply(fd, ErrorLine("request line longer than 1 MiB"));
    CloseConnection(fd);
  }
}

void SdkServer::HandleLine(int fd, const std::string& line) {
  if (line.empty()) return;
  nlohmann::json req = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!req.is_object() || !req.contains("op") || !req["op"].is_string() ||
      !req.contains("task") || !req["task"].is_string() || !req.contains("attempt") ||
      !req["attempt"].is_number_unsigned()) {
    QueueReply(fd, ErrorLine("a request is one JSON object with op, task and attempt"));
    return;
  }
  std::string op = req["op"];
  std::string task = req["task"];
  uint32_t attempt = req["attempt"];
  bool current = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tasks_.find(task);
    current = it != tasks_.end() && it->second.attempt == attempt;
    if (current && op == "progress") {
      TaskEntry& e = it->second;
      if (req.contains("step") && req["step"].is_number_unsigned()) e.step = req["step"];
      e.step_changed = true;
      e.last_progress = std::chrono::steady_clock::now();
      e.armed = e.timeout.count() > 0;
      return;
    }
  }
  if (op == "progress") return;  // no reply, by contract; a stale attempt is simply ignored
  if (!current) {
    if (op != "checkpointed" && op != "published") {
      QueueReply(fd, ErrorLine(absl::StrCat("task ", task, " attempt ", attempt,
                                            " is not running on this node")));
    }
    return;
  }
  // Reports get a request id too, though the task wants no reply: the master's acknowledgement
  // tells the agent that it need not send the report again to a master that replaced a dead
  // one (master_outbox.h). No connection waits for it, so Reply drops it.
  if (op == "checkpointed") {
    if (callbacks_.on_request) callbacks_.on_request(next_request_++, task, attempt, line);
    return;
  }
  if (op == "published") {
    // No reply, by contract: a report the master could not take is refused here, in the
    // agent's log, and goes no further.
    if (auto publication = ParseModelPublication(req); !publication.ok()) {
      spdlog::warn("task {} attempt {}: refused a 'published' report: {}", task, attempt,
                   std::string(publication.status().message()));
      return;
    }
    if (callbacks_.on_request) callbacks_.on_request(next_request_++, task, attempt, line);
    return;
  }
  if (op != "lease" && op != "done" && op != "resumed") {
    QueueReply(fd, ErrorLine(absl::StrCat("unknown op '", op, "'")));
    return;
  }
  uint64_t id = next_request_++;
  request_fd_[id] = {fd, connections_[fd].serial};
  if (callbacks_.on_request) callbacks_.on_request(id, task, attempt, line);
}

void SdkServer::QueueReply(int fd, const std::string& json_line) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  it->second.out += json_line;
  it->second.out += '\n';
  FlushTo(it->second);
}

void SdkServer::FlushTo(Connection& c) {
  while (!c.out.empty()) {
    ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  epoll_event ev{};
  ev.events = c.out.empty() ? uint32_t{EPOLLIN} : uint32_t{EPOLLIN | EPOLLOUT};
  ev.data.fd = c.fd.get();
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
}

void SdkServer::CloseConnection(int fd) {
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  connections_.erase(fd);
}

int SdkServer::NextWatchdogTimeoutMs() {
  std::lock_guard<std::mutex> lock(mu_);
  auto now = std::chrono::steady_clock::now();
  int64_t best = -1;
  auto consider = [&](int64_t ms) {
    ms = std::max<int64_t>(0, ms);
    if (best < 0 || ms < best) best = ms;
  };
  for (auto& [task, e] : tasks_) {
    if (e.timeout.count() <= 0 || e.stalled_reported) continue;
    RefreshFromSlot(e);
    if (!e.armed) {
      // A board tells no one of the first step: look again within half the timeout, so that a
      // task hanging right after its first step is still caught within 1.5 timeouts.
      if (e.slot) consider(std::max<int64_t>(10, e.timeout.count() / 2));
      continue;
    }
    consider(std::chrono::duration_cast<std::chrono::milliseconds>(e.last_progress + e.timeout -
                                                                    now)
                 .count() +
             1);
  }
  return static_cast<int>(std::min<int64_t>(best, 60000));
}

void SdkServer::CheckWatchdogs() {
  std::vector<std::tuple<std::string, uint32_t, uint64_t, std::chrono::milliseconds>> stalled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    for (auto& [task, e] : tasks_) {
      RefreshFromSlot(e);
      if (!e.armed || e.stalled_reported || now - e.last_progress < e.timeout) continue;
      e.stalled_reported = true;
      stalled.emplace_back(task, e.attempt, e.step,
                           std::chrono::duration_cast<std::chrono::milliseconds>(now - e.last_progress));
    }
  }
  for (auto& [task, attempt, step, silent] : stalled) {
    if (callbacks_.on_stalled) callbacks_.on_stalled(task, attempt, step, silent);
  }
}

}  // namespace shoal::agent
