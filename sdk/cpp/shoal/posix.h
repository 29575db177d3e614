#pragma once

// Small POSIX helpers every part of the SDK uses: errno as text, whole writes, sleeps that
// survive signals.

#include <errno.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace shoal::sdk {

namespace internal {

inline std::string ErrnoText(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

inline bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

inline void SleepSeconds(double seconds) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace internal

}  // namespace shoal::sdk
