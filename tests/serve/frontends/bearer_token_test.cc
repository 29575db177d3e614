#include "serve/frontends/bearer_token.h"

#include <gtest/gtest.h>

namespace shoal::serve {
namespace {

TEST(BearerTokenTest, MatchesOnlyTheExactBearerHeader) {
  EXPECT_TRUE(BearerTokenMatches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cretX", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3creT", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Basic s3cret", "s3cret"));
}

}  // namespace
}  // namespace shoal::serve
