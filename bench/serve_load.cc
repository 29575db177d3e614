// serve_load: an HTTP/1.1 load generator for inference servers (bench/serving_bench.py).
//
//   serve_load --url http://127.0.0.1:8000/v2/models/mlp/infer --body request.json
//              (--closed N | --open RATE [--connections C])
//              [--duration S] [--warmup S] [--drain S] [--content-type T]
//
// Sends the same POST (the body is read once from a file) over keep-alive connections, one
// request in flight per connection (no pipelining), from one thread with epoll.
//
// - closed loop (--closed N): N connections, each sends its next request as soon as the
//   previous response arrived. Latency runs from the send.
// - open loop (--open RATE): request i is scheduled at start + i / RATE whatever the server
//   does, and sent on a free connection of the pool (--connections, default 32), or queued
//   until one frees up. Latency runs from the *scheduled* time, so a server that stalls
//   cannot hide its stall by slowing the generator down (no coordinated omission).
//
// Requests started (closed) or scheduled (open) during --warmup are sent but not counted;
// those of the next --duration seconds are. After that nothing new is sent and the generator
// waits up to --drain seconds for the counted requests still outstanding (queued ones are
// still sent); any left then are errors ("timeout"), their latency taken up to that moment.
//
// Prints one JSON object on stdout: requests (counted requests that ended), ok, errors (non-2xx
// answers, connection failures, timeouts; by kind and by status), throughput_rps (2xx answers
// received inside the measured window / duration), latency_ms percentiles (exact: every
// counted request's latency is kept and sorted; errors included, connection failures not),
// and for the open loop the target, sent and achieved rates.
//
// Exit status: 0 after a run (whatever the server answered), 1 when the server cannot be
// reached at start or the body file cannot be read, 2 for bad arguments.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Nanos = int64_t;

Nanos NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<Nanos>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

constexpr Nanos kSecond = 1'000'000'000;
constexpr Nanos kReconnectBackoff = 20'000'000;  // after a failed connect
constexpr size_t kMaxHeaderBytes = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  std::string host;
  std::string port;
  std::string path;
  std::string body_file;
  std::string content_type = "application/json";
  int closed = 0;           // connections of the closed loop; 0: open loop
  double open_rate = 0;     // requests per second of the open loop; 0: closed loop
  int connections = 32;     // pool of the open loop
  double duration_s = 10;
  double warmup_s = 1;
  double drain_s = 5;
};

constexpr const char* kUsage =
    "usage: serve_load --url http://HOST:PORT/PATH --body FILE (--closed N | --open RATE)\n"
    "                  [--connections C] [--duration S] [--warmup S] [--drain S]\n"
    "                  [--content-type TYPE]\n"
    "  --closed N       closed loop over N connections (next request when the answer came)\n"
    "  --open RATE      open loop: RATE requests/s on a fixed schedule; latency from the\n"
    "                   scheduled time; --connections C connections in the pool (default 32)\n"
    "  --duration S     measured seconds (default 10), after --warmup S (default 1)\n"
    "  --drain S        wait at most S s for outstanding requests at the end (default 5)\n";

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "serve_load: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

bool ParseDouble(const std::string& text, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool ParseInt(const std::string& text, int* out) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) return false;
  *out = v;
  return true;
}

// http://HOST:PORT/PATH (also [IPv6]:PORT); the port defaults to 80, the path to "/".
void ParseUrl(const std::string& url, Options* options) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) UsageError("--url must start with http:// (got '" + url + "')");
  std::string rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  options->path = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string host = authority, port = "80";
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string::npos) UsageError("bad IPv6 address in --url '" + url + "'");
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') UsageError("bad --url '" + url + "'");
      port = authority.substr(close + 2);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  int port_number = 0;
  if (host.empty()) UsageError("--url has no host: '" + url + "'");
  if (!ParseInt(port, &port_number) || port_number < 1 || port_number > 65535) {
    UsageError("--url has a bad port: '" + url + "'");
  }
  options->host = host;
  options->port = port;
}

