#include "serve/runtime/cpu_kernels.h"

#include <cstdlib>
#include <string>


namespace shoal::serve {
namespace {

constexpr char kOpenBlasVariable[] = "OPENBLAS_CORETYPE";
constexpr char kAtenVariable[] = "ATEN_CPU_CAPABILITY";

// Sets `variable` to `value` unless the environment has a non-empty value for it already; the
// log line when it did.
std::optional<std::string> SetUnlessChosen(const char* variable, std::string_view what,
                                           std::optional<std::string_view> value) {
  if (const char* set = std::getenv(variable); set != nullptr && *set != '\0') {
    return std::nullopt;
  }
  if (!value) return std::nullopt;
  std::string text(*value);
  // Overwrite: an empty value may be there, and the library would read it.
  if (setenv(variable, text.c_str(), /*overwrite=*/1) != 0) return std::nullopt;
  return std::string(what) + " kernels: " + text + ", chosen from this CPU's features (set " +
         variable + " to choose others)";
}

}  // namespace

CpuFeatures DetectCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu.intel = __builtin_cpu_is("intel");
  cpu.amd = __builtin_cpu_is("amd");
  cpu.avx = __builtin_cpu_supports("avx");
  cpu.avx2 = __builtin_cpu_supports("avx2");
  cpu.fma = __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  return cpu;
}

std::optional<std::string_view> OpenBlasCoreFor(const CpuFeatures& cpu) {
  if (!cpu.intel) return std::nullopt;
  if (cpu.avx512 && cpu.avx2 && cpu.fma) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  if (cpu.avx) return "Sandybridge";
  return std::nullopt;
}

std::optional<std::string_view> AtenCapabilityFor(const CpuFeatures& cpu) {
  if (cpu.amd && cpu.avx512 && cpu.avx2 && cpu.fma) return "avx512";
  return std::nullopt;
}

std::optional<std::string> ChooseOpenBlasKernels() {
  return SetUnlessChosen(kOpenBlasVariable, "OpenBLAS", OpenBlasCoreFor(DetectCpuFeatures()));
}

std::optional<std::string> ChooseAtenKernels() {
  return SetUnlessChosen(kAtenVariable, "ATen", AtenCapabilityFor(DetectCpuFeatures()));
}

}  // namespace shoal::serve
