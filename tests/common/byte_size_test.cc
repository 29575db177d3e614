#include "common/byte_size.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

TEST(ByteSizeTest, ParsesBinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseByteSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("4GB"), 4'000'000'000ull);
  EXPECT_EQ(*ParseByteSize("1000"), 1000ull);
  EXPECT_EQ(*ParseByteSize(" 8 kib "), 8192ull);
}

TEST(ByteSizeTest, RejectsMalformedSizesWithTheExpectedForm) {
  for (const char* bad : {"2GB?", "", "GiB", "two", "-1G", "1.2.3G", "5 parsecs"}) {
    auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("e.g. 512MiB"), std::string::npos) << bad;
  }
}

// Issue 23: "1.5B" was rounded to 2 bytes without a word.
TEST(ByteSizeTest, RejectsAFractionOfAByte) {
  for (const char* bad : {"1.5B", "0.5", "2.25b"}) {
    auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("not a whole number of bytes"), std::string::npos) << bad;
  }
  EXPECT_EQ(ParseByteSize("1.5KiB").value(), 1536u);
  EXPECT_EQ(ParseByteSize("2.0B").value(), 2u);
}

TEST(ByteSizeTest, FormatsRoundAndFractionalSizes) {
  EXPECT_EQ(FormatByteSize(2ull << 30), "2GiB");
  EXPECT_EQ(FormatByteSize(3ull << 29), "1.5GiB");
  EXPECT_EQ(FormatByteSize(100), "100B");
}

}  // namespace
}  // namespace shoal
