#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shoal::serve {

// What the CPU offers that decides OpenBLAS's kernels.
struct CpuFeatures {
  bool intel = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512 = false;  // F, BW, VL and DQ: what OpenBLAS's SkylakeX kernels need
};

// This CPU's, from CPUID.
CpuFeatures DetectCpuFeatures();

// The OpenBLAS core (an OPENBLAS_CORETYPE value) to run on an Intel CPU with these features, or
// nullopt to leave the choice to OpenBLAS. Debian 12's OpenBLAS 0.3.21 picks its kernels from a
// table of Intel model numbers; a model newer than the table (such as the family 6 model 207 Xeons
// of these machines) gets the Prescott kernels, SSE3 only, and the LSTM benchmark ran 2.4x slower
// on them. The features decide the same kernels the table gives the models it knows: for FP32
// SGEMM, Cooper Lake's and Sapphire Rapids' are Skylake-X's. AMD CPUs are chosen by family, which
// 0.3.21 handles, so they are left alone.
std::optional<std::string_view> OpenBlasCoreFor(const CpuFeatures& cpu);

// Sets OPENBLAS_CORETYPE to OpenBlasCoreFor(DetectCpuFeatures()) unless the caller's environment
// already has a value for it (an empty one counts as none). OpenBLAS reads it once, when the
// TorchScript runtime module is loaded, so this must run before LoadTorchBackend, and before any
// thread starts (setenv). Returns a line for the log when it set the variable.
std::optional<std::string> ChooseOpenBlasKernels();

}  // namespace shoal::serve
