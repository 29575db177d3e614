#include "serve/frontends/inference_http_server.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/percent_decoding.h"
#include "serve/frontends/bearer_token.h"
#include "serve/frontends/http_request_reader.h"
#include "serve/frontends/inference_http_routes.h"
#include "serve/frontends/json_codec.h"
#include "serve/frontends/simple_http_request.h"
#include "serve/scheduling/completion_home.h"
#include "serve/scheduling/model_scheduler.h"
#include "serve/scheduling/worker_pool.h"

namespace shoal::serve {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
// Each connection lives on one io_context; naming its executor type spares every operation
// the type-erased any_io_executor.
using LoopExecutor = asio::io_context::executor_type;
using LoopSocket = asio::basic_stream_socket<tcp, LoopExecutor>;

// A kept-alive connection is closed after this long without a new request, as uvicorn's and
// httplib's are; a request's header must arrive within it too.
constexpr std::chrono::seconds kIdleTimeout{5};
// A body (up to --max-request-bytes) must arrive, and a response be taken, within this.
constexpr std::chrono::seconds kTransferTimeout{60};
// After answering a request whose body is left unread, the connection is read to its end for
// at most this long before it closes: closing with unread bytes would reset it and could drop
// the answer before the client read it.
constexpr std::chrono::seconds kLingerTimeout{2};
constexpr uint32_t kMaxHeaderBytes = 64 * 1024;
// Room made for one read from a socket: at least enough for a simple header and a small body,
// so that such a request comes whole in one read and is taken without Beast (Beast's own
// read_size starts at 512 bytes and, the buffer being emptied by every request, stays there:
// the mlp's 854-byte request always went to Beast); at most what Beast's reads take.
constexpr size_t kMinReadSize = 2 * 1024;
constexpr size_t kMaxReadSize = 64 * 1024;

// How often each loop looks for connections past their deadline: a deadline is kept to within
// this much.
constexpr std::chrono::seconds kSweepInterval{1};

// What every connection shares.
struct ServerState {
  const InferenceRoutes* routes = nullptr;
  size_t max_body_bytes = 0;
  std::string auth_token;
  std::atomic<bool> stopping{false};
  const std::atomic<bool>* draining = nullptr;  // HttpServerOptions::draining

  bool Draining() const { return draining != nullptr && draining->load(); }
  // Requests read and not yet answered; Stop() waits for them.
  std::mutex mu;
  std::condition_variable idle;
  int64_t unanswered = 0;

  // Counts a request in, unless the server is stopping: then it is not answered at all.
  bool Take() {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return false;
    ++unanswered;
    return true;
  }
  void Answered() {
    std::lock_guard<std::mutex> lock(mu);
    if (--unanswered == 0) idle.notify_all();
  }
};

class Connection;

// The connections of one event loop and the loop's coarse clock, which ticks once a sweep: each
// connection's deadline is a tick, and a sweep closes those past theirs. Beast's basic_stream
// arms a timer per read and write instead, which cost more than a tenth of a small request's
// handling (identity model, 128 connections: ~15 % more requests/s without it). Used from its
// loop's thread only.
class LoopDeadlines {
 public:
  static constexpr uint64_t kNever = UINT64_MAX;

  explicit LoopDeadlines(asio::io_context& loop) { timer_.emplace(loop); }

  uint64_t DeadlineAfter(std::chrono::seconds timeout) const {
    // +1: the tick in progress may be almost over, and a deadline is never early.
    return tick_ + static_cast<uint64_t>((timeout + kSweepInterval - std::chrono::seconds(1)) /
                                         kSweepInterval) + 1;
  }
  void Add(Connection* connection) { live_.insert(connection); }
  void Remove(Connection* connection) { live_.erase(connection); }

  void StartSweeping() {
    timer_->expires_after(kSweepInterval);
    timer_->async_wait([this](beast::error_code ec) {
      if (ec) return;
      ++tick_;
      Sweep();
      StartSweeping();
    });
  }
  // Before the loop goes: a timer must not outlive its io_context, while the deadlines must
  // (connections still in the loop's queue leave them when it is destroyed).
  void StopSweeping() { timer_.reset(); }

