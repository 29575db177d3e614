#include "serve/runtime/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <ostream>
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

CpuFeatures Amd() {
  CpuFeatures cpu;
  cpu.amd = true;
  return cpu;
}

TEST(AtenCapabilityForTest, AnAmdCpuWithAvx512GetsTheAvx512Kernels) {
  CpuFeatures zen4 = Amd();
  zen4.avx = zen4.avx2 = zen4.fma = zen4.avx512 = true;
  EXPECT_EQ(AtenCapabilityFor(zen4), "avx512");
}

TEST(AtenCapabilityForTest, LeavesLibtorchsDefaultWithoutAvx512AndOnIntel) {
  CpuFeatures zen3 = Amd();
  zen3.avx = zen3.avx2 = zen3.fma = true;
  EXPECT_EQ(AtenCapabilityFor(zen3), std::nullopt);

  CpuFeatures no_fma = Amd();
  no_fma.avx = no_fma.avx2 = no_fma.avx512 = true;
  EXPECT_EQ(AtenCapabilityFor(no_fma), std::nullopt);

  // Intel's AVX-512 lowers the clock on some models: libtorch's AVX2 default stays.
  CpuFeatures xeon = Intel();
  xeon.avx = xeon.avx2 = xeon.fma = xeon.avx512 = true;
  EXPECT_EQ(AtenCapabilityFor(xeon), std::nullopt);
}

// Restores an environment variable as the test found it.
class SavedVariable {
 public:
  explicit SavedVariable(const char* name) : name_(name) {
    if (const char* value = std::getenv(name)) saved_ = value;
  }
  ~SavedVariable() {
    if (saved_) {
      setenv(name_, saved_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};


// One of the two choices: the variable it sets, the name in its log line, what this CPU should
// get, the call that makes it, and a value a caller might have set.
struct KernelChoice {
  const char* variable;
  const char* library;
  std::optional<std::string_view> (*expected_for)(const CpuFeatures&);
  std::optional<std::string> (*choose)();
  const char* callers_value;
};

std::ostream& operator<<(std::ostream& out, const KernelChoice& choice) {
  return out << choice.variable;
}

class ChooseKernelsTest : public testing::TestWithParam<KernelChoice> {
 protected:
  // What the choice should leave in the environment and say, with its variable unset or empty
  // before it.
  void ExpectTheCpusChoiceIsSetAndSaid() {
    const KernelChoice& choice = GetParam();
    std::optional<std::string_view> expected = choice.expected_for(DetectCpuFeatures());
    std::optional<std::string> line = choice.choose();
    const char* value = std::getenv(choice.variable);
    if (!expected) {
      EXPECT_EQ(line, std::nullopt);
      EXPECT_TRUE(value == nullptr || *value == '\0') << value;
      return;
    }
    ASSERT_NE(value, nullptr);
    EXPECT_EQ(std::string(value), *expected);
    ASSERT_TRUE(line.has_value());
    EXPECT_EQ(*line, std::string(choice.library) + " kernels: " + std::string(*expected) +
                         ", chosen from this CPU's features (set " + choice.variable +
                         " to choose others)");
  }

  SavedVariable restore_{GetParam().variable};
};

TEST_P(ChooseKernelsTest, NeverOverridesTheCallersChoice) {
  setenv(GetParam().variable, GetParam().callers_value, 1);
  EXPECT_EQ(GetParam().choose(), std::nullopt);
  EXPECT_STREQ(std::getenv(GetParam().variable), GetParam().callers_value);
}

TEST_P(ChooseKernelsTest, SetsWhatThisCpuSupportsAndSaysSo) {
  unsetenv(GetParam().variable);
  ExpectTheCpusChoiceIsSetAndSaid();
}

// Both libraries read an empty value too (and then pick by themselves; libtorch warns that it
// is invalid), so an empty one is replaced, not left beside a log line that names other kernels.
TEST_P(ChooseKernelsTest, ReplacesAnEmptyValue) {
  setenv(GetParam().variable, "", 1);
  ExpectTheCpusChoiceIsSetAndSaid();
}

INSTANTIATE_TEST_SUITE_P(
    OpenBlasAndAten, ChooseKernelsTest,
    testing::Values(KernelChoice{"OPENBLAS_CORETYPE", "OpenBLAS", &OpenBlasCoreFor,
                                 &ChooseOpenBlasKernels, "Prescott"},
                    KernelChoice{"ATEN_CPU_CAPABILITY", "ATen", &AtenCapabilityFor,
                                 &ChooseAtenKernels, "default"}),
    [](const testing::TestParamInfo<KernelChoice>& info) {
      return std::string(info.param.library);
    });

TEST(DetectCpuFeaturesTest, AgreesWithTheKernelsListOfThisCpusFeatures) {
  // /proc/cpuinfo's flags are the kernel's reading of CPUID; the vendor decides both choices.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::string vendor;
  std::string flags;
  while (std::getline(cpuinfo, line) && (vendor.empty() || flags.empty())) {
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 1);
    if (line.rfind("flags", 0) == 0) flags = line.substr(line.find(':') + 1) + " ";
  }
  ASSERT_FALSE(vendor.empty()) << "no vendor_id in /proc/cpuinfo";
  auto has = [&](const std::string& flag) {
    return flags.find(" " + flag + " ") != std::string::npos;
  };
  CpuFeatures cpu = DetectCpuFeatures();
  EXPECT_EQ(cpu.intel, vendor.find("GenuineIntel") != std::string::npos);
  EXPECT_EQ(cpu.amd, vendor.find("AuthenticAMD") != std::string::npos);
  EXPECT_EQ(cpu.avx2, has("avx2"));
  EXPECT_EQ(cpu.fma, has("fma"));
  EXPECT_EQ(cpu.avx512, has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq"));
}

}  // namespace
}  // namespace shoal::serve
