#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace shoal::common {

// The IPv4 address this machine uses to reach `host` (`service` is its port, only to resolve
// it): the address a master started here should give peers on that host's network.
// `what` names the peer in errors ("the Slurm controller", "the ResourceManager").
absl::StatusOr<std::string> LocalAddressTowards(const std::string& host, const std::string& service,
                                                const std::string& what);

// Whether `host` names this machine's loopback: 127.0.0.0/8, ::1 (bracketed or not), localhost.
// Servers that listen anywhere else must authenticate their callers.
bool IsLoopbackHost(const std::string& host);

}  // namespace shoal::common
