#include "serve/repository/ensemble_combiner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace shoal::serve {
namespace {

using ::testing::HasSubstr;

template <typename T>
Tensor Make(DataType type, std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor t;
  t.name = "y";
  t.datatype = type;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  std::vector<T> values(t.data.size() / sizeof(T));
  std::memcpy(values.data(), t.data.data(), t.data.size());
  return values;
}

Tensor Fp32(std::vector<float> values) {
  return Make<float>(DataType::kFp32, {1, static_cast<int64_t>(values.size())}, values);
}

std::vector<float> CombineFp32(Combiner c, const std::vector<Tensor>& members) {
  std::vector<const Tensor*> parts;
  for (const Tensor& t : members) parts.push_back(&t);
  absl::StatusOr<Tensor> out = CombineOutputs(c, parts);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  EXPECT_EQ(out->datatype, DataType::kFp32);
  EXPECT_EQ(out->name, "y");
  return Values<float>(*out);
}

// Each expected value is worked out by hand in the comment next to it.
TEST(EnsembleCombinerTest, MeanIsTheElementwiseArithmeticMean) {
  EXPECT_THAT(CombineFp32(Combiner::kMean, {Fp32({1, 2, 4}), Fp32({3, 6, 8}), Fp32({2, 1, 0})}),
              ::testing::ElementsAre(2.0f,    // (1 + 3 + 2) / 3
                                     3.0f,    // (2 + 6 + 1) / 3
                                     4.0f));  // (4 + 8 + 0) / 3
}

TEST(EnsembleCombinerTest, GeometricMeanIsTheNthRootOfTheProduct) {
  std::vector<float> out =
      CombineFp32(Combiner::kGeometricMean, {Fp32({1, 2, 0.5f}), Fp32({4, 8, 0}), Fp32({2, 4, 3})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FLOAT_EQ(out[0], 2.0f);  // cbrt(1 * 4 * 2) = cbrt(8)
  EXPECT_FLOAT_EQ(out[1], 4.0f);  // cbrt(2 * 8 * 4) = cbrt(64)
  EXPECT_FLOAT_EQ(out[2], 0.0f);  // a zero makes the product zero
}

TEST(EnsembleCombinerTest, HarmonicMeanIsCountOverTheSumOfInverses) {
  std::vector<float> out =
      CombineFp32(Combiner::kHarmonicMean, {Fp32({1, 2, 5}), Fp32({4, 2, 0}), Fp32({4, 2, 1})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FLOAT_EQ(out[0], 2.0f);  // 3 / (1 + 1/4 + 1/4) = 3 / 1.5
  EXPECT_FLOAT_EQ(out[1], 2.0f);  // 3 / (3/2)
  EXPECT_FLOAT_EQ(out[2], 0.0f);  // 1/0 makes the sum infinite
}

TEST(EnsembleCombinerTest, MedianTakesTheMiddleOrTheMeanOfTheTwoMiddles) {
  EXPECT_THAT(CombineFp32(Combiner::kMedian, {Fp32({1, 9}), Fp32({5, 2}), Fp32({3, 4})}),
              ::testing::ElementsAre(3.0f, 4.0f));  // {1,3,5} -> 3; {2,4,9} -> 4
  EXPECT_THAT(CombineFp32(Combiner::kMedian, {Fp32({1}), Fp32({7}), Fp32({3}), Fp32({10})}),
              ::testing::ElementsAre(5.0f));  // {1,3,7,10} -> (3 + 7) / 2
}

TEST(EnsembleCombinerTest, Fp64StaysFp64) {
  Tensor a = Make<double>(DataType::kFp64, {2}, {1.0, 2.0});
  Tensor b = Make<double>(DataType::kFp64, {2}, {2.0, 5.0});
  absl::StatusOr<Tensor> out = CombineOutputs(Combiner::kMean, {&a, &b});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->datatype, DataType::kFp64);
  EXPECT_THAT(Values<double>(*out), ::testing::ElementsAre(1.5, 3.5));
}

TEST(EnsembleCombinerTest, VoteTakesEachRowsMostChosenArgmax) {
  // Two rows of three classes; argmax per member: row 0: 2, 2, 0; row 1: 1, 0, 1.
  Tensor a = Make<float>(DataType::kFp32, {2, 3}, {0.1f, 0.2f, 0.7f, 0.1f, 0.8f, 0.1f});
  Tensor b = Make<float>(DataType::kFp32, {2, 3}, {0.3f, 0.3f, 0.4f, 0.6f, 0.3f, 0.1f});
  Tensor c = Make<float>(DataType::kFp32, {2, 3}, {0.9f, 0.0f, 0.1f, 0.2f, 0.5f, 0.3f});
  absl::StatusOr<Tensor> out = CombineOutputs(Combiner::kVote, {&a, &b, &c});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->datatype, DataType::kInt64);
  EXPECT_EQ(out->shape, (std::vector<int64_t>{2}));
  EXPECT_THAT(Values<int64_t>(*out), ::testing::ElementsAre(2, 1));
}

TEST(EnsembleCombinerTest, AVoteTieGoesToTheSmallestClassIndex) {
  // Argmax: 2 and 1, one vote each: class 1 wins. Within a member, equal maxima pick the
  // first (member c's row [5, 5] votes 0).
  Tensor a = Make<int32_t>(DataType::kInt32, {1, 3}, {0, 1, 9});
  Tensor b = Make<int32_t>(DataType::kInt32, {1, 3}, {0, 9, 1});
  absl::StatusOr<Tensor> out = CombineOutputs(Combiner::kVote, {&a, &b});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(Values<int64_t>(*out), ::testing::ElementsAre(1));
  Tensor c = Make<int32_t>(DataType::kInt32, {2}, {5, 5});
  Tensor d = Make<int32_t>(DataType::kInt32, {2}, {5, 5});
  out = CombineOutputs(Combiner::kVote, {&c, &d});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->shape, (std::vector<int64_t>{1}));
  EXPECT_THAT(Values<int64_t>(*out), ::testing::ElementsAre(0));
}

TEST(EnsembleCombinerTest, MembersThatDisagreeInShapeOrDatatypeAreAnError) {
  Tensor a = Fp32({1, 2});
  Tensor b = Fp32({1, 2, 3});
  absl::StatusOr<Tensor> out = CombineOutputs(Combiner::kMean, {&a, &b});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "output 'y': member 2 returned FP32 [1,3], member 1 FP32 [1,2]; mean needs the same "
            "from every member");
  Tensor c = Make<double>(DataType::kFp64, {1, 2}, {1, 2});
  EXPECT_FALSE(CombineOutputs(Combiner::kMean, {&a, &c}).ok());
}

TEST(EnsembleCombinerTest, NegativeValuesHaveNoGeometricOrHarmonicMean) {
  Tensor a = Fp32({1, -2});
  Tensor b = Fp32({1, 2});
  for (Combiner c : {Combiner::kGeometricMean, Combiner::kHarmonicMean}) {
    absl::StatusOr<Tensor> out = CombineOutputs(c, {&b, &a});
    ASSERT_FALSE(out.ok());
    EXPECT_THAT(out.status().message(), HasSubstr("member 2 returned -2 at element 1"));
  }
}

TEST(EnsembleCombinerTest, MeansTakeOnlyFloatingPoint) {
  Tensor a = Make<int64_t>(DataType::kInt64, {1}, {1});
  absl::StatusOr<Tensor> out = CombineOutputs(Combiner::kMedian, {&a, &a});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "output 'y' is INT64, which median does not combine");
  EXPECT_FALSE(CombinerAccepts(Combiner::kVote, DataType::kBool));
  EXPECT_TRUE(CombinerAccepts(Combiner::kVote, DataType::kInt64));
}

TEST(EnsembleCombinerTest, NamesRoundTrip) {
  for (Combiner c : {Combiner::kMean, Combiner::kGeometricMean, Combiner::kHarmonicMean,
                     Combiner::kMedian, Combiner::kVote}) {
    EXPECT_EQ(ParseCombiner(CombinerName(c)), c);
  }
  EXPECT_FALSE(ParseCombiner("average").has_value());
  EXPECT_EQ(CombinerNames(), "mean, geometric_mean, harmonic_mean, median, vote");
}

}  // namespace
}  // namespace shoal::serve
