// The agent's end of the SDK protocol (src/agent/sdk_server.h, docs/sdk-protocol.md): a real
// SdkServer on an abstract Unix socket, and each input sent to it as a task would, over one
// connection that then closes its sending side. The server must answer or drop every line and
// close the connection; a relayed request (lease, done, resumed) is answered at once, as the
// master would.
//
// The tasks it knows: worker-0 attempt 1 and worker-1 attempt 3, so that both the current and
// the stale-attempt paths run.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "agent/sdk_server.h"

namespace {

shoal::agent::SdkServer* server = nullptr;

shoal::agent::SdkServer* Server() {
  if (server != nullptr) return server;
  shoal::agent::SdkServerCallbacks callbacks;
  // On the server's own thread; Reply only queues.
  callbacks.on_request = [](uint64_t request_id, const std::string&, uint32_t,
                            const std::string&) {
    if (request_id != 0) server->Reply(request_id, R"({"ok": true})");
  };
  auto created = shoal::agent::SdkServer::Create(
      "@shoal-fuzz-sdk-" + std::to_string(::getpid()), std::move(callbacks));
  if (!created.ok()) {
    std::fprintf(stderr, "fuzz_sdk_protocol: %s\n", created.status().ToString().c_str());
    std::abort();
  }
  server = created->release();  // lives until the process ends
  server->TaskLaunched("worker-0", 1, std::chrono::milliseconds(0));
  server->TaskLaunched("worker-1", 3, std::chrono::milliseconds(0));
  return server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& address = Server()->address();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) std::abort();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, address.data(), address.size());
  addr.sun_path[0] = '\0';  // "@name": the abstract namespace
  socklen_t len = offsetof(sockaddr_un, sun_path) + address.size();
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) std::abort();
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed (a line over its limit)
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // The server closes its end once it has handled every line: the input is done then.
  char reply[4096];
  while (::read(fd, reply, sizeof(reply)) > 0) {
  }
  ::close(fd);
  return 0;
}
