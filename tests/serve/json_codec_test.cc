#include "serve/json_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
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

// The binary tensor extension: JSON, then the bytes of the inputs with binary_data_size.
struct BinaryBody {
  std::string body;
  std::string json_size;
};

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

BinaryBody WithBinary(const std::string& json, const std::string& binary) {
  return {json + binary, std::to_string(json.size())};
}

std::string BinaryDecodeError(const BinaryBody& request) {
  absl::StatusOr<InferRequest> decoded = DecodeInferRequest(request.body, request.json_size);
  EXPECT_FALSE(decoded.ok()) << "accepted: " << request.body;
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(decoded.status().message());
}

TEST(JsonCodecTest, DecodesBinaryInputsFromAfterTheJsonInOrder) {
  BinaryBody request = WithBinary(
      R"({"inputs": [
        {"name": "a", "shape": [2, 2], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
        {"name": "j", "shape": [2], "datatype": "INT64", "data": [7, -8]},
        {"name": "b", "shape": [3], "datatype": "INT8", "parameters": {"binary_data_size": 3}},
        {"name": "c", "shape": [2], "datatype": "BOOL", "parameters": {"binary_data_size": 2}}]})",
      Bytes<float>({1.5f, -2.0f, 3.25f, 1e-30f}) + Bytes<int8_t>({-128, 0, 127}) +
          Bytes<uint8_t>({1, 0}));
  absl::StatusOr<InferRequest> decoded = DecodeInferRequest(request.body, request.json_size);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->inputs.size(), 4u);
  EXPECT_EQ(Values<float>(decoded->inputs[0]), (std::vector<float>{1.5f, -2.0f, 3.25f, 1e-30f}));
  EXPECT_EQ(decoded->inputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<int64_t>(decoded->inputs[1]), (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(Values<int8_t>(decoded->inputs[2]), (std::vector<int8_t>{-128, 0, 127}));
  EXPECT_EQ(Values<uint8_t>(decoded->inputs[3]), (std::vector<uint8_t>{1, 0}));
}

TEST(JsonCodecTest, AHeaderCoveringTheWholeBodyIsPlainJson) {
  std::string json = R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [2]}]})";
  absl::StatusOr<InferRequest> decoded = DecodeInferRequest(json, std::to_string(json.size()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(Values<float>(decoded->inputs[0]), (std::vector<float>{2}));
}

TEST(JsonCodecTest, ABinaryInputOfAFourMebibyteTensorRoundTrips) {
  std::vector<float> values(1 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  BinaryBody request = WithBinary(
      R"({"inputs": [{"name": "x", "shape": [1024, 1024], "datatype": "FP32",
                      "parameters": {"binary_data_size": 4194304}}]})",
      Bytes(values));
  absl::StatusOr<InferRequest> decoded = DecodeInferRequest(request.body, request.json_size);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(Values<float>(decoded->inputs[0]), values);
}

constexpr char kBinaryX[] =
    R"({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                    "parameters": {"binary_data_size": 24}}]})";

TEST(JsonCodecTest, RefusesAJsonLengthHeaderThatIsNotANumberOrLargerThanTheBody) {
  EXPECT_EQ(BinaryDecodeError({"{}", "12abc"}),
            "the header Inference-Header-Content-Length must be the length in bytes of the JSON "
            "at the start of the body, an integer; got '12abc'");
  EXPECT_EQ(BinaryDecodeError({"{}", "-1"}),
            "the header Inference-Header-Content-Length must be the length in bytes of the JSON "
            "at the start of the body, an integer; got '-1'");
  EXPECT_EQ(BinaryDecodeError({"{}", ""}),
            "the header Inference-Header-Content-Length must be the length in bytes of the JSON "
            "at the start of the body, an integer; got ''");
  std::string body = std::string(kBinaryX) + std::string(24, '\0');
  EXPECT_EQ(BinaryDecodeError({body, std::to_string(body.size() + 1)}),
            absl::StrCat("the header Inference-Header-Content-Length says the JSON is ",
                         body.size() + 1, " bytes, but the body has only ", body.size()));
}

TEST(JsonCodecTest, RefusesBinarySizesThatDoNotAddUp) {
  // The header cuts the JSON short.
  std::string body = std::string(kBinaryX) + std::string(24, '\0');
  EXPECT_THAT(BinaryDecodeError({body, "10"}), HasSubstr("malformed JSON: "));
  // Fewer bytes than declared.
  EXPECT_EQ(BinaryDecodeError(WithBinary(kBinaryX, std::string(20, '\0'))),
            absl::StrCat("inputs[0] (x): binary_data_size 24 runs past the end of the body: 20 "
                         "bytes of binary data are left after the JSON (",
                         std::string(kBinaryX).size(), " bytes) and the inputs before this one"));
  // More bytes than declared.
  EXPECT_EQ(BinaryDecodeError(WithBinary(kBinaryX, std::string(30, '\0'))),
            absl::StrCat("the body has 30 bytes after the JSON (", std::string(kBinaryX).size(),
                         " bytes, Inference-Header-Content-Length), but the inputs' "
                         "binary_data_size add up to 24"));
  // Bytes after a JSON that asks for none.
  EXPECT_THAT(BinaryDecodeError(WithBinary(
                  R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})",
                  "xyz")),
              HasSubstr("the body has 3 bytes after the JSON"));
  // A second input running past the end.
  EXPECT_THAT(
      BinaryDecodeError(WithBinary(
          R"({"inputs": [
            {"name": "a", "shape": [1], "datatype": "INT32", "parameters": {"binary_data_size": 4}},
            {"name": "b", "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}}]})",
          std::string(8, '\0'))),
      HasSubstr("inputs[1] (b): binary_data_size 8 runs past the end of the body: 4 bytes"));
}