Options ParseArgs(int argc, char** argv) {
  Options options;
  std::string url;
  bool have_closed = false, have_open = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    std::string value;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (i + 1 >= argc) UsageError(arg + " needs a value");
      value = argv[++i];
    }
    if (arg == "--url") {
      url = value;
    } else if (arg == "--body") {
      options.body_file = value;
    } else if (arg == "--content-type") {
      options.content_type = value;
    } else if (arg == "--closed") {
      if (!ParseInt(value, &options.closed) || options.closed < 1 || options.closed > 100000) {
        UsageError("--closed needs a number of connections from 1 to 100000, got '" + value + "'");
      }
      have_closed = true;
    } else if (arg == "--open") {
      if (!ParseDouble(value, &options.open_rate) || options.open_rate <= 0 ||
          options.open_rate > 10'000'000) {
        UsageError("--open needs a rate in requests/s > 0, got '" + value + "'");
      }
      have_open = true;
    } else if (arg == "--connections") {
      if (!ParseInt(value, &options.connections) || options.connections < 1 ||
          options.connections > 100000) {
        UsageError("--connections needs a number from 1 to 100000, got '" + value + "'");
      }
    } else if (arg == "--duration") {
      if (!ParseDouble(value, &options.duration_s) || options.duration_s <= 0) {
        UsageError("--duration needs seconds > 0, got '" + value + "'");
      }
    } else if (arg == "--warmup") {
      if (!ParseDouble(value, &options.warmup_s) || options.warmup_s < 0) {
        UsageError("--warmup needs seconds >= 0, got '" + value + "'");
      }
    } else if (arg == "--drain") {
      if (!ParseDouble(value, &options.drain_s) || options.drain_s < 0) {
        UsageError("--drain needs seconds >= 0, got '" + value + "'");
      }
    } else {
      UsageError("unknown argument '" + arg + "'");
    }
  }
  if (url.empty()) UsageError("--url is required");
  if (options.body_file.empty()) UsageError("--body is required");
  if (have_closed == have_open) UsageError("give exactly one of --closed N and --open RATE");
  ParseUrl(url, &options);
  return options;
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 response parsing

// Parses one response from the front of a connection's input buffer. Handles Content-Length,
// chunked transfer coding, bodiless statuses (1xx, 204, 304) and, lacking both length forms,
// a body that runs to the end of the connection.
class ResponseParser {
 public:
  enum class Result { kNeedMore, kDone, kError };

  void Reset() { *this = ResponseParser(); }

