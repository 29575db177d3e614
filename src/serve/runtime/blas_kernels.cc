#include "serve/runtime/blas_kernels.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace shoal::serve {

constexpr char kCoreTypeVariable[] = "OPENBLAS_CORETYPE";

CpuFeatures DetectCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu.intel = __builtin_cpu_is("intel");
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

std::optional<std::string> ChooseOpenBlasKernels() {
  if (const char* set = std::getenv(kCoreTypeVariable); set != nullptr && *set != '\0') {
    return std::nullopt;
  }
  std::optional<std::string_view> core = OpenBlasCoreFor(DetectCpuFeatures());
  if (!core) return std::nullopt;
  std::string value(*core);
  // Overwrite: an empty value is there, and OpenBLAS would read it (it then picks by itself).
  if (setenv(kCoreTypeVariable, value.c_str(), /*overwrite=*/1) != 0) return std::nullopt;
  return absl::StrCat("OpenBLAS kernels: ", value, ", chosen from this CPU's features (set ",
                      kCoreTypeVariable, " to choose others)");
}

}  // namespace shoal::serve
