#include "ui/ui_server.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/local_address.h"
#include "common/percent_decoding.h"
#include "serve/frontends/bearer_token.h"
#include "ui/ui_routes.h"

namespace shoal::ui {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr char kSessionCookie[] = "shoal_ui_session";
// What every page may do: its own scripts, styles and fetches, and nothing inline, so that no
// text a task printed can ever run.
constexpr char kContentSecurityPolicy[] =
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

// No referrer leaves for another site (a TensorBoard link, say). Not "no-referrer": under it a
// browser sends `Origin: null` with the page's own POSTs (the login form, fetch), which the
// cross-site check must refuse.
constexpr char kReferrerPolicy[] = "same-origin";

// Boost 1.74's string_view is neither std's nor Debian abseil's.
absl::string_view Std(beast::string_view view) { return {view.data(), view.size()}; }

std::map<std::string, std::string> ParseQuery(absl::string_view query) {
  std::map<std::string, std::string> out;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    size_t eq = pair.find('=');
    std::string key(pair.substr(0, eq));
    std::string value(eq == std::string_view::npos ? "" : pair.substr(eq + 1));
    std::replace(key.begin(), key.end(), '+', ' ');
    std::replace(value.begin(), value.end(), '+', ' ');
    out[common::PercentDecoded(key)] = common::PercentDecoded(value);
  }
  return out;
}

std::string CookieValue(absl::string_view header, absl::string_view name) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::StartsWith(part, name) && part.size() > name.size() && part[name.size()] == '=') {
      return std::string(part.substr(name.size() + 1));
    }
  }
  return "";
}

constexpr char kLoginPage[] = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Shoal: sign in</title>
<link rel="stylesheet" href="/assets/app.css"></head>
<body><header><span class="brand">Shoal</span></header><main>
<form method="post" action="/login" class="login">
<p>This dashboard needs its token (the file given to <code>shoal ui --token-file</code>).</p>
<label>Token <input type="password" name="token" autocomplete="current-password" autofocus></label>
<button type="submit">Sign in</button>
</form></main></body></html>
)";

}  // namespace

struct UiServer::Impl {
  UiServerOptions options;
  std::unique_ptr<UiRoutes> routes;
  asio::io_context io;
  std::optional<tcp::acceptor> acceptor;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable idle;
  std::list<std::pair<std::thread, std::shared_ptr<tcp::socket>>> connections;
  int live = 0;
  uint16_t port = 0;

  bool Authorized(const http::request<http::string_body>& request) const {
    if (options.token.empty()) return true;
    absl::string_view authorization = Std(request[http::field::authorization]);
    if (serve::BearerTokenMatches({authorization.data(), authorization.size()}, options.token)) {
      return true;
    }
    std::string cookie = CookieValue(Std(request[http::field::cookie]), kSessionCookie);
    return serve::BearerTokenMatches(absl::StrCat("Bearer ", cookie), options.token);
  }

  // A state-changing request must come from this UI's own pages: a custom header that a
  // cross-site form cannot send (and a cross-site fetch could only send after a CORS
  // preflight, never granted), and the browser's Origin, when sent, naming this host.
  std::optional<std::string> CrossSiteRefusal(const http::request<http::string_body>& request,
                                              bool needs_header) const {
    absl::string_view origin = Std(request[http::field::origin]);
    absl::string_view host = Std(request[http::field::host]);
    if (!origin.empty() && origin != absl::StrCat("http://", host) &&
        origin != absl::StrCat("https://", host)) {
      return absl::StrCat("cross-site request refused: Origin ", origin, " is not this UI (",
                          host, ")");
    }
    if (Std(request["Sec-Fetch-Site"]) == "cross-site") {
      return std::string("cross-site request refused (Sec-Fetch-Site: cross-site)");
    }
    if (needs_header && Std(request["X-Shoal-Request"]) != "1") {
      return std::string(
          "state-changing requests need the header X-Shoal-Request: 1 (the UI's pages send it)");
    }
    return std::nullopt;
  }

