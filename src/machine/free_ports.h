#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/port_range.h"

namespace shoal::machine {

using shoal::PortRange;

// The kernel's ephemeral range (net.ipv4.ip_local_port_range): where a bind to port 0 and the
// source port of every outgoing connection come from. Linux's default when it cannot be read.
PortRange EphemeralPortRange(const std::string& proc_file = "/proc/sys/net/ipv4/ip_local_port_range");

// Where the ports for a job's tasks are taken from: the 10,000 ports just below the ephemeral
// range. A port found free inside that range and handed to a task (MASTER_PORT, TF_CONFIG)
// stays unbound until the task binds it, and meanwhile any port-0 bind on the machine (a
// TensorBoard beside the job, another job's rendezvous) or outgoing connection could be given
// the very same port; below the range the kernel never hands it out by itself.
// SHOAL_TASK_PORTS (docs/configuration.md) replaces it, e.g. for a firewall's open range.
PortRange TaskPortRange(const PortRange& ephemeral);

// `count` distinct ports that nothing on this machine is bound to now (IPv4, any address),
// tried from a random point of `range` onwards so that agents starting together rarely pick
// the same; when too few are free in it, the rest are ports the kernel picks. Another process
// could still bind one before the task does; a task that cannot bind reports it like any
// other failure.
// `spares`: up to that many more, from `range` only, after the `count`: two agents on one
// machine (YARN's or Slurm's places sharing a host) probe independently and may both find the
// same port free; the master hands each task a port no other task on that address holds, and
// takes a spare where the agents' first picks collide (AssignTaskPorts).
std::vector<uint32_t> FindFreePorts(uint32_t count, const PortRange& range, uint32_t spares = 0);

}  // namespace shoal::machine