  // Looks at buf (everything received since the response began). kDone sets consumed() and
  // status(); kError sets error(). at_eof: the peer closed the connection after buf.
  Result Parse(const std::string& buf, bool at_eof) {
    if (!headers_done_) {
      size_t end = buf.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (buf.size() > kMaxHeaderBytes) return Fail("response headers over 64 KiB");
        if (at_eof) return Fail(buf.empty() ? "connection closed before the response"
                                            : "connection closed inside the response headers");
        return Result::kNeedMore;
      }
      if (Result r = ParseHeaders(std::string_view(buf).substr(0, end)); r != Result::kDone) {
        return r;
      }
      headers_done_ = true;
      body_start_ = end + 4;
      chunk_pos_ = body_start_;
    }
    if (no_body_) return Done(body_start_);
    if (content_length_) {
      size_t want = body_start_ + *content_length_;
      if (buf.size() >= want) return Done(want);
      if (at_eof) return Fail("connection closed inside the response body");
      return Result::kNeedMore;
    }
    if (chunked_) return ParseChunks(buf, at_eof);
    // Neither: the body ends with the connection.
    if (at_eof) {
      close_ = true;
      return Done(buf.size());
    }
    return Result::kNeedMore;
  }

  int status() const { return status_; }
  size_t consumed() const { return consumed_; }
  bool close() const { return close_; }
  bool informational() const { return status_ >= 100 && status_ < 200; }
  const std::string& error() const { return error_; }

 private:
  Result Fail(std::string message) {
    error_ = std::move(message);
    return Result::kError;
  }
  Result Done(size_t consumed) {
    consumed_ = consumed;
    return Result::kDone;
  }

  static std::string Lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  }
  static std::string_view Trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  }

  Result ParseHeaders(std::string_view head) {
    size_t line_end = head.find("\r\n");
    std::string_view status_line = head.substr(0, line_end);
    // HTTP/1.x SSS reason
    if (status_line.size() < 12 || status_line.substr(0, 7) != "HTTP/1." ||
        status_line[8] != ' ') {
      return Fail("bad status line: '" + std::string(status_line.substr(0, 80)) + "'");
    }
    bool http10 = status_line[7] == '0';
    auto [ptr, ec] = std::from_chars(status_line.data() + 9, status_line.data() + 12, status_);
    if (ec != std::errc() || ptr != status_line.data() + 12 || status_ < 100 || status_ > 999) {
      return Fail("bad status code in '" + std::string(status_line.substr(0, 80)) + "'");
    }
    close_ = http10;
    std::string_view rest =
        line_end == std::string_view::npos ? std::string_view() : head.substr(line_end + 2);
    while (!rest.empty()) {
      size_t eol = rest.find("\r\n");
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 2);
      size_t colon = line.find(':');
      if (colon == std::string_view::npos) return Fail("bad header line in the response");
      std::string name = Lower(Trim(line.substr(0, colon)));
      std::string_view value = Trim(line.substr(colon + 1));
      if (name == "content-length") {
        size_t n = 0;
        auto [p, e] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (e != std::errc() || p != value.data() + value.size()) {
          return Fail("bad Content-Length '" + std::string(value) + "'");
        }
        content_length_ = n;
      } else if (name == "transfer-encoding") {
        if (Lower(value).find("chunked") != std::string::npos) chunked_ = true;
      } else if (name == "connection") {
        std::string v = Lower(value);
        if (v.find("close") != std::string::npos) close_ = true;
        if (v.find("keep-alive") != std::string::npos) close_ = false;
      }
    }
    if (chunked_) content_length_.reset();  // RFC 9112 6.3: chunked wins
    no_body_ = informational() || status_ == 204 || status_ == 304;
    return Result::kDone;
  }

  Result ParseChunks(const std::string& buf, bool at_eof) {
    while (true) {
      if (in_trailers_) {
        // Trailer lines until an empty line; chunk_pos_ is at the start of a line.
        size_t eol = buf.find("\r\n", chunk_pos_);
        if (eol == std::string::npos) break;
        if (eol == chunk_pos_) return Done(eol + 2);
        chunk_pos_ = eol + 2;
        continue;
      }
      size_t eol = buf.find("\r\n", chunk_pos_);
      if (eol == std::string::npos) break;
      std::string_view size_text = std::string_view(buf).substr(chunk_pos_, eol - chunk_pos_);
      size_text = size_text.substr(0, size_text.find(';'));
      size_text = Trim(size_text);
      size_t size = 0;
      auto [p, e] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size,
                                    16);
      if (e != std::errc() || p != size_text.data() + size_text.size()) {
        return Fail("bad chunk size in the response");
      }
      if (size == 0) {
        in_trailers_ = true;
        chunk_pos_ = eol + 2;
        continue;
      }
      if (buf.size() < eol + 2 + size + 2) break;
      chunk_pos_ = eol + 2 + size + 2;
    }
    if (at_eof) return Fail("connection closed inside a chunked response body");
    return Result::kNeedMore;
  }

  bool headers_done_ = false;
  bool chunked_ = false;
  bool no_body_ = false;
  bool close_ = false;
  bool in_trailers_ = false;
  int status_ = 0;
  std::optional<size_t> content_length_;
  size_t body_start_ = 0;
  size_t chunk_pos_ = 0;
  size_t consumed_ = 0;
  std::string error_;
};

