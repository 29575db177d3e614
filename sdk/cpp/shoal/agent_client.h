#pragma once

// The process's connection to its node's agent (docs/sdk-protocol.md): one Unix socket per
// process, re-made in a forked child, reports sent without waiting and requests that wait for
// the answer.

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include "shoal/json_scan.h"
#include "shoal/posix.h"

namespace shoal::sdk {

// The outcome of a report that waits for the agent's answer.
struct ReportResult {
  bool ok = true;
  std::string error;
  explicit operator bool() const { return ok; }
};

// How long ReportResumed waits for the answer, and a send may block on a full socket.
inline constexpr int kReplyTimeoutMs = 30000;

namespace internal {

// The process's connection to the agent. One per process; every member is guarded by `mu`.
class AgentClient {
 public:
  static AgentClient& Get() {
    static AgentClient* client = [] {
      auto* c = new AgentClient();  // never destroyed: usable until the process exits
      ::pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); },
                       [] {
                         AgentClient& self = Get();
                         self.mu_.unlock();
                         self.ResetLocked();  // never write to the parent's connection
                       });
      return c;
    }();
    return *client;
  }

  // Fire-and-forget. Never fails: a broken connection is re-made once, then reports are
  // disabled for the process with one warning.
  void Report(const char* op, uint64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Refresh() || reports_disabled_) return;
    std::string line = Line(op, step);
    std::string error;
    if (SendLocked(line, &error)) return;
    CloseLocked();
    if (SendLocked(line, &error)) return;
    CloseLocked();
    reports_disabled_ = true;
    std::fprintf(stderr,
                 "shoal: cannot reach the Shoal agent at %s (%s); progress and checkpoint "
                 "reports are disabled for this process\n",
                 address_.c_str(), error.c_str());
  }

  // Fire-and-forget, with fields of its own (`fields`: the rest of the JSON object after op,
  // task and attempt, `"model":"m","version":3`), on a connection of its own that is closed
  // after the line: an agent older than the op answers it with an error, which must not be read
  // as the reply to this process's next request. Never fails; one warning when not sent.
  void ReportAlone(const char* op, const std::string& fields) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Refresh()) return;
    std::string line = std::string("{\"op\":\"") + op + "\",\"task\":" + task_json_ +
                       ",\"attempt\":" + std::to_string(attempt_) + "," + fields + "}\n";
    int process_fd = fd_;
    std::string process_buffer;
    process_buffer.swap(buffer_);
    fd_ = -1;
    std::string error;
    bool sent = SendLocked(line, &error);
    CloseLocked();
    fd_ = process_fd;
    buffer_.swap(process_buffer);
    if (!sent) {
      std::fprintf(stderr, "shoal: cannot reach the Shoal agent at %s (%s); the '%s' report was "
                   "not sent\n", address_.c_str(), error.c_str(), op);
    }
  }

  ReportResult Request(const char* op, uint64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    ReportResult result;
    if (!Refresh()) return result;  // not started by Shoal: nothing to tell
    std::string line = Line(op, step);
    std::string error;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string reply;
      bool timed_out = false;
      if (SendLocked(line, &error) && ReadLineLocked(&reply, &error, &timed_out)) {
        result.ok = ReplyOk(reply);
        if (!result.ok) {
          result.error = std::string("the Shoal agent refused '") + op + "': " + ReplyError(reply);
        }
        return result;
      }
      CloseLocked();
      if (timed_out) break;
    }
    result.ok = false;
    result.error = std::string("cannot get an answer to '") + op + "' from the Shoal agent at " +
                   address_ + ": " + error;
    return result;
  }

 private:
  AgentClient() = default;

  // Re-reads SHOAL_AGENT_SOCKET (and the task's identity when it changed or after a fork).
  // False when it is unset.
  bool Refresh() {
    const char* address = std::getenv("SHOAL_AGENT_SOCKET");
    if (!address || !*address) return false;
    if (pid_ == ::getpid() && address_ == address) return true;
    CloseLocked();
    pid_ = ::getpid();
    address_ = address;
    reports_disabled_ = false;
    const char* role = std::getenv("SHOAL_ROLE");
    const char* index = std::getenv("SHOAL_INDEX");
    const char* attempt = std::getenv("SHOAL_RESTART_COUNT");
    task_json_ = JsonString(std::string(role ? role : "") + ":" + (index && *index ? index : "0"));
    attempt_ = attempt ? std::strtoll(attempt, nullptr, 10) : 0;
    return true;
  }

  void ResetLocked() {
    CloseLocked();
    pid_ = -1;
    address_.clear();
  }

  std::string Line(const char* op, uint64_t step) const {
    return std::string("{\"op\":\"") + op + "\",\"task\":" + task_json_ +
           ",\"attempt\":" + std::to_string(attempt_) + ",\"step\":" + std::to_string(step) +
           "}\n";
  }

  void CloseLocked() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buffer_.clear();
  }

  bool ConnectLocked(std::string* error) {
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (address_[0] == '@') {
      std::string_view name = std::string_view(address_).substr(1);
      if (name.size() + 1 > sizeof(addr.sun_path)) {
        *error = "socket address too long";
        return false;
      }
      std::memcpy(addr.sun_path + 1, name.data(), name.size());
      len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
    } else {
      if (address_.size() + 1 > sizeof(addr.sun_path)) {
        *error = "socket path too long";
        return false;
      }
      std::memcpy(addr.sun_path, address_.data(), address_.size());
      len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + address_.size() + 1);
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = ErrnoText("socket", errno);
      return false;
    }
    struct timeval tv;
    tv.tv_sec = kReplyTimeoutMs / 1000;
    tv.tv_usec = (kReplyTimeoutMs % 1000) * 1000;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int rc;
    do {
      rc = ::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), len);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      *error = ErrnoText("connect", errno);
      ::close(fd);
      return false;
    }
    fd_ = fd;
    buffer_.clear();
    return true;
  }

  bool SendLocked(const std::string& line, std::string* error) {
    if (fd_ < 0 && !ConnectLocked(error)) return false;
    const char* data = line.data();
    size_t size = line.size();
    while (size > 0) {
      ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        *error = ErrnoText("send", errno);
        return false;
      }
      data += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  bool ReadLineLocked(std::string* line, std::string* error, bool* timed_out) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReplyTimeoutMs);
    while (true) {
      size_t end = buffer_.find('\n');
      if (end != std::string::npos) {
        *line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      struct pollfd pfd = {fd_, POLLIN, 0};
      int ready = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left)) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        *error = "no answer within " + std::to_string(kReplyTimeoutMs / 1000) + "s";
        *timed_out = true;
        return false;
      }
      if (ready < 0) {
        *error = ErrnoText("poll", errno);
        return false;
      }
      char chunk[4096];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        *error = ErrnoText("recv", errno);
        return false;
      }
      if (n == 0) {
        *error = "the agent closed the connection";
        return false;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  std::mutex mu_;
  pid_t pid_ = -1;
  std::string address_;
  std::string task_json_;
  long long attempt_ = 0;
  int fd_ = -1;
  bool reports_disabled_ = false;
  std::string buffer_;
};

}  // namespace internal

}  // namespace shoal::sdk
