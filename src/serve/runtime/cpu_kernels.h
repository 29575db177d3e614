#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shoal::serve {

// Which kernels libtorch's CPU code runs is decided twice when the TorchScript runtime loads:
// OpenBLAS picks its matrix-product kernels, and ATen picks the instruction set of its own
// vectorised kernels (element-wise ops such as an LSTM's sigmoid and tanh). Both read an
// environment variable, once, so `shoal serve` sets them before it loads the runtime.

// What the CPU offers that decides those kernels.
struct CpuFeatures {
  bool intel = false;
  bool amd = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512 = false;  // F, BW, VL and DQ: what OpenBLAS's SkylakeX and ATen's AVX512 need
};

// This CPU's, from CPUID (and the OS's support for the AVX-512 registers).
CpuFeatures DetectCpuFeatures();

// The OpenBLAS core (an OPENBLAS_CORETYPE value) to run on an Intel CPU with these features, or
// nullopt to leave the choice to OpenBLAS. Debian 12's OpenBLAS 0.3.21 picks its kernels from a
// table of Intel model numbers; a model newer than the table (such as the family 6 model 207 Xeons
// of these machines) gets the Prescott kernels, SSE3 only, and the LSTM benchmark ran 2.4x slower
// on them. The features decide the same kernels the table gives the models it knows: for FP32
// SGEMM, Cooper Lake's and Sapphire Rapids' are Skylake-X's. AMD CPUs are chosen by family, which
// 0.3.21 handles, so they are left alone.
std::optional<std::string_view> OpenBlasCoreFor(const CpuFeatures& cpu);

// The ATen CPU capability (an ATEN_CPU_CAPABILITY value) to run on a CPU with these features, or
// nullopt to leave libtorch's default. libtorch 1.13 runs its AVX2 kernels even where AVX-512
// is there, because AVX-512 lowered the clock of Intel's Cascade Lake and made some models
// slower. AMD's Zen 4 and later run AVX-512 at full clock, and there the AVX-512 kernels ran
// the LSTM classifier's bare loop in 14 % less time a row (its tanh and sigmoid cheaper).
// So: "avx512" on an AMD CPU with AVX-512 (F, BW, VL, DQ) and FMA; Intel CPUs keep libtorch's
// choice.
std::optional<std::string_view> AtenCapabilityFor(const CpuFeatures& cpu);

// Set OPENBLAS_CORETYPE to OpenBlasCoreFor(DetectCpuFeatures()), and ATEN_CPU_CAPABILITY to
// AtenCapabilityFor(...), unless the caller's environment already has a value for it (an empty
// one counts as none: both libraries would read it and then pick by themselves). They are read
// once, when the TorchScript runtime module is loaded (OpenBLAS) or runs its first kernel
// (ATen), so these must run before LoadTorchBackend, and before any thread starts (setenv).
// Each returns a line for the log when it set its variable.
std::optional<std::string> ChooseOpenBlasKernels();
std::optional<std::string> ChooseAtenKernels();

}  // namespace shoal::serve
