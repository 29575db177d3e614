#include "serve/runtime/blas_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace shoal::serve {
namespace {

CpuFeatures Intel() {
  CpuFeatures cpu;
  cpu.intel = true;
  return cpu;
}

TEST(OpenBlasCoreForTest, AnIntelCpuGetsTheWidestKernelsItsFeaturesRun) {
  CpuFeatures avx512 = Intel();
  avx512.avx = avx512.avx2 = avx512.fma = avx512.avx512 = true;
  EXPECT_EQ(OpenBlasCoreFor(avx512), "SkylakeX");

  CpuFeatures avx2 = avx512;
  avx2.avx512 = false;
  EXPECT_EQ(OpenBlasCoreFor(avx2), "Haswell");

  CpuFeatures avx_only = avx2;
  avx_only.avx2 = avx_only.fma = false;
  EXPECT_EQ(OpenBlasCoreFor(avx_only), "Sandybridge");
}

TEST(OpenBlasCoreForTest, AvxTwoWithoutFmaIsNotEnoughForHaswellKernels) {
  CpuFeatures cpu = Intel();
  cpu.avx = cpu.avx2 = true;
  EXPECT_EQ(OpenBlasCoreFor(cpu), "Sandybridge");
}

TEST(OpenBlasCoreForTest, LeavesOpenBlasToChooseOnAmdAndOnOldIntelCpus) {
  CpuFeatures amd;
  amd.avx = amd.avx2 = amd.fma = amd.avx512 = true;
  EXPECT_EQ(OpenBlasCoreFor(amd), std::nullopt);
  EXPECT_EQ(OpenBlasCoreFor(Intel()), std::nullopt);
}

// Restores OPENBLAS_CORETYPE as the test found it.
class CoreTypeVariable {
 public:
  CoreTypeVariable() {
    if (const char* value = std::getenv("OPENBLAS_CORETYPE")) saved_ = value;
  }
  ~CoreTypeVariable() {
    if (saved_) {
      setenv("OPENBLAS_CORETYPE", saved_->c_str(), 1);
    } else {
      unsetenv("OPENBLAS_CORETYPE");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(ChooseOpenBlasKernelsTest, NeverOverridesTheCallersChoice) {
  CoreTypeVariable restore;
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  EXPECT_EQ(ChooseOpenBlasKernels(), std::nullopt);
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Prescott");
}

// What ChooseOpenBlasKernels should leave in the environment and say, with OPENBLAS_CORETYPE
// unset or empty before it.
void ExpectTheCpusChoiceIsSetAndSaid() {
  std::optional<std::string_view> expected = OpenBlasCoreFor(DetectCpuFeatures());
  std::optional<std::string> line = ChooseOpenBlasKernels();
  const char* value = std::getenv("OPENBLAS_CORETYPE");
  if (!expected) {
    EXPECT_EQ(line, std::nullopt);
    EXPECT_TRUE(value == nullptr || *value == '\0') << value;
    return;
  }
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(std::string(value), *expected);
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find(std::string(*expected)), std::string::npos) << *line;
  EXPECT_NE(line->find("OPENBLAS_CORETYPE"), std::string::npos) << *line;
}

TEST(ChooseOpenBlasKernelsTest, SetsWhatThisCpuSupportsAndSaysSo) {
  CoreTypeVariable restore;
  unsetenv("OPENBLAS_CORETYPE");
  ExpectTheCpusChoiceIsSetAndSaid();
}

// OpenBLAS reads an empty OPENBLAS_CORETYPE too (and then picks by itself), so an empty one is
// replaced, not left beside a log line that names other kernels.
TEST(ChooseOpenBlasKernelsTest, ReplacesAnEmptyValue) {
  CoreTypeVariable restore;
  setenv("OPENBLAS_CORETYPE", "", 1);
  ExpectTheCpusChoiceIsSetAndSaid();
}

}  // namespace
}  // namespace shoal::serve