// ---------------------------------------------------------------------------------------------
// Results

struct Stats {
  int64_t requests = 0;  // counted requests that ended (answered, failed or timed out)
  int64_t ok = 0;
  int64_t errors_status = 0;
  int64_t errors_connection = 0;
  int64_t errors_timeout = 0;
  int64_t ok_in_window = 0;  // 2xx answers received inside the measured window (any request)
  int64_t sent_in_window = 0;
  std::map<int, int64_t> status_counts;
  std::map<std::string, int64_t> connection_error_kinds;
  std::vector<Nanos> latencies;
  size_t max_backlog = 0;
  int64_t reconnects = 0;
};

double Percentile(const std::vector<Nanos>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return static_cast<double>(sorted[rank - 1]) / 1e6;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// ---------------------------------------------------------------------------------------------
// The load generator

class LoadGenerator {
 public:
  LoadGenerator(Options options, addrinfo* address, std::string request)
      : options_(std::move(options)), address_(address), request_(std::move(request)) {}

  // Runs the whole test; the figures are in stats().
  void Run();
  const Stats& stats() const { return stats_; }
  Nanos window_ns() const { return end_ - window_start_; }

 private:
  enum class State { kClosed, kConnecting, kIdle, kBusy, kBackoff };

  struct Connection {
    int fd = -1;
    State state = State::kClosed;
    size_t written = 0;  // bytes of the request written so far
    std::string in;      // bytes of the current response received so far
    ResponseParser parser;
    Nanos start = 0;     // the request's start: send time (closed) or scheduled time (open)
    bool counted = false;
    Nanos backoff_until = 0;
  };

  void Connect(Connection& c);
  void CloseConnection(Connection& c);
  void Send(Connection& c, Nanos start, bool counted);
  void OnEvent(Connection& c, uint32_t events, Nanos now);
  void OnWritable(Connection& c);
  void OnReadable(Connection& c, Nanos now);
  void FinishRequest(Connection& c, Nanos now, int status);
  void FailRequest(Connection& c, const std::string& why);
  void BecomeIdle(Connection& c, Nanos now);
  void ArmTimer(Nanos deadline);
  bool Sending(Nanos now) const { return now < end_; }
  int InFlightCounted() const;

  Options options_;
  addrinfo* address_;  // owned by main; outlives this
  std::string request_;
  std::vector<Connection> conns_;
  std::vector<int> idle_;       // open loop: idle connections, most recently used last
  std::deque<Nanos> backlog_;   // open loop: scheduled times of requests waiting for a connection
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  Nanos armed_ = -1;
  Nanos start_ = 0, window_start_ = 0, end_ = 0;
  int64_t next_index_ = 0;  // open loop: the next request to schedule
  bool started_ = false;    // false while the connections are opened, before the clock starts
  Stats stats_;
};

void LoadGenerator::ArmTimer(Nanos deadline) {
  if (deadline == armed_) return;
  armed_ = deadline;
  itimerspec spec{};
  spec.it_value.tv_sec = deadline / kSecond;
  spec.it_value.tv_nsec = deadline % kSecond;
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void LoadGenerator::Connect(Connection& c) {
  c = Connection{};
  c.fd = socket(address_->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                address_->ai_protocol);
  if (c.fd < 0) {
    std::fprintf(stderr, "serve_load: socket: %s\n", std::strerror(errno));
    std::exit(1);
  }
  int one = 1;
  setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c.state = State::kConnecting;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = static_cast<uint64_t>(&c - conns_.data());
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev);
  ++stats_.reconnects;
  if (connect(c.fd, address_->ai_addr, address_->ai_addrlen) != 0 && errno != EINPROGRESS) {
    CloseConnection(c);  // refused at once: try again a little later
    c.state = State::kBackoff;
    c.backoff_until = NowNs() + kReconnectBackoff;
  }
}

void LoadGenerator::CloseConnection(Connection& c) {
  if (c.fd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
  }
  c.fd = -1;
  c.state = State::kClosed;
  c.in.clear();
  c.parser.Reset();
  c.written = 0;
}

void LoadGenerator::Send(Connection& c, Nanos start, bool counted) {
  c.state = State::kBusy;
  c.start = start;
  c.counted = counted;
  c.written = 0;
  c.in.clear();
  c.parser.Reset();
  if (Nanos now = NowNs(); now >= window_start_ && now < end_) ++stats_.sent_in_window;
  OnWritable(c);
}

void LoadGenerator::OnWritable(Connection& c) {
  while (c.state == State::kBusy && c.written < request_.size()) {
    ssize_t n = send(c.fd, request_.data() + c.written, request_.size() - c.written,
                     MSG_NOSIGNAL);
    if (n > 0) {
      c.written += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // EPOLLOUT (edge-triggered) comes when there is room
    } else {
      FailRequest(c, std::string("send: ") + std::strerror(errno));
      return;
    }
  }
}

void LoadGenerator::OnReadable(Connection& c, Nanos now) {
  char buf[65536];
  bool eof = false;
  while (true) {
    ssize_t n = recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (c.state == State::kBusy) {
      FailRequest(c, std::string("recv: ") + std::strerror(errno));
    } else {
      CloseConnection(c);  // an idle connection the server reset: open a new one
      Connect(c);
    }
    return;
  }
  if (c.state != State::kBusy) {
    if (eof || !c.in.empty()) {
      // The server closed an idle keep-alive connection (or sent something unasked).
      CloseConnection(c);
      if (!Sending(now) && InFlightCounted() == 0 && backlog_.empty()) return;
      Connect(c);
    }
    return;
  }
  while (true) {
    ResponseParser::Result r = c.parser.Parse(c.in, eof);
    if (r == ResponseParser::Result::kNeedMore) {
      if (eof) FailRequest(c, "connection closed before the response");
      return;
    }
    if (r == ResponseParser::Result::kError) {
      FailRequest(c, c.parser.error());
      return;
    }
    if (c.parser.informational()) {  // 100 Continue and the like: the answer follows
      c.in.erase(0, c.parser.consumed());
      c.parser.Reset();
      continue;
    }
    bool close_after = c.parser.close() || eof;
    int status = c.parser.status();
    c.in.erase(0, c.parser.consumed());
    c.parser.Reset();
    if (close_after) CloseConnection(c);
    FinishRequest(c, now, status);
    return;
  }
}

void LoadGenerator::FinishRequest(Connection& c, Nanos now, int status) {
  bool ok = status >= 200 && status < 300;
  if (ok && now >= window_start_ && now < end_) ++stats_.ok_in_window;
  if (c.counted) {
    ++stats_.requests;
    ++stats_.status_counts[status];
    stats_.latencies.push_back(now - c.start);
    if (ok) {
      ++stats_.ok;
    } else {
      ++stats_.errors_status;
    }
  }
  c.counted = false;
  if (c.fd < 0) {
    Connect(c);
    return;
  }
  BecomeIdle(c, now);
}

// The request in flight on c (if any) failed without an answer: counted as a connection error;
// c reconnects.
void LoadGenerator::FailRequest(Connection& c, const std::string& why) {
  if (c.state == State::kBusy && c.counted) {
    ++stats_.requests;
    ++stats_.errors_connection;
    ++stats_.connection_error_kinds[why];
  }
  c.counted = false;
  CloseConnection(c);
  Connect(c);
}

// A connection is free: the closed loop sends its next request, the open loop the oldest
// queued one, or keeps it for the next scheduled request.
void LoadGenerator::BecomeIdle(Connection& c, Nanos now) {
  c.state = State::kIdle;
  if (!started_) return;  // connecting before the clock starts
  if (options_.closed > 0) {
    if (Sending(now)) Send(c, NowNs(), now >= window_start_);
    return;
  }
  if (!backlog_.empty()) {
    Nanos scheduled = backlog_.front();
    backlog_.pop_front();
    Send(c, scheduled, scheduled >= window_start_);
    return;
  }
  idle_.push_back(static_cast<int>(&c - conns_.data()));
}

int LoadGenerator::InFlightCounted() const {
  int n = 0;
  for (const Connection& c : conns_) n += (c.state == State::kBusy && c.counted) ? 1 : 0;
  return n;
}

void LoadGenerator::OnEvent(Connection& c, uint32_t events, Nanos now) {
  if (c.state == State::kConnecting) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
      CloseConnection(c);
      c.state = State::kBackoff;
      c.backoff_until = now + kReconnectBackoff;
      return;
    }
    // An event of the connection's previous socket, reported in the same epoll_wait batch as
    // its replacement was opened, must not pass for the new one's completion.
    sockaddr_storage peer;
    socklen_t peer_len = sizeof peer;
    if (getpeername(c.fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return;
    BecomeIdle(c, now);
    if (c.state != State::kBusy) return;
  }
  if (c.fd >= 0 && c.state == State::kBusy && (events & EPOLLOUT)) OnWritable(c);
  if (c.fd >= 0 && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    OnReadable(c, now);
  }
}

void LoadGenerator::Run() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epoll_fd_ < 0 || timer_fd_ < 0) {
    std::fprintf(stderr, "serve_load: epoll/timerfd: %s\n", std::strerror(errno));
    std::exit(1);
  }
  constexpr uint64_t kTimerTag = ~uint64_t{0};
  epoll_event tev{};
  tev.events = EPOLLIN;
  tev.data.u64 = kTimerTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &tev);

  const bool open = options_.closed == 0;
  const int n_conns = open ? options_.connections : options_.closed;
  conns_.resize(static_cast<size_t>(n_conns));
  idle_.reserve(conns_.size());
  if (open) {
    stats_.latencies.reserve(static_cast<size_t>(
        std::min(options_.open_rate * options_.duration_s * 1.1 + 16, 5e7)));
  }

  // Open every connection before the clock starts, so that the first requests do not pay
  // for the handshakes. (The closed loop sends on each as soon as the clock started.)
  const Nanos connect_deadline = NowNs() + 5 * kSecond;
  for (Connection& c : conns_) Connect(c);
  std::vector<epoll_event> events(256);
  while (NowNs() < connect_deadline) {
    int connected = 0;
    for (const Connection& c : conns_) connected += c.state == State::kIdle ? 1 : 0;
    if (connected == n_conns) break;
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 10);
    Nanos now = NowNs();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kTimerTag) continue;
      OnEvent(conns_[events[i].data.u64], events[i].events, now);
    }
    for (Connection& c : conns_) {
      if (c.state == State::kBackoff && now >= c.backoff_until) Connect(c);
    }
  }
  idle_.clear();
  std::vector<Nanos> latencies = std::move(stats_.latencies);
  stats_ = Stats{};
  stats_.latencies = std::move(latencies);
  started_ = true;

  start_ = NowNs();
  window_start_ = start_ + static_cast<Nanos>(options_.warmup_s * 1e9);
  end_ = window_start_ + static_cast<Nanos>(options_.duration_s * 1e9);
  const Nanos drain_end = end_ + static_cast<Nanos>(options_.drain_s * 1e9);
  const double interval_ns = open ? 1e9 / options_.open_rate : 0;
  auto scheduled_at = [&](int64_t i) {
    return start_ + static_cast<Nanos>(std::llround(static_cast<double>(i) * interval_ns));
  };

  // Start: the closed loop sends on every connected connection; the open loop parks them.
  for (Connection& c : conns_) {
    if (c.state == State::kIdle) BecomeIdle(c, start_);
  }

  while (true) {
    Nanos now = NowNs();
    // Open loop: every request whose time has come goes out, or waits for a connection.
    if (open) {
      while (true) {
        Nanos t = scheduled_at(next_index_);
        if (t > now || t >= end_) break;
        ++next_index_;
        if (!idle_.empty()) {
          int i = idle_.back();
          idle_.pop_back();
          Send(conns_[static_cast<size_t>(i)], t, t >= window_start_);
        } else {
          backlog_.push_back(t);
          stats_.max_backlog = std::max(stats_.max_backlog, backlog_.size());
        }
      }
    }
    // Reconnects after a failed connect.
    Nanos next_backoff = INT64_MAX;
    for (Connection& c : conns_) {
      if (c.state != State::kBackoff) continue;
      if (now >= c.backoff_until) {
        Connect(c);
      } else {
        next_backoff = std::min(next_backoff, c.backoff_until);
      }
    }
    // Done: past the window with nothing counted outstanding, or past the drain.
    if (now >= end_) {
      int outstanding = InFlightCounted();
      for (Nanos t : backlog_) outstanding += t >= window_start_ ? 1 : 0;
      if (outstanding == 0 || now >= drain_end) break;
    }
    Nanos deadline = now < end_ ? end_ : drain_end;
    if (open && scheduled_at(next_index_) < end_) {
      deadline = std::min(deadline, scheduled_at(next_index_));
    }
    deadline = std::min(deadline, next_backoff);
    ArmTimer(deadline);
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "serve_load: epoll_wait: %s\n", std::strerror(errno));
      std::exit(1);
    }
    now = NowNs();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kTimerTag) {
        uint64_t expirations;
        ssize_t r = read(timer_fd_, &expirations, sizeof expirations);
        (void)r;
        armed_ = -1;
        continue;
      }
      OnEvent(conns_[events[i].data.u64], events[i].events, now);
    }
  }

  // Whatever counted request is still outstanding timed out.
  Nanos now = NowNs();
  for (Connection& c : conns_) {
    if (c.state == State::kBusy && c.counted) {
      ++stats_.requests;
      ++stats_.errors_timeout;
      stats_.latencies.push_back(now - c.start);
    }
    CloseConnection(c);
  }
  for (Nanos t : backlog_) {
    if (t < window_start_) continue;
    ++stats_.requests;
    ++stats_.errors_timeout;
    stats_.latencies.push_back(now - t);
  }
  close(timer_fd_);
  close(epoll_fd_);
}