 private:
  void Sweep();

  std::optional<asio::steady_timer> timer_;
  uint64_t tick_ = 0;
  std::unordered_set<Connection*> live_;
};

// One client connection, served by one event loop: read a request, hand it to the routes,
// write the reply when it comes (on this loop), read the next.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(LoopSocket socket, ServerState* state, LoopDeadlines* deadlines)
      : stream_(std::move(socket)), state_(state), deadlines_(deadlines) {
    deadlines_->Add(this);
  }
  ~Connection() { deadlines_->Remove(this); }

  void Start() { ReadHeader(); }

  uint64_t deadline() const { return deadline_; }

  // Past its deadline: the pending read or write ends with operation_aborted, and with it the
  // connection.
  void Expire() {
    deadline_ = LoopDeadlines::kNever;
    Close();
  }

 private:
  void ExpiresAfter(std::chrono::seconds timeout) {
    deadline_ = deadlines_->DeadlineAfter(timeout);
  }

  // The next request: taken straight from the bytes read when it is in the common form and
  // whole (ParseSimpleRequestHead), else parsed by Beast.
  void ReadHeader() {
    if (state_->stopping) return Close();
    parser_.reset();
    request_.Clear();
    ExpiresAfter(kIdleTimeout);
    // The next request may have come with the last one.
    if (buffer_.size() > 0) return OnBytes();
    size_t room = std::clamp(buffer_.capacity() - buffer_.size(), kMinReadSize, kMaxReadSize);
    stream_.async_read_some(buffer_.prepare(room),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              // The client closed or reset, or the idle deadline passed.
                              if (ec) return self->Close();
                              self->buffer_.commit(n);
                              self->OnBytes();
                            });
  }

  void OnBytes() {
    if (TakeSimpleRequest()) return;
    parser_.emplace(&request_);
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(state_->max_body_bytes);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  // A request whose header is in the common form and whose body has been read with it is
  // taken from the buffer without Beast; the rest, and every error, is left to Beast.
  bool TakeSimpleRequest() {
    std::string_view bytes(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    std::optional<SimpleRequestHead> head = ParseSimpleRequestHead(bytes);
    if (!head || head->content_length > state_->max_body_bytes ||
        bytes.size() - head->header_size < head->content_length) {
      return false;
    }
    request_.method.assign(head->method);
    request_.target.assign(head->target);
    if (head->authorization) request_.authorization.emplace(*head->authorization);
    if (head->inference_header_content_length) {
      request_.inference_header_content_length.emplace(*head->inference_header_content_length);
    }
    request_.body.assign(bytes.substr(head->header_size, head->content_length));
    keep_alive_ = head->keep_alive;
    buffer_.consume(head->header_size + head->content_length);
    // The body is read, so a refused request leaves the connection fit for the next one.
    if (!RefusedUnauthorized(/*body_unread=*/false)) Dispatch();
    return true;
  }

  // Answers 401 when the server has a token and the request does not carry it.
  bool RefusedUnauthorized(bool body_unread) {
    if (state_->auth_token.empty() ||
        BearerTokenMatches(request_.authorization.value_or(""), state_->auth_token)) {
      return false;
    }
    HttpReply reply = InferenceRoutes::Error(
        401, "this server needs its token: send the header Authorization: Bearer <token>");
    reply.headers.emplace_back("WWW-Authenticate", "Bearer");
    // A body left unread means the connection cannot carry another request.
    WriteReply(std::move(reply), /*counted=*/false, /*close=*/body_unread);
    return true;
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    if (RefusedUnauthorized(/*body_unread=*/!parser_->is_done())) return;
    if (!parser_->is_done() &&
        absl::EqualsIgnoreCase(request_.expect.value_or(""), "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      ExpiresAfter(kTransferTimeout);
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    ExpiresAfter(kTransferTimeout);
    // A small request's body comes with its header, in the bytes already read: parsed here,
    // it needs no second read operation, whose completion without I/O Beast would post to the
    // loop's queue (a queue round trip per request).
    if (!parser_->is_done() && buffer_.size() > 0) {
      beast::error_code ec;
      buffer_.consume(parser_->put(buffer_.data(), ec));
      if (ec && ec != http::error::need_more) return OnReadError(ec);
    }
    if (parser_->is_done()) return OnRequest({});
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRequest(ec);
                     });
  }

  void OnReadError(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return WriteReply(
          InferenceRoutes::Error(
              413, absl::StrCat("request body larger than the server's limit of ",
                                state_->max_body_bytes, " bytes (--max-request-bytes)")),
          false, true);
    }
    if (ec == http::error::header_limit) {
      return WriteReply(InferenceRoutes::Error(
                            431, absl::StrCat("request header larger than the server's limit of ",
                                              kMaxHeaderBytes, " bytes")),
                        false, true);
    }
    // operation_aborted: the connection was closed past its deadline (idle keep-alive, or a
    // request that stalled), so there is no answering it.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) {
      return Close();  // the client closed, between requests or inside one
    }
    if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
      // The bytes are not an HTTP/1.1 request.
      return WriteReply(
          InferenceRoutes::Error(400, absl::StrCat("malformed HTTP request: ", ec.message())),
          false, true);
    }
    Close();  // reset, aborted, ...: the client is gone
  }

  void OnRequest(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    keep_alive_ = parser_->keep_alive();
    parser_.reset();
    Dispatch();
  }

  // Hands the request read into request_ to the routes.
  void Dispatch() {
    // routed_ is reused from request to request, and its body swapped with the reader's, so
    // that their strings keep their room: a small request allocates none of them.
    HttpRequest& request = routed_;
    request.method.assign(request_.method);
    std::string_view target = request_.target;
    std::string_view path = target.substr(0, target.find('?'));
    if (path.find('%') == std::string_view::npos) {
      request.path.assign(path);
    } else {
      request.path = common::PercentDecoded(path);
    }
    request.body.swap(request_.body);
    request.inference_header_content_length = std::move(request_.inference_header_content_length);
    if (!state_->Take()) return Close();
    // However long the model takes, the client is waiting for it, not stalled.
    deadline_ = LoopDeadlines::kNever;
    // The connection keeps itself alive until the reply comes, so that the reply callback
    // holds a plain pointer, which std::function stores without allocating.
    awaiting_reply_ = shared_from_this();
    state_->routes->Handle(request, [this](std::function<HttpReply()> make_reply) {
      // On this loop's thread the reply is written at once; from another thread it is queued
      // to the loop.
      asio::dispatch(stream_.get_executor(), [self = std::move(awaiting_reply_),
                                              make_reply = std::move(make_reply)]() mutable {
        self->WriteReply(make_reply(), /*counted=*/true, /*close=*/false);
      });
    });
  }

  // The status line and header are formatted here and sent with the body in one gather
  // write: Beast's generic serializer cost more than the rest of a small request's handling.
  void WriteReply(HttpReply reply, bool counted, bool close) {
    close = close || !keep_alive_ || state_->stopping || state_->Draining();
    head_.clear();
    beast::string_view reason =
        http::obsolete_reason(http::int_to_status(static_cast<unsigned>(reply.status)));
    absl::StrAppend(&head_, "HTTP/1.1 ", reply.status, " ");
    head_.append(reason.data(), reason.size());
    head_ += "\r\nContent-Type: ";
    head_ += reply.content_type;
    absl::StrAppend(&head_, "\r\nContent-Length: ", reply.body.size(), "\r\n");
    for (const auto& [name, value] : reply.headers) {
      absl::StrAppend(&head_, name, ": ", value, "\r\n");
    }
    if (close) head_ += "Connection: close\r\n";
    head_ += "\r\n";
    body_ = std::move(reply.body);
    std::array<asio::const_buffer, 2> buffers{asio::buffer(head_), asio::buffer(body_)};
    ExpiresAfter(kTransferTimeout);
    asio::async_write(stream_, buffers,
                      [self = shared_from_this(), counted, close](beast::error_code ec, size_t) {
                        if (counted) self->state_->Answered();
                        if (ec) return self->Close();
                        if (close) return self->Linger();
                        self->ReadHeader();
                      });
  }

  // Sends FIN, then reads and drops what the client still sends until it closes too.
  void Linger() {
    beast::error_code ignored;
    stream_.shutdown(tcp::socket::shutdown_send, ignored);
    ExpiresAfter(kLingerTimeout);
    DrainUntilClosed();
  }

  void DrainUntilClosed() {
    if (!drain_) drain_ = std::make_unique<std::array<char, 4096>>();
    stream_.async_read_some(asio::buffer(*drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Close();
                              self->DrainUntilClosed();
                            });
  }

  void Close() {
    beast::error_code ignored;
    stream_.close(ignored);
  }

  LoopSocket stream_;
  ServerState* state_;
  LoopDeadlines* deadlines_;
  uint64_t deadline_ = LoopDeadlines::kNever;
  beast::flat_buffer buffer_;
  RequestHead request_;  // before parser_, which writes into it
  std::optional<RequestReader> parser_;
  HttpRequest routed_;  // the request handed to the routes
  // This connection, from a request's hand-off to the routes until its reply is written.
  std::shared_ptr<Connection> awaiting_reply_;
  std::string head_;  // the reply being written: its status line and header,
  std::string body_;  // and its body
  bool keep_alive_ = true;
  std::unique_ptr<std::array<char, 4096>> drain_;
};

