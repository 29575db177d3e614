#include "serve/json_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "nlohmann/json.hpp"

namespace shoal::serve {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<T> Values(const Tensor& tensor) {
  std::vector<T> values(tensor.data.size() / sizeof(T));
  std::memcpy(values.data(), tensor.data.data(), tensor.data.size());
  return values;
}

template <typename T>
Tensor MakeTensor(std::string name, DataType type, std::vector<int64_t> shape,
                  const std::vector<T>& values) {
  Tensor t;
  t.name = std::move(name);
  t.datatype = type;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::string DecodeError(const std::string& body) {
  absl::StatusOr<InferRequest> request = DecodeInferRequest(body);
  EXPECT_FALSE(request.ok()) << "accepted: " << body;
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(request.status().message());
}

TEST(JsonCodecTest, DecodesFlatRowMajorData) {
  absl::StatusOr<InferRequest> request = DecodeInferRequest(R"({
    "id": "42",
    "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2.5, 3, 4, 5, 6]}],
    "outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": false}}]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->id, "42");
  ASSERT_EQ(request->inputs.size(), 1u);
  const Tensor& x = request->inputs[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.datatype, DataType::kFp32);
  EXPECT_EQ(x.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values<float>(x), (std::vector<float>{1, 2.5, 3, 4, 5, 6}));
  EXPECT_EQ(request->requested_outputs, (std::vector<std::string>{"y", "z"}));
}

TEST(JsonCodecTest, DecodesNestedDataInRowMajorOrder) {
  absl::StatusOr<InferRequest> request = DecodeInferRequest(
      R"({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT64",
                      "data": [[1, 2], [3, 4]]}]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(Values<int64_t>(request->inputs[0]), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(JsonCodecTest, DecodesEveryDatatype) {
  auto decode = [](const std::string& type, const std::string& data) {
    absl::StatusOr<InferRequest> r = DecodeInferRequest(
        R"({"inputs": [{"name": "x", "shape": [2], "datatype": ")" + type + R"(", "data": )" +
        data + "}]}");
    EXPECT_TRUE(r.ok()) << type << ": " << r.status();
    return r.ok() ? r->inputs[0] : Tensor{};
  };
  EXPECT_EQ(Values<uint8_t>(decode("BOOL", "[true, false]")), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(Values<uint8_t>(decode("UINT8", "[0, 255]")), (std::vector<uint8_t>{0, 255}));
  EXPECT_EQ(Values<int8_t>(decode("INT8", "[-128, 127]")), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(Values<int16_t>(decode("INT16", "[-32768, 32767]")),
            (std::vector<int16_t>{-32768, 32767}));
  EXPECT_EQ(Values<int32_t>(decode("INT32", "[-2147483648, 2147483647]")),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(),
                                  std::numeric_limits<int32_t>::max()}));
  EXPECT_EQ(Values<int64_t>(decode("INT64", "[-9223372036854775808, 9223372036854775807]")),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(Values<float>(decode("FP32", "[0.1, -3]")), (std::vector<float>{0.1f, -3.0f}));
  EXPECT_EQ(Values<double>(decode("FP64", "[0.1, 1e300]")), (std::vector<double>{0.1, 1e300}));
}

TEST(JsonCodecTest, AcceptsABareValueForAScalar) {
  absl::StatusOr<InferRequest> request = DecodeInferRequest(
      R"({"inputs": [{"name": "t", "shape": [], "datatype": "FP64", "data": 0.5}]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(Values<double>(request->inputs[0]), (std::vector<double>{0.5}));
}

TEST(JsonCodecTest, RefusesMalformedJsonSayingWhere) {
  EXPECT_THAT(DecodeError(R"({"inputs": [)"), HasSubstr("malformed JSON: parse error at line 1"));
  EXPECT_THAT(DecodeError("not json"), HasSubstr("malformed JSON"));
  EXPECT_EQ(DecodeError("[1, 2]"), "the request must be a JSON object with 'inputs', got a list");
}

TEST(JsonCodecTest, RefusesMissingOrMistypedFields) {
  EXPECT_EQ(DecodeError("{}"),
            "'inputs' is required: a non-empty list of {name, shape, datatype, data}");
  EXPECT_EQ(DecodeError(R"({"inputs": []})"),
            "'inputs' is required: a non-empty list of {name, shape, datatype, data}");
  EXPECT_EQ(DecodeError(R"({"id": 7, "inputs": [{}]})"), "'id' must be a string");
  EXPECT_EQ(DecodeError(R"({"inputs": [3]})"),
            "inputs[0] must be an object with name, shape, datatype and data, got an integer");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]})"),
            "inputs[0]: 'name' is required and must be a non-empty string");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "data": [1]}]})"),
            "inputs[0] (x): 'datatype' is required, one of BOOL, UINT8, INT8, INT16, INT32, "
            "INT64, FP32, FP64");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]})"),
            "inputs[0] (x): 'shape' is required, a list of integers >= 0");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]})"),
            "inputs[0] (x): 'data' is required, the tensor's elements in row-major order");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32",
                                       "data": [1]}]})"),
            "inputs[0] (x): 'shape' must be a list of integers >= 0, got [-1]");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                       "data": [1]}], "outputs": ["y"]})"),
            "outputs[0] must be an object with a string 'name'");
}