TEST(JsonCodecTest, RefusesABinarySizeThatIsNotTheShapeTimesTheDatatype) {
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                "parameters": {"binary_data_size": 12}}]})",
                std::string(12, '\0'))),
            "inputs[0] (x): binary_data_size is 12, but shape [2,3] of FP32 is 24 bytes");
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [3], "datatype": "INT16",
                                "parameters": {"binary_data_size": 5}}]})",
                std::string(5, '\0'))),
            "inputs[0] (x): binary_data_size is 5, but shape [3] of INT16 is 6 bytes");
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [4611686018427387904, 4], "datatype": "FP64",
                                "parameters": {"binary_data_size": 8}}]})",
                std::string(8, '\0'))),
            "inputs[0] (x): shape [4611686018427387904,4] is too large");
}

TEST(JsonCodecTest, RefusesMalformedBinaryInputs) {
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                "parameters": {"binary_data_size": -4}}]})",
                "")),
            "inputs[0] (x): parameters.binary_data_size must be an integer >= 0 (the tensor's "
            "size in bytes), got -4");
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                "parameters": {"binary_data_size": "4"}}]})",
                "abcd")),
            "inputs[0] (x): parameters.binary_data_size must be an integer >= 0 (the tensor's "
            "size in bytes), got \"4\"");
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                                "parameters": {"binary_data_size": 4}}]})",
                "abcd")),
            "inputs[0] (x): has both 'data' and parameters.binary_data_size; send the tensor "
            "one way");
  EXPECT_EQ(BinaryDecodeError(WithBinary(
                R"({"inputs": [{"name": "x", "shape": [3], "datatype": "BOOL",
                                "parameters": {"binary_data_size": 3}}]})",
                std::string("\x01\x00\x07", 3))),
            "inputs[0] (x): BOOL element 2 is the byte 7; BOOL elements are one byte, 0 (false) "
            "or 1 (true)");
  // Without the header there is no binary data: the whole body is JSON.
  EXPECT_EQ(DecodeError(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                        "parameters": {"binary_data_size": 4}}]})"),
            "inputs[0] (x): binary_data_size needs the header Inference-Header-Content-Length "
            "(the length of the JSON, which the binary data follows)");
}

TEST(JsonCodecTest, ReadsWhichOutputsAreWantedBinary) {
  constexpr char kInput[] = R"("inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}])";
  absl::StatusOr<InferRequest> decoded = DecodeInferRequest(absl::StrCat(
      "{", kInput, R"(, "outputs": [{"name": "y", "parameters": {"binary_data": true}},
                                    {"name": "z"}, {"name": "w", "parameters": {"binary_data": false}}]})"));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->binary_outputs.IsBinary("y"));
  EXPECT_FALSE(decoded->binary_outputs.IsBinary("z"));
  EXPECT_FALSE(decoded->binary_outputs.IsBinary("w"));
  decoded = DecodeInferRequest(absl::StrCat(
      "{", kInput, R"(, "parameters": {"binary_data_output": true},
                       "outputs": [{"name": "y"}, {"name": "w", "parameters": {"binary_data": false}}]})"));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->binary_outputs.IsBinary("y"));
  EXPECT_TRUE(decoded->binary_outputs.IsBinary("unlisted"));
  EXPECT_FALSE(decoded->binary_outputs.IsBinary("w"));
  decoded = DecodeInferRequest(absl::StrCat("{", kInput, "}"));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->binary_outputs.Any());

  EXPECT_EQ(DecodeError(absl::StrCat("{", kInput, R"(, "parameters": {"binary_data_output": 1}})")),
            "parameters.binary_data_output must be true or false, got 1");
  EXPECT_EQ(DecodeError(absl::StrCat(
                "{", kInput, R"(, "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]})")),
            "outputs[0] (y): parameters.binary_data must be true or false, got \"yes\"");
}

TEST(JsonCodecTest, EncodesBinaryOutputsAfterTheJson) {
  std::vector<Tensor> outputs = {MakeTensor<float>("y", DataType::kFp32, {2}, {0.5f, -1.0f}),
                                 MakeTensor<int64_t>("n", DataType::kInt64, {1}, {42}),
                                 MakeTensor<uint8_t>("b", DataType::kBool, {3}, {1, 0, 1})};
  BinaryOutputs binary;
  binary.per_output = {{"y", true}, {"b", true}};
  EncodedInferResponse response = EncodeInferResponse("m", 2, "", outputs, binary);
  ASSERT_TRUE(response.json_size.has_value());
  std::string json = response.body.substr(0, *response.json_size);
  EXPECT_EQ(json,
            R"({"model_name":"m","model_version":"2","outputs":[)"
            R"({"name":"y","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}},)"
            R"({"name":"n","datatype":"INT64","shape":[1],"data":[42]},)"
            R"({"name":"b","datatype":"BOOL","shape":[3],"parameters":{"binary_data_size":3}}]})");
  EXPECT_EQ(response.body.substr(*response.json_size),
            Bytes<float>({0.5f, -1.0f}) + std::string("\x01\x00\x01", 3));

  // Nothing binary: plain JSON, no header.
  EncodedInferResponse plain = EncodeInferResponse("m", 2, "", outputs, BinaryOutputs{});
  EXPECT_FALSE(plain.json_size.has_value());
  EXPECT_EQ(plain.body, EncodeInferResponse("m", 2, "", outputs));
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