  static void Write(tcp::socket& socket, const UiReply& reply, bool keep_alive, bool head) {
    std::string out = absl::StrCat("HTTP/1.1 ", reply.status, " ",
                                   Std(http::obsolete_reason(http::int_to_status(reply.status))),
                                   "\r\nContent-Type: ", reply.content_type,
                                   "\r\nContent-Length: ", reply.body.size(),
                                   "\r\nX-Content-Type-Options: nosniff\r\nContent-Security-Policy: ",
                                   kContentSecurityPolicy, "\r\nReferrer-Policy: ", kReferrerPolicy,
                                   "\r\n");
    for (const auto& [name, value] : reply.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
    if (!keep_alive) out += "Connection: close\r\n";
    out += "\r\n";
    if (!head) out += reply.body;
    beast::error_code ec;
    asio::write(socket, asio::buffer(out), ec);
  }

  void Serve(std::shared_ptr<tcp::socket> socket) {
    // Idle keep-alive connections and stalled requests end after this long.
    timeval timeout{30, 0};
    ::setsockopt(socket->native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(socket->native_handle(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    beast::flat_buffer buffer;
    while (!stopping) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(64 * 1024);
      parser.body_limit(64 * 1024);
      beast::error_code ec;
      http::read(*socket, buffer, parser, ec);
      if (ec) {
        if (ec == http::error::body_limit || ec == http::error::header_limit) {
          Write(*socket, UiRoutes::Error(413, "request too large"), false, false);
        } else if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
                   ec != http::error::end_of_stream && ec != http::error::partial_message) {
          Write(*socket, UiRoutes::Error(400, absl::StrCat("malformed HTTP request: ", ec.message())),
                false, false);
        }
        break;
      }
      auto message = parser.release();
      bool keep_alive = message.keep_alive();
      if (!Handle(*socket, message, keep_alive) || !keep_alive) break;
    }
    beast::error_code ignored;
    socket->shutdown(tcp::socket::shutdown_both, ignored);
    socket->close(ignored);
  }

  // False when the connection must close.
  bool Handle(tcp::socket& socket, const http::request<http::string_body>& message,
              bool keep_alive) {
    absl::string_view target = Std(message.target());
    UiRequest request;
    request.method = std::string(Std(message.method_string()));
    request.path = common::PercentDecoded(std::string(target.substr(0, target.find('?'))));
    if (size_t q = target.find('?'); q != std::string_view::npos) {
      request.query = ParseQuery(target.substr(q + 1));
    }
    request.body = message.body();
    bool head = request.method == "HEAD";
    if (request.path == "/login") return Login(socket, message, request, keep_alive);
    // The stylesheet and icon are public: the login page uses them.
    bool public_asset = request.path == "/assets/app.css" || request.path == "/favicon.svg";
    if (!public_asset && !Authorized(message)) {
      bool page = request.method == "GET" && !absl::StartsWith(request.path, "/api/") &&
                  request.path != "/metrics";
      if (page) {
        UiReply reply;
        reply.status = 303;
        reply.content_type = "text/plain; charset=utf-8";
        reply.body = "sign in at /login\n";
        reply.headers.emplace_back("Location", "/login");
        Write(socket, reply, keep_alive, head);
      } else {
        UiReply reply = UiRoutes::Error(
            401, "this dashboard needs its token: send Authorization: Bearer <token>, or sign "
                 "in at /login");
        reply.headers.emplace_back("WWW-Authenticate", "Bearer");
        Write(socket, reply, keep_alive, head);
      }
      return true;
    }
    if (request.method != "GET" && request.method != "HEAD") {
      if (auto refusal = CrossSiteRefusal(message, /*needs_header=*/true)) {
        Write(socket, UiRoutes::Error(403, *refusal), keep_alive, false);
        return true;
      }
    }
    if (UiRoutes::IsFollow(request)) return Follow(socket, request);
    Write(socket, routes->Handle(request), keep_alive, head);
    return true;
  }

  bool Login(tcp::socket& socket, const http::request<http::string_body>& message,
             const UiRequest& request, bool keep_alive) {
    UiReply reply;
    reply.content_type = "text/html; charset=utf-8";
    if (request.method == "GET") {
      reply.body = kLoginPage;
      Write(socket, reply, keep_alive, false);
      return true;
    }
    if (request.method != "POST") {
      Write(socket, UiRoutes::Error(405, "/login: GET or POST"), keep_alive, false);
      return true;
    }
    if (auto refusal = CrossSiteRefusal(message, /*needs_header=*/false)) {
      Write(socket, UiRoutes::Error(403, *refusal), keep_alive, false);
      return true;
    }
    auto form = ParseQuery(request.body);
    std::string token = form.count("token") ? form["token"] : "";
    if (options.token.empty() ||
        !serve::BearerTokenMatches(absl::StrCat("Bearer ", token), options.token)) {
      reply.status = 401;
      reply.body = absl::StrCat(kLoginPage, "<p class=\"error\">Wrong token.</p>\n");
      if (options.token.empty()) reply.status = 404;
      Write(socket, reply, keep_alive, false);
      return true;
    }
    reply.status = 303;
    reply.body = "signed in\n";
    reply.headers.emplace_back("Location", "/");
    reply.headers.emplace_back(
        "Set-Cookie", absl::StrCat(kSessionCookie, "=", options.token,
                                   "; Path=/; HttpOnly; SameSite=Strict"));
    Write(socket, reply, keep_alive, false);
    return true;
  }

  bool Follow(tcp::socket& socket, const UiRequest& request) {
    bool started = false;
    auto sink = [&](std::string_view event_view, std::string_view data_view) {
      absl::string_view event(event_view.data(), event_view.size());
      absl::string_view data(data_view.data(), data_view.size());
      std::string out;
      if (!started) {
        out = absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                           "Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"
                           "Connection: close\r\n\r\n");
        started = true;
      }
      if (event.empty()) {
        out += ": keep-alive\n\n";
      } else {
        absl::StrAppend(&out, "event: ", event, "\ndata: ", data, "\n\n");
      }
      beast::error_code ec;
      asio::write(socket, asio::buffer(out), ec);
      return !ec;
    };
    auto reply = routes->Follow(request, sink, [this] { return stopping.load(); });
    if (reply) Write(socket, *reply, false, false);
    return false;  // an event stream ends its connection
  }

  void AcceptLoop() {
    while (!stopping) {
      auto socket = std::make_shared<tcp::socket>(io);
      beast::error_code ec;
      acceptor->accept(*socket, ec);
      if (ec || stopping) break;
      std::lock_guard<std::mutex> lock(mu);
      // Reap the threads of connections that ended.
      for (auto it = connections.begin(); it != connections.end();) {
        if (!it->second) {
          it->first.join();
          it = connections.erase(it);
        } else {
          ++it;
        }
      }
      if (live >= options.max_connections) {
        Write(*socket, UiRoutes::Error(503, "too many connections to the dashboard"), false, false);
        socket->close(ec);
        continue;
      }
      ++live;
      connections.emplace_back();
      auto entry = std::prev(connections.end());
      entry->second = socket;
      entry->first = std::thread([this, socket, entry] {
        Serve(socket);
        std::lock_guard<std::mutex> lock(mu);
        entry->second.reset();
        --live;
        idle.notify_all();
      });
    }
  }
};

UiServer::UiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<UiServer>> UiServer::Start(UiServerOptions options) {
  if (!options.now_unix_ms) {
    options.now_unix_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->routes = std::make_unique<UiRoutes>(UiRoutes::Options{
      options.jobs_root, options.serve_urls, options.shoal_binary, options.now_unix_ms});
  beast::error_code ec;
  std::string host = options.host == "localhost" ? "127.0.0.1" : options.host;
  if (absl::StartsWith(host, "[")) host = host.substr(1, host.size() - 2);
  auto address = asio::ip::make_address(host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: '", options.host, "' is not an IP address"));
  }
  if (!common::IsLoopbackHost(options.host) && options.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to listen on ", options.host,
        " without a token: anyone who reaches it could kill jobs. Give --token-file FILE (or "
        "set SHOAL_UI_TOKEN_FILE), or listen on 127.0.0.1"));
  }
  impl->acceptor.emplace(impl->io);
  tcp::endpoint endpoint(address, options.port);
  impl->acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor->bind(endpoint, ec);
  if (!ec) impl->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port, ": ", ec.message()));
  }
  impl->port = impl->acceptor->local_endpoint().port();
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<UiServer>(new UiServer(std::move(impl)));
}

uint16_t UiServer::port() const { return impl_->port; }

void UiServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  beast::error_code ec;
  // Wakes the blocked accept; the acceptor is closed once its thread is gone.
  ::shutdown(impl_->acceptor->native_handle(), SHUT_RDWR);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  impl_->acceptor->close(ec);
  std::list<std::pair<std::thread, std::shared_ptr<tcp::socket>>> connections;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [thread, socket] : impl_->connections) {
      if (socket) ::shutdown(socket->native_handle(), SHUT_RDWR);
    }
    connections.swap(impl_->connections);
  }
  for (auto& [thread, socket] : connections) {
    if (thread.joinable()) thread.join();
  }
  impl_->routes->StopChildren();
}

UiServer::~UiServer() { Stop(); }

}  // namespace shoal::ui
