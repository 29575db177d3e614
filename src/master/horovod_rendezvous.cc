#include "master/horovod_rendezvous.h"

#include <httplib.h>

#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace shoal::master {

struct HorovodRendezvous::Impl {
  httplib::Server server;
  std::thread thread;
  std::mutex mu;
  std::map<std::string, std::map<std::string, std::string>> scopes;  // scope -> key -> value
};

absl::StatusOr<std::unique_ptr<HorovodRendezvous>> HorovodRendezvous::Start(
    const std::string& host) {
  std::unique_ptr<HorovodRendezvous> rdzv(new HorovodRendezvous());
  rdzv->impl_ = std::make_unique<Impl>();
  Impl* impl = rdzv->impl_.get();
  // Exactly /<scope>/<key>: Horovod's server refuses anything else, and so do we (400).
  const char* kPath = R"(/([^/]+)/([^/]+))";
  impl->server.Get(kPath, [impl](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(impl->mu);
    auto scope = impl->scopes.find(req.matches[1]);
    if (scope == impl->scopes.end() || !scope->second.count(req.matches[2])) {
      res.status = 404;  // at once: ranks poll, a GET never waits
      return;
    }
    res.status = 200;
    res.set_content(scope->second.at(req.matches[2]), "application/octet-stream");
  });
  impl->server.Put(kPath, [impl](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->scopes[req.matches[1]][req.matches[2]] = req.body;
    res.status = 200;
  });
  // A rank deletes its key once the scope's rendezvous is complete: only garbage collection.
  impl->server.Delete(kPath, [impl](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(impl->mu);
    auto scope = impl->scopes.find(req.matches[1]);
    if (scope != impl->scopes.end()) {
      scope->second.erase(req.matches[2]);
      if (scope->second.empty()) impl->scopes.erase(scope);
    }
    res.status = 200;
  });
  // Horovod's client sends one request per connection and reads bodies by Content-Length,
  // which cpp-httplib always sets.
  impl->server.set_keep_alive_max_count(1);
  int port = impl->server.bind_to_any_port(host);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for Horovod's rendezvous on ", host));
  }
  rdzv->host_ = host;
  rdzv->port_ = static_cast<uint16_t>(port);
  impl->thread = std::thread([impl] { impl->server.listen_after_bind(); });
  // bind_to_any_port already listens: a rank that connects before the thread runs just waits.
  return rdzv;
}

HorovodRendezvous::~HorovodRendezvous() {
  if (impl_) {
    impl_->server.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  }
}

}  // namespace shoal::master
