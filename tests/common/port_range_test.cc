#include "common/port_range.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

TEST(PortRangeTest, ParsesLowDashHigh) {
  auto r = ParsePortRange("20000-20999");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->low, 20000u);
  EXPECT_EQ(r->high, 20999u);
  r = ParsePortRange(" 1024 - 1024 ");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->low, 1024u);
  EXPECT_EQ(r->high, 1024u);
  r = ParsePortRange("65000-65535");
  ASSERT_TRUE(r.ok()) << r.status();
}

TEST(PortRangeTest, RefusesWhatIsNotARangeOfUnprivilegedPorts) {
  for (const char* text : {"", "abc", "20000", "20000-", "-20000", "20000-20999-21000",
                           "20000:20999", "-5-10", "2e4-3e4"}) {
    auto r = ParsePortRange(text);
    EXPECT_FALSE(r.ok()) << "'" << text << "' was accepted";
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("LOW-HIGH"), std::string::npos) << r.status();
    }
  }
  auto privileged = ParsePortRange("80-8080");
  ASSERT_FALSE(privileged.ok());
  EXPECT_NE(privileged.status().message().find("1024 to 65535"), std::string::npos);
  EXPECT_FALSE(ParsePortRange("60000-70000").ok());
  auto empty = ParsePortRange("30000-20000");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("is empty"), std::string::npos);
}

}  // namespace
}  // namespace shoal
