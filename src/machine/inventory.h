#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "machine/machine_inventory.h"

namespace shoal::process {
class ProcessLauncher;
}  // namespace shoal::process

namespace shoal::machine {

struct InventoryOptions {
  // When set, these GPUs are declared instead of discovered, so that machines without GPUs can
  // test assignment. From `--fake-gpus N` or SHOAL_FAKE_GPUS.
  std::optional<uint32_t> fake_gpus;

  // Prefix put before /proc and /sys paths, so that tests can point detection at a fake tree.
  // Default: "" (the real ones).
  std::string root_dir;

  // Program queried for GPUs as `<nvidia_smi> --query-gpu=index --format=csv,noheader`. A name
  // without '/' is looked up on PATH. Default: "nvidia-smi".
  std::string nvidia_smi = "nvidia-smi";

  // Runs nvidia-smi. Null: process::SystemLauncher(). Tests give a FakeProcessLauncher.
  process::ProcessLauncher* launcher = nullptr;
};

// Reads the hostname, CPUs (the size of the process's affinity mask), memory (MemTotal, lowered
// to the process's cgroup v1 memory.limit_in_bytes or v2 memory.max when one is smaller) and
// GPUs (`fake_gpus`, else the indices nvidia-smi lists). Never fails: whatever cannot be read
// counts as absent, so a machine without nvidia-smi, or where it errors, has no GPUs. May block
// for up to 10 seconds on a wedged GPU driver.
MachineInventory DetectLocalInventory(const InventoryOptions& options);

}  // namespace shoal::machine