// Connects once, blocking up to 3 s: a clear message when nothing listens there.
bool CheckReachable(const Options& options, addrinfo* address, std::string* error) {
  int fd = socket(address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  address->ai_protocol);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  int err = 0;
  if (connect(fd, address->ai_addr, address->ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int n = poll(&p, 1, 3000);
      if (n == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
  }
  close(fd);
  if (err != 0) {
    *error = "cannot connect to " + options.host + ":" + options.port + ": " + std::strerror(err);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseArgs(argc, argv);

  std::ifstream body_in(options.body_file, std::ios::binary);
  if (!body_in) {
    std::fprintf(stderr, "serve_load: cannot read --body %s: %s\n", options.body_file.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::ostringstream body_stream;
  body_stream << body_in.rdbuf();
  std::string body = body_stream.str();

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* address = nullptr;
  if (int rc = getaddrinfo(options.host.c_str(), options.port.c_str(), &hints, &address);
      rc != 0) {
    std::fprintf(stderr, "serve_load: cannot resolve %s: %s\n", options.host.c_str(),
                 gai_strerror(rc));
    return 1;
  }
  std::string error;
  if (!CheckReachable(options, address, &error)) {
    std::fprintf(stderr, "serve_load: %s (is the server running?)\n", error.c_str());
    freeaddrinfo(address);
    return 1;
  }

  std::string host_header = options.host.find(':') != std::string::npos
                                ? "[" + options.host + "]:" + options.port
                                : options.host + ":" + options.port;
  std::string request = "POST " + options.path + " HTTP/1.1\r\nHost: " + host_header +
                        "\r\nContent-Type: " + options.content_type +
                        "\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\nConnection: keep-alive\r\n\r\n" + body;

  const bool open = options.closed == 0;
  if (open) {
    std::fprintf(stderr, "serve_load: open loop at %g req/s over %d connections, %gs + %gs warmup\n",
                 options.open_rate, options.connections, options.duration_s, options.warmup_s);
  } else {
    std::fprintf(stderr, "serve_load: closed loop over %d connections, %gs + %gs warmup\n",
                 options.closed, options.duration_s, options.warmup_s);
  }

  LoadGenerator generator(options, address, request);
  generator.Run();
  freeaddrinfo(address);

  Stats stats = generator.stats();
  std::sort(stats.latencies.begin(), stats.latencies.end());
  const double window_s = static_cast<double>(generator.window_ns()) / 1e9;
  const int64_t errors = stats.errors_status + stats.errors_connection + stats.errors_timeout;
  double mean_ms = 0;
  for (Nanos l : stats.latencies) mean_ms += static_cast<double>(l) / 1e6;
  if (!stats.latencies.empty()) mean_ms /= static_cast<double>(stats.latencies.size());

  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(3);
  out << "{\"mode\": \"" << (open ? "open" : "closed") << "\"";
  out << ", \"connections\": " << (open ? options.connections : options.closed);
  out << ", \"duration_s\": " << window_s << ", \"warmup_s\": " << options.warmup_s;
  out << ", \"body_bytes\": " << body.size();
  out << ", \"requests\": " << stats.requests << ", \"ok\": " << stats.ok
      << ", \"errors\": " << errors;
  out << ", \"error_kinds\": {\"status\": " << stats.errors_status
      << ", \"connection\": " << stats.errors_connection
      << ", \"timeout\": " << stats.errors_timeout << "}";
  out << ", \"status_counts\": {";
  bool first = true;
  for (const auto& [status, count] : stats.status_counts) {
    out << (first ? "" : ", ") << "\"" << status << "\": " << count;
    first = false;
  }
  out << "}";
  if (!stats.connection_error_kinds.empty()) {
    out << ", \"connection_errors\": {";
    first = true;
    for (const auto& [why, count] : stats.connection_error_kinds) {
      out << (first ? "" : ", ") << JsonString(why) << ": " << count;
      first = false;
    }
    out << "}";
  }
  out << ", \"throughput_rps\": " << static_cast<double>(stats.ok_in_window) / window_s;
  if (open) {
    out << ", \"target_rps\": " << options.open_rate;
    out << ", \"sent_rps\": " << static_cast<double>(stats.sent_in_window) / window_s;
    out << ", \"achieved_rps\": " << static_cast<double>(stats.ok_in_window) / window_s;
    out << ", \"max_backlog\": " << stats.max_backlog;
  }
  out << ", \"latency_ms\": {\"count\": " << stats.latencies.size();
  out << ", \"mean\": " << mean_ms;
  out << ", \"p50\": " << Percentile(stats.latencies, 0.50);
  out << ", \"p90\": " << Percentile(stats.latencies, 0.90);
  out << ", \"p99\": " << Percentile(stats.latencies, 0.99);
  out << ", \"p999\": " << Percentile(stats.latencies, 0.999);
  out << ", \"max\": "
      << (stats.latencies.empty() ? 0.0 : static_cast<double>(stats.latencies.back()) / 1e6)
      << "}";
  out << ", \"reconnects\": " << stats.reconnects;
  out << "}";
  std::printf("%s\n", out.str().c_str());
  std::fprintf(stderr, "serve_load: %lld requests, %lld errors, %.1f req/s, p50 %.3f ms, p99 %.3f ms\n",
               static_cast<long long>(stats.requests), static_cast<long long>(errors),
               static_cast<double>(stats.ok_in_window) / window_s,
               Percentile(stats.latencies, 0.5), Percentile(stats.latencies, 0.99));
  return 0;
}
