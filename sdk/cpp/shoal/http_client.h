#pragma once

// A minimal HTTP/1.1 client for WebHDFS (webhdfs.h): one request per connection, plain http://,
// bounded waits, chunked bodies decoded, interim 1xx answers skipped.

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "shoal/json_scan.h"
#include "shoal/posix.h"

namespace shoal::sdk {

namespace internal {

// How long one WebHDFS connect, send or receive may wait for progress.
inline constexpr int kWebHdfsTimeoutMs = 30000;

// Percent-encodes `text`; `keep_slash` for paths (as Python's urllib.parse.quote), else for
// query values (as urlencode, but %20 for a space).
inline std::string PercentEncode(std::string_view text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
    if (plain) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Decodes a chunked transfer-encoding body. nullopt when it is malformed or incomplete.
inline std::optional<std::string> DecodeChunked(std::string_view body) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t eol = body.find("\r\n", pos);
    if (eol == std::string_view::npos) return std::nullopt;
    std::string size_text(body.substr(pos, eol - pos));
    if (size_t semi = size_text.find(';'); semi != std::string::npos) size_text.resize(semi);
    if (size_text.empty()) return std::nullopt;
    char* end = nullptr;
    unsigned long long size = std::strtoull(size_text.c_str(), &end, 16);
    while (*end == ' ' || *end == '\t') ++end;
    if (*end != '\0') return std::nullopt;
    pos = eol + 2;
    if (size == 0) return out;  // trailers, if any, are ignored
    if (body.size() - pos < size + 2) return std::nullopt;
    out.append(body.data() + pos, static_cast<size_t>(size));
    pos += static_cast<size_t>(size);
    if (body.substr(pos, 2) != "\r\n") return std::nullopt;
    pos += 2;
  }
}

struct HttpResponse {
  int status = 0;
  std::string location;
  std::string body;
};

// Blocks until `fd` is ready for `events` or the deadline. "" or an error.
inline std::string WaitFd(int fd, short events,
                          std::chrono::steady_clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return "timed out after " + std::to_string(kWebHdfsTimeoutMs / 1000) + "s";
    struct pollfd pfd = {fd, events, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return ErrnoText("poll", errno);
    if (ready > 0) return "";
  }
}

// Connects to host:port within the timeout. The socket, or -1 with `error` set.
inline int ConnectTcp(const std::string& host, const std::string& port, std::string* error) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    *error = "cannot resolve " + host + ": " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (struct addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      *error = ErrnoText("socket", errno);
      continue;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWebHdfsTimeoutMs);
    int c = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (c != 0 && errno == EINPROGRESS) {
      std::string wait = WaitFd(fd, POLLOUT, deadline);
      if (wait.empty()) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) break;
        *error = ErrnoText("cannot connect to " + host + ":" + port, err);
      } else {
        *error = "cannot connect to " + host + ":" + port + ": " + wait;
      }
    } else if (c == 0) {
      break;
    } else {
      *error = ErrnoText("cannot connect to " + host + ":" + port, errno);
    }
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  return fd;
}

// Where the final answer starts in `raw`, after any complete interim 1xx answers ("100
// Continue", which DataNodes send before reading a CREATE's body).
inline size_t SkipInterimAnswers(std::string_view raw) {
  size_t start = 0;
  while (raw.size() - start > 12 && raw.substr(start, 5) == "HTTP/") {
    size_t space = raw.find(' ', start);
    if (space == std::string_view::npos || space + 1 >= raw.size() || raw[space + 1] != '1') break;
    size_t end = raw.find("\r\n\r\n", start);
    if (end == std::string_view::npos) break;
    start = end + 4;
  }
  return start;
}