void LoopDeadlines::Sweep() {
  // Expire() only closes the socket: the handlers it ends run later, so nothing leaves live_
  // during the walk.
  for (Connection* connection : live_) {
    if (connection->deadline() <= tick_) connection->Expire();
  }
}

}  // namespace

struct InferenceHttpServer::Impl {
  using WorkGuard = asio::executor_work_guard<asio::io_context::executor_type>;

  explicit Impl(const HttpServerOptions& options, ModelManager* models)
      : blocking(std::max(1, options.blocking_threads)),
        routes({options.server_version, options.backend_description, options.draining},
               models, &blocking) {
    state.draining = options.draining;
    state.routes = &routes;
    state.max_body_bytes = options.max_body_bytes;
    state.auth_token = options.auth_token;
    int count = std::max(1, options.threads);
    for (int i = 0; i < count; ++i) {
      loops.push_back(std::make_unique<asio::io_context>(1));
      guards.emplace_back(loops.back()->get_executor());
      deadlines.push_back(std::make_unique<LoopDeadlines>(*loops.back()));
    }
    acceptor.emplace(*loops.front());
  }

  // Runs after Stop() has joined the loops' threads (or before they ever started).
  ~Impl() {
    for (auto& loop_deadlines : deadlines) loop_deadlines->StopSweeping();
  }

