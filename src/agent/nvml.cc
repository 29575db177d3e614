#include "agent/nvml.h"

#include <dlfcn.h>

#include <type_traits>

#include "spdlog/spdlog.h"

namespace shoal::agent {

namespace {

// NVML's C ABI (nvml.h, stable since the _v2 entry points): opaque device handles, results as
// an int enum where 0 is NVML_SUCCESS, and two plain structs.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of time a kernel ran over the last sample period
  unsigned int memory;  // percent of time memory was read or written
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace

struct Nvml::Api {
  NvmlReturn (*init)() = nullptr;                                             // nvmlInit_v2
  NvmlReturn (*shutdown)() = nullptr;                                         // nvmlShutdown
  NvmlReturn (*handle_by_index)(unsigned int, NvmlDevice*) = nullptr;  // ..._v2
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Load(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    spdlog::debug("no GPU samples: {}", ::dlerror());
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  bool found = true;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
    found = found && fn != nullptr;
  };
  bind(api->init, "nvmlInit_v2");
  bind(api->shutdown, "nvmlShutdown");
  bind(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(api->utilization, "nvmlDeviceGetUtilizationRates");
  bind(api->memory, "nvmlDeviceGetMemoryInfo");
  if (!found) {
    spdlog::debug("no GPU samples: {} lacks an NVML function the agent uses", library);
    ::dlclose(handle);
    return nullptr;
  }
  if (NvmlReturn r = api->init(); r != kNvmlSuccess) {
    spdlog::debug("no GPU samples: nvmlInit_v2 returned {}", r);
    ::dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(handle_);
}

std::optional<Nvml::GpuUsage> Nvml::Sample(uint32_t index) {
  NvmlDevice device = nullptr;
  if (api_->handle_by_index(index, &device) != kNvmlSuccess) return std::nullopt;
  NvmlUtilization utilization{};
  NvmlMemory memory{};
  if (api_->utilization(device, &utilization) != kNvmlSuccess) return std::nullopt;
  if (api_->memory(device, &memory) != kNvmlSuccess) return std::nullopt;
  return GpuUsage{utilization.gpu, memory.used};
}

}  // namespace shoal::agent
