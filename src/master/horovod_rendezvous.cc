#include "master/horovod_rendezvous.h"

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"
#include "common/percent_decoding.h"

namespace shoal::master {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A rank's request must arrive, and its answer be taken, within this: a stalled client costs
// one idle socket, never the other ranks' answers.
constexpr std::chrono::seconds kRequestTimeout{30};
// Values are gloo addresses (tens of bytes); a megabyte leaves room for anything Horovod stores.
constexpr uint64_t kMaxBodyBytes = 1 << 20;

struct ScopeKey {
  std::string scope, key;
};

// Exactly /<scope>/<key> (a query string aside), both non-empty: anything else is refused.
std::optional<ScopeKey> ParseTarget(std::string_view target) {
  target = target.substr(0, target.find('?'));
  if (target.size() < 4 || target.front() != '/') return std::nullopt;
  target.remove_prefix(1);
  size_t slash = target.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == target.size()) {
    return std::nullopt;
  }
  std::string_view key = target.substr(slash + 1);
  if (key.find('/') != std::string_view::npos) return std::nullopt;
  return ScopeKey{common::PercentDecoded(target.substr(0, slash)), common::PercentDecoded(key)};
}

}  // namespace

// One io_context on one thread: the store is touched only there, so it needs no lock.
struct HorovodRendezvous::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::map<std::string, std::map<std::string, std::string>> scopes;  // scope -> key -> value

  void Accept();
  http::response<http::string_body> Answer(const http::request<http::string_body>& request);
};

namespace {

// One request per connection, as Horovod's clients send and its server answers. `Store` has
// Answer(request) -> response.
template <typename Store>
class Exchange : public std::enable_shared_from_this<Exchange<Store>> {
 public:
  Exchange(tcp::socket socket, Store* store)
      : stream_(std::move(socket)), store_(store) {}

  void Start() {
    parser_.emplace();
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(kRequestTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRead(ec);
                     });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream) return;
    if (ec) {
      // A malformed or oversized request is answered, like Horovod's server does; a timed-out
      // or reset one just closes.
      if (ec == beast::error::timeout || ec == asio::error::operation_aborted ||
          ec == asio::error::connection_reset || ec == asio::error::eof) {
        return;
      }
      response_.result(ec == http::error::body_limit ? http::status::payload_too_large
                                                     : http::status::bad_request);
    } else {
      response_ = store_->Answer(parser_->get());
    }
    response_.keep_alive(false);
    response_.prepare_payload();
    http::async_write(stream_, response_,
                      [self = this->shared_from_this()](beast::error_code, size_t) {
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                      });
  }

  beast::tcp_stream stream_;
  Store* store_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_{http::status::ok, 11};
};

}  // namespace

void HorovodRendezvous::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // stopping
    if (!ec) std::make_shared<Exchange<Impl>>(std::move(socket), this)->Start();
    Accept();
  });
}

http::response<http::string_body> HorovodRendezvous::Impl::Answer(
    const http::request<http::string_body>& request) {
  http::response<http::string_body> response{http::status::ok, request.version()};
  beast::string_view raw = request.target();
  std::optional<ScopeKey> where = ParseTarget({raw.data(), raw.size()});
  if (!where) {
    response.result(http::status::bad_request);
    return response;
  }
  switch (request.method()) {
    case http::verb::get: {
      auto scope = scopes.find(where->scope);
      if (scope == scopes.end() || scope->second.count(where->key) == 0) {
        response.result(http::status::not_found);  // at once: ranks poll, a GET never waits
        break;
      }
      response.set(http::field::content_type, "application/octet-stream");
      response.body() = scope->second.at(where->key);
      break;
    }
    case http::verb::put:
      scopes[where->scope][where->key] = request.body();
      break;
    case http::verb::delete_: {
      // A rank deletes its key once the scope's rendezvous is complete: only garbage collection.
      auto scope = scopes.find(where->scope);
      if (scope != scopes.end()) {
        scope->second.erase(where->key);
        if (scope->second.empty()) scopes.erase(scope);
      }
      break;
    }
    default:
      response.result(http::status::method_not_allowed);
      response.set(http::field::allow, "GET, PUT, DELETE");
  }
  return response;
}

absl::StatusOr<std::unique_ptr<HorovodRendezvous>> HorovodRendezvous::Start(
    const std::string& host) {
  std::unique_ptr<HorovodRendezvous> rdzv(new HorovodRendezvous());
  rdzv->impl_ = std::make_unique<Impl>();
  Impl* impl = rdzv->impl_.get();
  beast::error_code ec;
  tcp::endpoint endpoint(asio::ip::make_address(host, ec), 0);
  if (ec) {  // a host name: its first IPv4 address, which is what Horovod's ranks dial
    tcp::resolver resolver(impl->io);
    auto found = resolver.resolve(tcp::v4(), host, "0", ec);
    if (ec || found.empty()) {
      return absl::UnavailableError(absl::StrCat("cannot resolve ", host,
                                                 " for Horovod's rendezvous: ", ec.message()));
    }
    endpoint = found.begin()->endpoint();
  }
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for Horovod's rendezvous on ", host, ": ", ec.message()));
  }
  rdzv->host_ = host;
  rdzv->port_ = impl->acceptor.local_endpoint().port();
  impl->Accept();
  // Already listening: a rank that connects before the thread runs just waits.
  impl->thread = std::thread([impl] { impl->io.run(); });
  return rdzv;
}

HorovodRendezvous::~HorovodRendezvous() {
  if (impl_) {
    impl_->io.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  }
}

}  // namespace shoal::master