  void Accept() {
    size_t index = next_loop++ % loops.size();
    asio::io_context& loop = *loops[index];
    LoopDeadlines* loop_deadlines = deadlines[index].get();
    acceptor->async_accept(loop, [this, &loop, loop_deadlines](beast::error_code ec,
                                                               LoopSocket socket) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
      if (!ec) {
        beast::error_code ignored;
        // A reply's header and body go out in one gather write; no delayed-ACK wait either way.
        socket.set_option(tcp::no_delay(true), ignored);
        // Made on its loop's thread, which alone touches the loop's deadlines.
        asio::post(loop, [this_loop = loop_deadlines, socket = std::move(socket),
                          state = &state]() mutable {
          std::make_shared<Connection>(std::move(socket), state, this_loop)->Start();
        });
      }
      // EMFILE and friends: keep accepting; the next connection may be served.
      Accept();
    });
  }

  WorkerPool blocking;
  InferenceRoutes routes;
  ServerState state;
  // Declared after what their handlers use, so destroyed (with any pending handler) first.
  // Each loop's deadlines outlive the loop (a connection destroyed with a pending handler
  // leaves them), and their timers are cancelled with it.
  std::vector<std::unique_ptr<LoopDeadlines>> deadlines;
  std::vector<std::unique_ptr<asio::io_context>> loops;
  std::vector<WorkGuard> guards;
  std::optional<tcp::acceptor> acceptor;
  size_t next_loop = 0;
  std::vector<std::thread> threads;
  std::once_flag stopped;
};