// One HTTP/1.1 request (Connection: close), no redirects followed. "" or an error.
inline std::string HttpOnce(const std::string& method, const std::string& url,
                            std::string_view body, HttpResponse* response) {
  constexpr std::string_view kHttp = "http://";
  if (url.compare(0, kHttp.size(), kHttp) != 0) return "not an http:// URL";
  size_t slash = url.find('/', kHttp.size());
  std::string authority = url.substr(kHttp.size(), slash == std::string::npos
                                                       ? std::string::npos
                                                       : slash - kHttp.size());
  std::string target = slash == std::string::npos ? "/" : url.substr(slash);
  std::string host = authority, port = "80";
  if (!host.empty() && host[0] == '[') {
    size_t close = host.find(']');
    if (close == std::string::npos) return "bad host in URL";
    if (close + 1 < host.size() && host[close + 1] == ':') port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host.empty()) return "no host in URL";
  std::string error;
  int fd = ConnectTcp(host, port, &error);
  if (fd < 0) return error;
  // Each wait gets the whole timeout: a large checkpoint may take long, a stalled peer may not.
  auto deadline = [] {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(kWebHdfsTimeoutMs);
  };
  std::string request = method + " " + target + " HTTP/1.1\r\nHost: " + authority +
                        "\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\n";
  if (!body.empty()) request += "Content-Type: application/octet-stream\r\n";
  request += "\r\n";
  auto send_all = [&](std::string_view data) -> std::string {
    while (!data.empty()) {
      if (std::string wait = WaitFd(fd, POLLOUT, deadline()); !wait.empty()) return wait;
      ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoText("send", errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return "";
  };
  std::string sent = send_all(request);
  if (sent.empty()) sent = send_all(body);
  // A server may answer (a redirect, an error) before reading the body: read its answer anyway.
  std::string raw;
  std::string read_error;
  while (true) {
    if (std::string wait = WaitFd(fd, POLLIN, deadline()); !wait.empty()) {
      read_error = wait;
      break;
    }
    char chunk[1 << 16];
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      read_error = ErrnoText("recv", errno);
      break;
    }
    if (n == 0) break;
    raw.append(chunk, static_cast<size_t>(n));
    // Stop once a Content-Length body is complete (the server may keep the connection).
    size_t start = SkipInterimAnswers(raw);
    size_t head_end = raw.find("\r\n\r\n", start);
    if (head_end != std::string::npos) {
      std::string head = raw.substr(start, head_end - start);
      for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t cl = head.find("\r\ncontent-length:");
      if (cl != std::string::npos && head.find("\r\ntransfer-encoding:") == std::string::npos) {
        unsigned long long length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
        if (raw.size() - head_end - 4 >= length) break;
      }
    }
  }
  ::close(fd);
  raw.erase(0, SkipInterimAnswers(raw));
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (!read_error.empty()) return read_error;
    return !sent.empty() ? sent : "connection closed before a complete answer";
  }
  std::string_view head(raw.data(), head_end);
  if (head.substr(0, 5) != "HTTP/" || head.find(' ') == std::string_view::npos) {
    return "not an HTTP answer";
  }
  response->status = std::atoi(std::string(head.substr(head.find(' ') + 1, 3)).c_str());
  bool chunked = false;
  long long content_length = -1;
  for (size_t pos = head.find("\r\n"); pos != std::string_view::npos;) {
    size_t next = head.find("\r\n", pos + 2);
    std::string_view line = head.substr(pos + 2, next == std::string_view::npos
                                                     ? std::string_view::npos
                                                     : next - pos - 2);
    pos = next;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name(line.substr(0, colon));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value(line.substr(SkipSpace(line, colon + 1)));
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
    if (name == "location") response->location = value;
    if (name == "content-length") content_length = std::atoll(value.c_str());
    if (name == "transfer-encoding") {
      for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      chunked = value.find("chunked") != std::string::npos;
    }
  }
  std::string_view rest(raw.data() + head_end + 4, raw.size() - head_end - 4);
  if (chunked) {
    std::optional<std::string> decoded = DecodeChunked(rest);
    if (!decoded) return "incomplete chunked answer" + (read_error.empty() ? "" : ": " + read_error);
    response->body = std::move(*decoded);
  } else if (content_length >= 0) {
    if (rest.size() < static_cast<size_t>(content_length)) {
      return "answer shorter than its Content-Length" +
             (read_error.empty() ? "" : ": " + read_error);
    }
    response->body = std::string(rest.substr(0, static_cast<size_t>(content_length)));
  } else {
    if (!read_error.empty()) return read_error;
    response->body = std::string(rest);
  }
  return "";
}

}  // namespace internal

}  // namespace shoal::sdk
