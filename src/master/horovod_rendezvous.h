#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::master {

// The key-value store Horovod's gloo ranks rendezvous through, which `horovodrun --gloo`
// otherwise serves: HTTP PUT/GET/DELETE of opaque values at /<scope>/<key>. In static mode the
// ranks learn their placement from the environment (framework: horovod) and use the store only
// to swap their gloo addresses, so nothing is stored before they start.
// docs/design/horovod-gloo-rendezvous-notes.md has the protocol with references.
class HorovodRendezvous {
 public:
  // Listens on `host` (an IPv4 address) on a free port; serves until destroyed.
  static absl::StatusOr<std::unique_ptr<HorovodRendezvous>> Start(const std::string& host);
  ~HorovodRendezvous();

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

 private:
  struct Impl;
  HorovodRendezvous() = default;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  uint16_t port_ = 0;
};

}  // namespace shoal::master
