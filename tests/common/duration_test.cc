#include "common/duration.h"

#include <gtest/gtest.h>

#include <chrono>

namespace shoal {
namespace {

using std::chrono::milliseconds;

TEST(DurationTest, ParsesEachUnit) {
  EXPECT_EQ(ParseDuration("500ms"), milliseconds(500));
  EXPECT_EQ(ParseDuration("30s"), milliseconds(30'000));
  EXPECT_EQ(ParseDuration("2m"), milliseconds(120'000));
  EXPECT_EQ(ParseDuration("1h"), milliseconds(3'600'000));
}

TEST(DurationTest, ReadsBareNumbersAsSeconds) {
  EXPECT_EQ(ParseDuration("30"), milliseconds(30'000));
  EXPECT_EQ(ParseDuration("0.5"), milliseconds(500));
  EXPECT_EQ(ParseDuration("0"), milliseconds(0));
}

TEST(DurationTest, AcceptsFractionsAndRoundsToTheNearestMillisecond) {
  EXPECT_EQ(ParseDuration("1.5s"), milliseconds(1500));
  EXPECT_EQ(ParseDuration(".25s"), milliseconds(250));
  EXPECT_EQ(ParseDuration("2.s"), milliseconds(2000));
  EXPECT_EQ(ParseDuration("0.5m"), milliseconds(30'000));
  EXPECT_EQ(ParseDuration("1.4ms"), milliseconds(1));
  EXPECT_EQ(ParseDuration("1.6ms"), milliseconds(2));
  EXPECT_EQ(ParseDuration("0.0001s"), milliseconds(0));
}

TEST(DurationTest, IgnoresSurroundingWhitespace) {
  EXPECT_EQ(ParseDuration("  10s\t"), milliseconds(10'000));
}

TEST(DurationTest, RejectsNegativeAndMalformedValues) {
  for (const char* bad : {"", " ", "s", "ms", "-1s", "-5", "+5s", "1e3", "1e3s", "5 s", "5sec",
                          "5S", "5MS", "1d", "1.2.3s", "..5s", "1h30m", "abc", "inf", "nan",
                          "0x10s", "5s x"}) {
    EXPECT_EQ(ParseDuration(bad), std::nullopt) << "'" << bad << "'";
  }
}

TEST(DurationTest, RejectsValuesAboveTheMaximum) {
  EXPECT_EQ(ParseDuration("277777h"), milliseconds(277777LL * 3'600'000));
  EXPECT_EQ(ParseDuration("277778h"), std::nullopt);
  EXPECT_EQ(ParseDuration(std::string(400, '9') + "h"), std::nullopt);
}

TEST(DurationTest, FormatsWithTheLargestExactUnit) {
  EXPECT_EQ(FormatDuration(milliseconds(0)), "0s");
  EXPECT_EQ(FormatDuration(milliseconds(1500)), "1500ms");
  EXPECT_EQ(FormatDuration(milliseconds(30'000)), "30s");
  EXPECT_EQ(FormatDuration(milliseconds(90'000)), "90s");
  EXPECT_EQ(FormatDuration(milliseconds(120'000)), "2m");
  EXPECT_EQ(FormatDuration(milliseconds(7'200'000)), "2h");
}

TEST(DurationTest, FormattedValuesParseBack) {
  for (int64_t ms : {0LL, 1LL, 999LL, 1000LL, 61'000LL, 3'600'000LL, 5'400'000LL}) {
    EXPECT_EQ(ParseDuration(FormatDuration(milliseconds(ms))), milliseconds(ms)) << ms;
  }
}

}  // namespace
}  // namespace shoal