absl::StatusOr<std::unique_ptr<InferenceHttpServer>> InferenceHttpServer::Start(
    const HttpServerOptions& options, ModelManager* models) {
  std::unique_ptr<InferenceHttpServer> http(new InferenceHttpServer());
  http->impl_ = std::make_unique<Impl>(options, models);
  Impl& impl = *http->impl_;

  auto cannot_listen = [&](const beast::error_code& ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port, " (", ec.message(),
                     ": address in use, or not an address of this machine)"));
  };
  beast::error_code ec;
  tcp::resolver resolver(*impl.loops.front());
  auto endpoints = resolver.resolve(options.host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) return cannot_listen(ec);
  tcp::endpoint endpoint = endpoints.begin()->endpoint();
  tcp::acceptor& acceptor = *impl.acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return cannot_listen(ec);
  http->port_ = acceptor.local_endpoint().port();

  impl.Accept();
  for (auto& loop_deadlines : impl.deadlines) {
    asio::post(*impl.loops[&loop_deadlines - impl.deadlines.data()],
               [d = loop_deadlines.get()] { d->StartSweeping(); });
  }
  for (auto& loop : impl.loops) {
    impl.threads.emplace_back([loop = loop.get()] {
      // A loop never preempts a model instance that is running a batch: a waking SCHED_BATCH
      // thread waits for the CPU instead of taking it at once. Under load a request arrives
      // every few microseconds, and a loop woken by each one switched the model's core away
      // from it many times per batch (LSTM at 128 connections: ~20 % more throughput and a
      // lower p99 without those switches; docs/design/0005-serving.md). When the core is idle
      // the loop runs at once all the same. Unprivileged; on failure the default stays.
      sched_param batch{};
      ::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &batch);
      // The requests one round of the loop reads are queued without waking their models; one
      // posted flush wakes them after the round, so they can run as one batch.
      DeferredWakes::Install([loop] { asio::post(*loop, [] { DeferredWakes::Flush(); }); });
      // The replies of the requests this loop submits come back to it, a batch's at a time,
      // and are written from its thread (completion_home.h).
      CompletionHome::Install(
          [loop] { asio::post(*loop, [] { CompletionHome::DrainThisThread(); }); });
      loop->run();
      CompletionHome::Uninstall();
      DeferredWakes::Uninstall();
    });
  }
  return http;
}

void InferenceHttpServer::Stop() {
  if (!impl_) return;
  std::call_once(impl_->stopped, [impl = impl_.get()] {
    {
      std::lock_guard<std::mutex> lock(impl->state.mu);
      impl->state.stopping = true;
    }
    asio::post(*impl->loops.front(), [impl] {
      beast::error_code ignored;
      impl->acceptor->close(ignored);
    });
    {
      // Every request taken is answered: a model runs every request it queued.
      std::unique_lock<std::mutex> lock(impl->state.mu);
      impl->state.idle.wait(lock, [impl] { return impl->state.unanswered == 0; });
    }
    for (auto& loop : impl->loops) loop->stop();
    for (std::thread& thread : impl->threads) thread.join();
    impl->blocking.Stop();
  });
}

InferenceHttpServer::~InferenceHttpServer() { Stop(); }

}  // namespace shoal::serve
