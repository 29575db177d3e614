#include "common/percent_decoding.h"

#include "gtest/gtest.h"

namespace shoal::common {
namespace {

TEST(PercentDecodedTest, DecodesEscapesOfEitherCase) {
  EXPECT_EQ(PercentDecoded("/v2/models/a%20b/infer"), "/v2/models/a b/infer");
  EXPECT_EQ(PercentDecoded("%41%62%2f%2F"), "Ab//");
  EXPECT_EQ(PercentDecoded("%00x"), std::string("\0x", 2));
  EXPECT_EQ(PercentDecoded("end%7e"), "end~");
}

TEST(PercentDecodedTest, LeavesWhatIsNotAnEscapeAlone) {
  EXPECT_EQ(PercentDecoded(""), "");
  EXPECT_EQ(PercentDecoded("plain/path"), "plain/path");
  EXPECT_EQ(PercentDecoded("a+b"), "a+b");
  EXPECT_EQ(PercentDecoded("100%"), "100%");
  EXPECT_EQ(PercentDecoded("%4"), "%4");
  EXPECT_EQ(PercentDecoded("%g1%1g"), "%g1%1g");
  EXPECT_EQ(PercentDecoded("%%41"), "%A");
}

}  // namespace
}  // namespace shoal::common