TEST(JsonCodecTest, RefusesUnsupportedDatatypes) {
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP16",
                                       "data": [1]}]})"),
            "inputs[0] (x): datatype 'FP16' is not supported; supported: BOOL, UINT8, INT8, "
            "INT16, INT32, INT64, FP32, FP64");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES",
                                       "data": ["a"]}]})"),
            "inputs[0] (x): datatype 'BYTES' is not supported; supported: BOOL, UINT8, INT8, "
            "INT16, INT32, INT64, FP32, FP64");
}

TEST(JsonCodecTest, RefusesADataCountThatIsNotTheShapes) {
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                       "data": [1, 2, 3, 4, 5]}]})"),
            "inputs[0] (x): shape [2,3] needs 6 values, data has 5");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                       "data": [1, 2, 3, 4, 5]}]})"),
            "inputs[0] (x): shape [2] needs 2 values, data has 5");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                       "data": [[[1]], 2]}]})"),
            "inputs[0] (x): data is nested deeper than the shape");
}

TEST(JsonCodecTest, RefusesValuesOfTheWrongTypeOrRange) {
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [2], "datatype": "INT8",
                                       "data": [1, 200]}]})"),
            "inputs[0] (x): data[1] is out of range for INT8: 200");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8",
                                       "data": [-1]}]})"),
            "inputs[0] (x): data[0] is out of range for UINT8: -1");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64",
                                       "data": [1.5]}]})"),
            "inputs[0] (x): data[0] is not an integer for INT64: 1.5");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                       "data": ["1"]}]})"),
            "inputs[0] (x): data[0] is not a number for FP32: \"1\"");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                       "data": [1e39]}]})"),
            "inputs[0] (x): data[0] is out of range for FP32: 1e+39");
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL",
                                       "data": [1]}]})"),
            "inputs[0] (x): data[0] is not true or false for BOOL: 1");
}

TEST(JsonCodecTest, RefusesAnInputGivenTwice) {
  EXPECT_EQ(DecodeError(R"({"inputs": [
      {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
      {"name": "x", "shape": [1], "datatype": "FP32", "data": [2]}]})"),
            "inputs[1] (x): input 'x' is given twice");
}

TEST(JsonCodecTest, RefusesTheBinaryTensorExtension) {
  EXPECT_THAT(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 4}}]})"),
              HasSubstr("the binary tensor extension (binary_data_size) is not supported yet"));
}

TEST(JsonCodecTest, EncodesOutputsThatPythonsJsonReadsBack) {
  std::vector<Tensor> outputs = {
      MakeTensor<float>("y", DataType::kFp32, {2, 2},
                        {0.1f, -2.0f, std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::infinity()}),
      MakeTensor<int8_t>("c", DataType::kInt8, {2}, {-5, 7}),
      MakeTensor<uint8_t>("b", DataType::kBool, {2}, {1, 0}),
      MakeTensor<int64_t>("i", DataType::kInt64, {1}, {std::numeric_limits<int64_t>::max()})};
  std::string body = EncodeInferResponse("mlp", 3, "req-1", outputs);
  EXPECT_EQ(body,
            R"({"model_name":"mlp","model_version":"3","id":"req-1","outputs":[)"
            R"({"name":"y","datatype":"FP32","shape":[2,2],"data":[0.1,-2,NaN,Infinity]},)"
            R"({"name":"c","datatype":"INT8","shape":[2],"data":[-5,7]},)"
            R"({"name":"b","datatype":"BOOL","shape":[2],"data":[true,false]},)"
            R"({"name":"i","datatype":"INT64","shape":[1],"data":[9223372036854775807]}]})");
}

TEST(JsonCodecTest, EncodedFloatsRoundTripExactly) {
  std::vector<float> values = {1.0f / 3, 1e-30f, 3.4028235e38f, -0.0f, 123456.789f};
  std::string body =
      EncodeInferResponse("m", 1, "", {MakeTensor<float>("y", DataType::kFp32, {5}, values)});
  nlohmann::json parsed = nlohmann::json::parse(body);
  EXPECT_FALSE(parsed.contains("id"));
  std::vector<float> back;
  for (const auto& v : parsed["outputs"][0]["data"]) back.push_back(v.get<float>());
  EXPECT_EQ(back, values);
}

TEST(JsonCodecTest, EncodesErrorsAsAnErrorObject) {
  EXPECT_EQ(EncodeError("model 'x' has no input \"q\""),
            R"({"error":"model 'x' has no input \"q\""})");
}

}  // namespace
}  // namespace shoal::serve
