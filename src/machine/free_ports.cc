#include "machine/free_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

namespace shoal::machine {
namespace {

// A socket bound to `port` on every IPv4 address (0: the kernel picks), or -1. Held open by
// the caller until every port is found, so no port is handed out twice.
int BindTo(uint32_t port, uint32_t* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *bound = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

PortRange EphemeralPortRange(const std::string& proc_file) {
  std::ifstream in(proc_file);
  uint32_t low = 0, high = 0;
  if (in >> low >> high && low >= 1 && low <= high && high <= 65535) return {low, high};
  return {32768, 60999};
}

PortRange TaskPortRange(const PortRange& ephemeral) {
  constexpr uint32_t kSize = 10000;
  constexpr uint32_t kFirstUnprivileged = 1024;
  if (ephemeral.low > kFirstUnprivileged + kSize) return {ephemeral.low - kSize, ephemeral.low - 1};
  if (ephemeral.low > kFirstUnprivileged + 100) return {kFirstUnprivileged, ephemeral.low - 1};
  // The ephemeral range starts low: take the space above it instead, if there is any.
  if (ephemeral.high < 65535 - 100) {
    return {ephemeral.high + 1, std::min<uint32_t>(65535, ephemeral.high + kSize)};
  }
  return {0, 0};  // nothing outside it: the kernel picks
}

std::vector<uint32_t> FindFreePorts(uint32_t count, const PortRange& range, uint32_t spares) {
  std::vector<int> fds;
  std::vector<uint32_t> ports;
  if (range.low != 0 && range.low <= range.high) {
    uint32_t size = range.high - range.low + 1;
    std::random_device seed;
    uint32_t start = std::uniform_int_distribution<uint32_t>(0, size - 1)(seed);
    for (uint32_t i = 0; i < size && ports.size() < count + spares; ++i) {
      uint32_t port = range.low + (start + i) % size, bound = 0;
      int fd = BindTo(port, &bound);
      if (fd < 0) continue;
      fds.push_back(fd);
      ports.push_back(bound);
    }
  }
  // The range ran short: the kernel's picks make up the count, spares come from the range only.
  while (ports.size() < count) {
    uint32_t bound = 0;
    int fd = BindTo(0, &bound);
    if (fd < 0) break;
    fds.push_back(fd);
    ports.push_back(bound);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

}  // namespace shoal::machine
