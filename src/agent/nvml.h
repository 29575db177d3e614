#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace shoal::agent {

// NVIDIA's management library, loaded at run time: the agent has no link-time dependency on it
// and runs unchanged on machines without a GPU driver. Only the few calls the resource sampler
// needs, declared with NVML's documented C signatures (nvml.h is not needed to build).
//
// Thread-compatible: one sampler thread uses it.
class Nvml {
 public:
  static constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

  struct GpuUsage {
    uint32_t util_percent = 0;  // of the last sample period, as the driver reports it
    uint64_t memory_bytes = 0;  // device memory in use (all processes on the device)
  };

  // Opens `library` and initialises NVML. Null when the library is absent or NVML does not
  // initialise (no driver, no device): the caller samples no GPU then; one debug line says why.
  static std::unique_ptr<Nvml> Load(const std::string& library = kDefaultLibrary);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The device with NVML index `index`; nullopt when NVML cannot tell (no such device, lost).
  std::optional<GpuUsage> Sample(uint32_t index);

 private:
  struct Api;
  Nvml(void* handle, std::unique_ptr<Api> api);

  void* handle_;  // from dlopen
  std::unique_ptr<Api> api_;
};

}  // namespace shoal::agent
