// serve_floor: the floor under every HTTP server on this machine, for bench/serving_bench.py.
// It answers each HTTP/1.1 request on a kept-alive connection with the same bytes, doing nothing
// else: no header parsing beyond the body's length, no JSON, no model, no second thread. What
// one request costs it on its core is what the kernel's TCP path costs any server, so a server
// that needs C microseconds of compute per request can reach at most 1 / (C + floor) requests/s
// on one core, whatever its own code does.
//
//   serve_floor --reply FILE [--host 127.0.0.1] [--port 0] [--content-type application/json]
//
// Prints `serve_floor: listening on http://HOST:PORT` on stdout once it accepts connections,
// then runs until killed. Exit status 2 for bad arguments, 1 when the reply file cannot be read
// or the address cannot be bound.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string reply_file;
  std::string content_type = "application/json";
};

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr,
               "serve_floor: %s\nusage: serve_floor --reply FILE [--host 127.0.0.1] [--port 0] "
               "[--content-type TYPE]\n",
               message.c_str());
  std::exit(2);
}

Options ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) UsageError(arg + " needs a value");
    std::string value = argv[++i];
    if (arg == "--reply") {
      options.reply_file = value;
    } else if (arg == "--host") {
      options.host = value;
    } else if (arg == "--content-type") {
      options.content_type = value;
    } else if (arg == "--port") {
      char* end = nullptr;
      long port = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || port < 0 || port > 65535) {
        UsageError("--port needs a number from 0 to 65535, got '" + value + "'");
      }
      options.port = static_cast<int>(port);
    } else {
      UsageError("unknown argument '" + arg + "'");
    }
  }
  if (options.reply_file.empty()) UsageError("--reply is required");
  return options;
}

// The body length a request header declares (0 without Content-Length), or -1 when the value
// is not a number.
long long DeclaredBodyLength(std::string_view header) {
  static constexpr std::string_view kName = "\r\ncontent-length:";
  for (size_t at = header.find("\r\n"); at != std::string_view::npos;
       at = header.find("\r\n", at + 2)) {
    if (header.size() - at < kName.size() ||
        strncasecmp(header.data() + at, kName.data(), kName.size()) != 0) {
      continue;
    }
    size_t p = at + kName.size();
    while (p < header.size() && header[p] == ' ') ++p;
    long long length = 0;
    bool digits = false;
    for (; p < header.size() && header[p] >= '0' && header[p] <= '9'; ++p) {
      length = length * 10 + (header[p] - '0');
      digits = true;
    }
    return digits ? length : -1;
  }
  return 0;
}

class FloorServer {
 public:
  FloorServer(int listen_fd, std::string response)
      : listen_fd_(listen_fd), response_(std::move(response)) {}

  int Run() {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return Fail("epoll_create1");
    Watch(listen_fd_, EPOLLIN);
    std::vector<epoll_event> events(256);
    while (true) {
      int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
      if (n < 0 && errno != EINTR) return Fail("epoll_wait");
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == listen_fd_) {
          AcceptAll();
        } else {
          Serve(fd);
        }
      }
    }
  }

 private:
  int Fail(const char* what) {
    std::fprintf(stderr, "serve_floor: %s: %s\n", what, std::strerror(errno));
    return 1;
  }

  void Watch(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }

  void AcceptAll() {
    while (true) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      pending_[fd].clear();
      Watch(fd, EPOLLIN | EPOLLET);
    }
  }

  // Reads what the connection has, answers every whole request in it, keeps the rest.
  void Serve(int fd) {
    std::string& in = pending_[fd];
    char buffer[65536];
    while (true) {
      ssize_t r = recv(fd, buffer, sizeof buffer, 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return Drop(fd);
      if (r < 0) {
        if (errno == EINTR) continue;
        return;
      }
      in.append(buffer, static_cast<size_t>(r));
      size_t consumed = 0;
      while (true) {
        std::string_view rest(in.data() + consumed, in.size() - consumed);
        size_t header_end = rest.find("\r\n\r\n");
        if (header_end == std::string_view::npos) {
          if (rest.size() > kMaxHeaderBytes) return Drop(fd);
          break;
        }
        long long body = DeclaredBodyLength(rest.substr(0, header_end + 2));
        if (body < 0) return Drop(fd);
        size_t whole = header_end + 4 + static_cast<size_t>(body);
        if (rest.size() < whole) break;
        consumed += whole;
        if (send(fd, response_.data(), response_.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(response_.size())) {
          return Drop(fd);  // a reply this small fits the socket buffer, or the peer is gone
        }
      }
      in.erase(0, consumed);
    }
  }

  void Drop(int fd) {
    pending_.erase(fd);
    close(fd);
  }

  int listen_fd_;
  int epoll_fd_ = -1;
  const std::string response_;
  std::unordered_map<int, std::string> pending_;
};

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseArgs(argc, argv);
  std::error_code error;
  if (!std::filesystem::is_regular_file(options.reply_file, error)) {
    std::fprintf(stderr, "serve_floor: cannot read the reply file %s: %s\n",
                 options.reply_file.c_str(),
                 error ? error.message().c_str() : "not a regular file");
    return 1;
  }
  std::ifstream file(options.reply_file, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "serve_floor: cannot read the reply file %s: %s\n",
                 options.reply_file.c_str(), std::strerror(errno));
    return 1;
  }
  std::stringstream body;
  body << file.rdbuf();
  std::string response = "HTTP/1.1 200 OK\r\nContent-Type: " + options.content_type +
                         "\r\nContent-Length: " + std::to_string(body.str().size()) +
                         "\r\n\r\n" + body.str();

  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.host.c_str(), &address.sin_addr) != 1) {
    UsageError("--host needs an IPv4 address, got '" + options.host + "'");
  }
  int listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listen_fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listen_fd, 4096) != 0) {
    std::fprintf(stderr, "serve_floor: cannot listen on %s:%d: %s\n", options.host.c_str(),
                 options.port, std::strerror(errno));
    return 1;
  }
  socklen_t length = sizeof address;
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&address), &length);
  std::printf("serve_floor: listening on http://%s:%d\n", options.host.c_str(),
              ntohs(address.sin_port));
  std::fflush(stdout);
  return FloorServer(listen_fd, std::move(response)).Run();
}
