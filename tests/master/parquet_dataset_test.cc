#include "master/parquet_dataset.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::master {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The smallest file the listing takes for Parquet: the magic at both ends.
constexpr char kParquetBytes[] = "PAR1\x00\x00\x00\x00PAR1";

class ParquetDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("parquet-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    std::filesystem::path path = dir_ / name;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
    return path.string();
  }
  std::string Parquet(const std::string& name) {
    return Write(name, std::string(kParquetBytes, sizeof(kParquetBytes) - 1));
  }

  std::filesystem::path dir_;
};

TEST_F(ParquetDatasetTest, ListsSparksPartFilesInNameOrderLeavingOutItsOtherFiles) {
  std::string d = (dir_ / "digits.parquet").string();
  Parquet("digits.parquet/part-00002-abc.c000.snappy.parquet");
  Parquet("digits.parquet/part-00000-abc.c000.snappy.parquet");
  Parquet("digits.parquet/part-00001-abc.c000.snappy.parquet");
  Write("digits.parquet/_SUCCESS", "");
  Write("digits.parquet/._SUCCESS.crc", "crc");
  Write("digits.parquet/.part-00000-abc.c000.snappy.parquet.crc", "crc");
  Write("digits.parquet/_metadata", "not data");
  Write("digits.parquet/part-00000.crc", "crc");
  auto files = ListParquetDataset(d, "");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(d + "/part-00000-abc.c000.snappy.parquet",
                                  d + "/part-00001-abc.c000.snappy.parquet",
                                  d + "/part-00002-abc.c000.snappy.parquet"));
  // Stable: the same list on every call (a recovering master never lists, but tests may).
  EXPECT_EQ(*ListParquetDataset(d, ""), *files);
}

TEST_F(ParquetDatasetTest, ASingleFileIsItsOwnDataset) {
  std::string f = Parquet("one.parquet");
  auto files = ListParquetDataset(f, "");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(f));
}

TEST_F(ParquetDatasetTest, RefusesAMissingPath) {
  auto files = ListParquetDataset((dir_ / "nowhere").string(), "");
  EXPECT_TRUE(absl::IsNotFound(files.status())) << files.status();
  EXPECT_EQ(files.status().message(), (dir_ / "nowhere").string() + " does not exist");
}

TEST_F(ParquetDatasetTest, RefusesADirectoryWithoutParquetFiles) {
  Write("empty/_SUCCESS", "");
  Write("empty/.part-00000.parquet.crc", "crc");
  auto files = ListParquetDataset((dir_ / "empty").string(), "");
  EXPECT_TRUE(absl::IsFailedPrecondition(files.status())) << files.status();
  EXPECT_EQ(files.status().message(),
            (dir_ / "empty").string() +
                " holds no Parquet files (hidden and _-prefixed files such as _SUCCESS are not "
                "data)");
}

TEST_F(ParquetDatasetTest, RefusesFilesThatAreNotParquet) {
  Parquet("mixed/part-00000.parquet");
  std::string csv = Write("mixed/part-00001.csv", "id\n1\n");
  auto files = ListParquetDataset((dir_ / "mixed").string(), "");
  EXPECT_TRUE(absl::IsFailedPrecondition(files.status())) << files.status();
  EXPECT_EQ(files.status().message(),
            csv +
                " is not a Parquet file (a Parquet file begins and ends with PAR1; this one "
                "has 5 bytes)");
  // The magic at one end only, and the magic alone, are not Parquet either.
  for (const std::string& bytes : {std::string("PAR1 truncated"), std::string("PAR1PAR1")}) {
    std::string f = Write("half.parquet", bytes);
    EXPECT_THAT(ListParquetDataset(f, "").status().message(), HasSubstr("is not a Parquet file"))
        << bytes;
  }
}

TEST_F(ParquetDatasetTest, RefusesPartitionedDatasets) {
  Parquet("partitioned/label=3/part-00000.parquet");
  auto files = ListParquetDataset((dir_ / "partitioned").string(), "");
  EXPECT_TRUE(absl::IsFailedPrecondition(files.status())) << files.status();
  EXPECT_THAT(files.status().message(),
              HasSubstr("holds the directory label=3: partitioned Parquet datasets (partitionBy) "
                        "are not read"));
}

TEST_F(ParquetDatasetTest, RefusesHdfsUrisWithoutAPathAndUnansweredNameNodes) {
  EXPECT_TRUE(absl::IsInvalidArgument(ListParquetDataset("hdfs://nn", "").status()));
  // Nothing listens on port 1: Unavailable, naming the address.
  auto files = ListParquetDataset("hdfs://127.0.0.1:8020/data/d", "http://127.0.0.1:1");
  EXPECT_TRUE(absl::IsUnavailable(files.status())) << files.status();
}

}  // namespace
}  // namespace shoal::master
