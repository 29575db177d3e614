#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::machine {

// What one machine offers to jobs.
struct MachineInventory {
  std::string hostname;
  double cpus = 0;
  std::vector<uint32_t> cores;  // ids of the cores in the affinity mask, for pinning
  uint64_t memory_bytes = 0;
  std::vector<std::string> gpus;  // ids for CUDA_VISIBLE_DEVICES
};

}  // namespace shoal::machine
