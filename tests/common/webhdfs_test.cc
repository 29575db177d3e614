#include "common/webhdfs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace shoal::common {
namespace {

using ::testing::HasSubstr;

TEST(HdfsLocationTest, TakesTheUriApartAndFindsWebHdfsOnTheNameNodesHost) {
  setenv("HADOOP_USER_NAME", "trainer", 1);
  absl::StatusOr<HdfsLocation> location = ParseHdfsLocation("hdfs://nn.example:8020/models/", "");
  ASSERT_TRUE(location.ok()) << location.status();
  EXPECT_EQ(location->uri, "hdfs://nn.example:8020/models");
  EXPECT_EQ(location->webhdfs, "http://nn.example:9870");
  EXPECT_EQ(location->path, "/models");
  EXPECT_EQ(location->user, "trainer");
  location = ParseHdfsLocation("hdfs://nn/a/b", "http://nn:50070");
  ASSERT_TRUE(location.ok()) << location.status();
  EXPECT_EQ(location->webhdfs, "http://nn:50070");
  EXPECT_EQ(location->path, "/a/b");
  unsetenv("HADOOP_USER_NAME");
}

TEST(HdfsLocationTest, RefusesAUriWithoutHostOrPathNamingTheForm) {
  for (const char* bad : {"hdfs://", "hdfs:///models", "hdfs://:8020/models", "hdfs://nn",
                          "hdfs://nn:8020/", "/local/models", "s3://bucket/models"}) {
    absl::StatusOr<HdfsLocation> location = ParseHdfsLocation(bad, "");
    ASSERT_FALSE(location.ok()) << bad;
    EXPECT_EQ(location.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(location.status().message(), HasSubstr("is not hdfs://namenode[:port]/path"))
        << bad;
  }
}

}  // namespace
}  // namespace shoal::common
