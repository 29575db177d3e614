#include "machine/free_ports.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

namespace shoal::machine {
namespace {

// A listener on `port` (0: any), or -1; *bound gets its port.
int Listen(uint32_t port, uint32_t* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 1) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *bound = ntohs(addr.sin_port);
  return fd;
}

TEST(FreePortsTest, TaskPortsComeFromBelowTheKernelsEphemeralRange) {
  PortRange ephemeral = EphemeralPortRange();
  PortRange tasks = TaskPortRange(ephemeral);
  ASSERT_NE(tasks.low, 0u);
  EXPECT_TRUE(tasks.high < ephemeral.low || tasks.low > ephemeral.high);
  auto ports = FindFreePorts(16, tasks);
  ASSERT_EQ(ports.size(), 16u);
  EXPECT_EQ(std::set<uint32_t>(ports.begin(), ports.end()).size(), 16u) << "a port repeats";
  for (uint32_t p : ports) {
    EXPECT_TRUE(p >= tasks.low && p <= tasks.high) << p;
    // Free indeed: a task can listen on it.
    uint32_t bound = 0;
    int fd = Listen(p, &bound);
    EXPECT_GE(fd, 0) << "port " << p << " was handed out but cannot be bound";
    if (fd >= 0) ::close(fd);
  }
}

TEST(FreePortsTest, ABoundPortIsSkippedAndPastTheRangeTheKernelPicks) {
  // A three-port range whose first port is taken: the other two, then one of the kernel's.
  uint32_t taken = 0;
  int fd = -1;
  for (uint32_t p = 29000; p < 29900 && fd < 0; p += 7) {
    uint32_t a = 0, b = 0;
    int f1 = Listen(p + 1, &a), f2 = Listen(p + 2, &b);
    if (f1 >= 0) ::close(f1);
    if (f2 >= 0) ::close(f2);
    if (f1 >= 0 && f2 >= 0) fd = Listen(p, &taken);
  }
  ASSERT_GE(fd, 0) << "no three free ports in a row to test with";
  PortRange ephemeral = EphemeralPortRange();
  for (int round = 0; round < 5; ++round) {  // every random starting point
    auto ports = FindFreePorts(3, {taken, taken + 2});
    ASSERT_EQ(ports.size(), 3u);
    EXPECT_EQ(std::set<uint32_t>(ports.begin(), ports.begin() + 2),
              (std::set<uint32_t>{taken + 1, taken + 2}));
    EXPECT_TRUE(ports[2] >= ephemeral.low && ports[2] <= ephemeral.high) << ports[2];
  }
  // Spares come from the range only: one port asked with five spares gives the range's two
  // free ones; three asked with two spares, the range's two and one of the kernel's.
  for (int round = 0; round < 5; ++round) {
    auto ports = FindFreePorts(1, {taken, taken + 2}, 5);
    EXPECT_EQ(std::set<uint32_t>(ports.begin(), ports.end()),
              (std::set<uint32_t>{taken + 1, taken + 2}));
    ports = FindFreePorts(3, {taken, taken + 2}, 2);
    ASSERT_EQ(ports.size(), 3u);
    EXPECT_EQ(std::set<uint32_t>(ports.begin(), ports.begin() + 2),
              (std::set<uint32_t>{taken + 1, taken + 2}));
    EXPECT_TRUE(ports[2] >= ephemeral.low && ports[2] <= ephemeral.high) << ports[2];
  }
  ::close(fd);
}

TEST(FreePortsTest, SparesFollowTheCountAndAreDistinct) {
  PortRange tasks = TaskPortRange(EphemeralPortRange());
  auto ports = FindFreePorts(4, tasks, 4);
  ASSERT_EQ(ports.size(), 8u);
  EXPECT_EQ(std::set<uint32_t>(ports.begin(), ports.end()).size(), 8u) << "a port repeats";
  for (uint32_t p : ports) EXPECT_TRUE(p >= tasks.low && p <= tasks.high) << p;
}

TEST(FreePortsTest, RangesFollowTheKernelsSetting) {
  auto dir = std::filesystem::temp_directory_path() / ("shoal-ports-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* text) {
    std::ofstream(dir / "range") << text;
    return EphemeralPortRange((dir / "range").string());
  };
  PortRange r = write("40000\t50000\n");
  EXPECT_EQ(r.low, 40000u);
  EXPECT_EQ(r.high, 50000u);
  PortRange t = TaskPortRange(r);
  EXPECT_EQ(t.low, 30000u);
  EXPECT_EQ(t.high, 39999u);
  // Unreadable or nonsense: Linux's default.
  r = write("garbage");
  EXPECT_EQ(r.low, 32768u);
  EXPECT_EQ(r.high, 60999u);
  r = EphemeralPortRange((dir / "absent").string());
  EXPECT_EQ(r.low, 32768u);
  // A range starting low leaves the ports below it, or above it, or none.
  t = TaskPortRange({5000, 60999});
  EXPECT_EQ(t.low, 1024u);
  EXPECT_EQ(t.high, 4999u);
  t = TaskPortRange({1024, 30000});
  EXPECT_EQ(t.low, 30001u);
  EXPECT_EQ(t.high, 40000u);
  t = TaskPortRange({1024, 65535});
  EXPECT_EQ(t.low, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal::machine
