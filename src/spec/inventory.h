#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::spec {

// What one machine offers to jobs.
struct MachineInventory {
  std::string hostname;
  double cpus = 0;
  uint64_t memory_bytes = 0;
  std::vector<std::string> gpus;  // ids for CUDA_VISIBLE_DEVICES
};

struct InventoryOptions {
  // When set, these GPUs are declared instead of discovered, so that machines without GPUs can
  // test assignment. From `--fake-gpus N` or SHOAL_FAKE_GPUS.
  std::optional<uint32_t> fake_gpus;
};

// Reads CPUs (the process's affinity mask), memory (MemTotal) and GPUs (`nvidia-smi -L`).
MachineInventory DetectLocalInventory(const InventoryOptions& options);

}  // namespace shoal::spec
