#include "serve/frontends/json_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "serve/frontends/ascii_infer_request.h"
#include "serve/frontends/common_infer_request.h"

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

// Issue 23, defect 8: nested data that disagrees with its shape reached the model (and failed
// there with 500) whenever its values added up to the shape's count.
TEST(JsonCodecTest, RefusesNestedDataThatDoesNotFollowTheShape) {
  auto body = [](const std::string& shape, const std::string& data) {
    return absl::StrCat(R"({"inputs": [{"name": "x", "shape": )", shape,
                        R"(, "datatype": "INT32", "data": )", data, "}]}");
  };
  const std::string how_to =
      " (nested data follows the shape; or send the [2,2] tensor's values flat, in row-major "
      "order)";
  // Rows of the wrong length, whose values add up to the shape's count.
  EXPECT_EQ(DecodeError(body("[2, 2]", "[[1, 2, 3], [4]]")),
            "inputs[0] (x): data[0] has 3 entries, but shape [2,2] needs 2 at dimension 1" +
                how_to);
  // Ragged.
  EXPECT_EQ(DecodeError(body("[2, 2]", "[[1, 2], [3]]")),
            "inputs[0] (x): data[1] has 1 entries, but shape [2,2] needs 2 at dimension 1" +
                how_to);
  // Too shallow: one row of four.
  EXPECT_EQ(DecodeError(body("[2, 2]", "[[1, 2, 3, 4]]")),
            "inputs[0] (x): data has 1 entries, but shape [2,2] needs 2 at dimension 0" + how_to);
  // Too deep.
  EXPECT_EQ(DecodeError(body("[2, 2]", "[[[1], [2]], [[3], [4]]]")),
            "inputs[0] (x): data[0][0] is a list, but shape [2,2] has 2 dimensions: data is "
            "nested deeper than the shape" +
                how_to);
  // Values and lists mixed on one level.
  EXPECT_EQ(DecodeError(body("[2, 2]", "[[1, 2], 3]")),
            "inputs[0] (x): data[1] is an integer, but shape [2,2] needs a list of 2 at "
            "dimension 1" +
                how_to);
  EXPECT_EQ(DecodeError(body("[2, 2]", "[1, 2, [3, 4]]")),
            "inputs[0] (x): data has 3 entries, but shape [2,2] needs 2 at dimension 0" + how_to);
  // Flat data of the wrong count.
  EXPECT_EQ(DecodeError(body("[2, 2]", "[1, 2, 3]")),
            "inputs[0] (x): shape [2,2] needs 4 values, data has 3");
  EXPECT_EQ(DecodeError(body("[2, 2]", "[1, 2, 3, 4, 5]")),
            "inputs[0] (x): shape [2,2] needs 4 values, data has 5");
  // Partly nested: a [1,2,2] tensor sent as two rows.
  EXPECT_THAT(DecodeError(body("[1, 2, 2]", "[[1, 2], [3, 4]]")),
              HasSubstr("data has 2 entries, but shape [1,2,2] needs 1 at dimension 0"));
  // What does follow the shape, nested or flat, still decodes.
  for (const char* data : {"[[1, 2], [3, 4]]", "[1, 2, 3, 4]"}) {
    absl::StatusOr<InferRequest> request = DecodeInferRequest(body("[2, 2]", data));
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_EQ(Values<int32_t>(request->inputs[0]), (std::vector<int32_t>{1, 2, 3, 4}));
  }
  absl::StatusOr<InferRequest> empty_rows = DecodeInferRequest(body("[2, 0]", "[[], []]"));
  EXPECT_TRUE(empty_rows.ok()) << empty_rows.status();
  EXPECT_THAT(DecodeError(body("[2, 0]", "[[], [], []]")),
              HasSubstr("data has 3 entries, but shape [2,0] needs 2 at dimension 0"));
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

TEST(JsonCodecTest, EncodesNamesThatNeedEscapingAsJsonStrings) {
  for (std::string name : {std::string("plain-name_1.v2"), std::string("say \"hi\""),
                           std::string("back\\slash"), std::string("tab\there"),
                           std::string("caf\xc3\xa9"), std::string("bad\xff")}) {
    std::string body = EncodeInferResponse(
        name, 3, name, {MakeTensor<float>(name, DataType::kFp32, {1}, {1.0f})});
    nlohmann::json parsed = nlohmann::json::parse(body);
    // Invalid UTF-8 is replaced (U+FFFD), everything else comes back as it was.
    std::string expected = name == "bad\xff" ? "bad\xef\xbf\xbd" : name;
    EXPECT_EQ(parsed["model_name"], expected) << body;
    EXPECT_EQ(parsed["id"], expected) << body;
    EXPECT_EQ(parsed["outputs"][0]["name"], expected) << body;
  }
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

// Every finite float and double written is the shortest text that reads back as the same
// value, whatever its magnitude (a random sweep of bit patterns, with the extremes), and the
// integers' extremes come out whole; thousands of values in one tensor too.
TEST(JsonCodecTest, EncodedNumbersOfEveryWidthReadBackExactly) {
  std::mt19937_64 random(27);
  std::vector<float> floats = {std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(), 123456789.0f, 1e8f, 1e-4f};
  std::vector<double> doubles = {std::numeric_limits<double>::denorm_min(),
                                 std::numeric_limits<double>::min(),
                                 std::numeric_limits<double>::max(),
                                 -std::numeric_limits<double>::min(), 1e21, 0.1};
  while (floats.size() < 5000) {
    auto bits = static_cast<uint32_t>(random());
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (std::isfinite(f)) floats.push_back(f);
  }
  while (doubles.size() < 5000) {
    uint64_t bits = random();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    if (std::isfinite(d)) doubles.push_back(d);
  }
  std::vector<int64_t> int64s = {std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max(), 0, -1};
  std::string body = EncodeInferResponse(
      "m", 1, "",
      {MakeTensor<float>("f", DataType::kFp32, {static_cast<int64_t>(floats.size())}, floats),
       MakeTensor<double>("d", DataType::kFp64, {static_cast<int64_t>(doubles.size())}, doubles),
       MakeTensor<int64_t>("i", DataType::kInt64, {4}, int64s),
       MakeTensor<int16_t>("s", DataType::kInt16, {2}, {-32768, 32767})});
  nlohmann::json parsed = nlohmann::json::parse(body);
  std::vector<float> floats_back;
  for (const auto& v : parsed["outputs"][0]["data"]) floats_back.push_back(v.get<float>());
  EXPECT_EQ(floats_back, floats);
  std::vector<double> doubles_back;
  for (const auto& v : parsed["outputs"][1]["data"]) doubles_back.push_back(v.get<double>());
  EXPECT_EQ(doubles_back, doubles);
  EXPECT_EQ(parsed["outputs"][2]["data"].get<std::vector<int64_t>>(), int64s);
  EXPECT_EQ(parsed["outputs"][3]["data"].get<std::vector<int16_t>>(),
            (std::vector<int16_t>{-32768, 32767}));
  // Shortest: a float takes at most 9 significant digits, and 0.1f is "0.1", not 0.100000001.
  EXPECT_THAT(body, testing::HasSubstr("\"data\":[1e-45,"));
  EXPECT_THAT(body, testing::Not(testing::HasSubstr("0.100000")));
}

// The reply's floating-point numbers are laid out by the codec itself from fmt's Dragonbox
// digits; they must be exactly what fmt's "{}" writes, in every notation it uses.
TEST(JsonCodecTest, EncodedFloatsAreTheTextFmtWrites) {
  std::mt19937_64 random(2027);
  std::vector<float> floats = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1e-4f, 9.999e-5f, 1e-5f,
                               1e15f, 1e16f, 9.9999e15f, 123456792.0f, 1e38f, 1.5e-45f,
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max()};
  std::vector<double> doubles = {0.0, -0.0, 1.0, 0.1, 1e-4, 9.999e-5, 1e16, 1e15, 1e100,
                                 1e-100, 5e-324, 1.7976931348623157e308, 2.5e-308,
                                 123456789012345678.0};
  while (floats.size() < 20000) {
    auto bits = static_cast<uint32_t>(random());
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (std::isfinite(f)) floats.push_back(f);
    // Values of every magnitude near 1, where most tensors are.
    floats.push_back(static_cast<float>(std::ldexp(static_cast<double>(random() % 1000000),
                                                   static_cast<int>(random() % 60) - 40)));
  }
  while (doubles.size() < 20000) {
    uint64_t bits = random();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    if (std::isfinite(d)) doubles.push_back(d);
  }
  std::string body = EncodeInferResponse(
      "m", 1, "",
      {MakeTensor<float>("f", DataType::kFp32, {static_cast<int64_t>(floats.size())}, floats),
       MakeTensor<double>("d", DataType::kFp64, {static_cast<int64_t>(doubles.size())},
                          doubles)});
  auto data_of = [&](std::string_view name) {
    size_t at = body.find("\"name\":\"" + std::string(name) + "\"");
    at = body.find("\"data\":[", at) + 8;
    return body.substr(at, body.find(']', at) - at);
  };
  EXPECT_EQ(data_of("f"), fmt::format("{}", fmt::join(floats, ",")));
  EXPECT_EQ(data_of("d"), fmt::format("{}", fmt::join(doubles, ",")));
}

TEST(JsonCodecTest, EncodesErrorsAsAnErrorObject) {
  EXPECT_EQ(EncodeError("model 'x' has no input \"q\""),
            R"({"error":"model 'x' has no input \"q\""})");
}

// The one-pass decoder of the common form (common_infer_request.h) must answer exactly as the
// general, document-building one: the same tensors where it accepts a body, and nothing (so
// that the general one words the error) where that one refuses it.
std::string Describe(const absl::StatusOr<InferRequest>& request) {
  if (!request.ok()) return absl::StrCat("error: ", request.status().message());
  std::string out = absl::StrCat("id=", request->id, " outputs=");
  for (const std::string& name : request->requested_outputs) absl::StrAppend(&out, name, ",");
  for (const Tensor& t : request->inputs) {
    absl::StrAppend(&out, " [", t.name, " ", DataTypeName(t.datatype), " ", ShapeString(t.shape),
                    " bytes=");
    for (std::byte b : t.data) absl::StrAppend(&out, std::to_integer<int>(b), ".");
    absl::StrAppend(&out, "]");
  }
  absl::StrAppend(&out, " binary_default=", request->binary_outputs.by_default,
                  " binary_outputs=", request->binary_outputs.per_output.size());
  return out;
}

// Whether the one-pass decoder took `body`; fails the test where it, or the ASCII reader it
// tries first, answered differently.
bool CommonPathAgrees(const std::string& body) {
  absl::StatusOr<InferRequest> general = DecodeInferRequestThroughDocument(body);
  std::optional<InferRequest> common = DecodeCommonInferRequest(body);
  if (common) {
    EXPECT_EQ(Describe(*common), Describe(general)) << body;
  }
  if (std::optional<InferRequest> ascii = DecodeAsciiInferRequest(body)) {
    EXPECT_EQ(Describe(*ascii), Describe(general)) << body;
  }
  EXPECT_EQ(Describe(DecodeInferRequest(body)), Describe(general)) << body;
  return common.has_value();
}

TEST(JsonCodecTest, TheCommonFormIsDecodedInOnePass) {
  const std::string bodies[] = {
      R"({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                      "data": [0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -1.25e-3]}]})",
      R"({"id": "a", "inputs": [{"datatype": "INT64", "data": [[1, 2], [3, 4]], "shape": [2, 2],
                                 "name": "tokens"}], "outputs": [{"name": "y"}, {"name": "y"}]})",
      R"({"outputs": [], "inputs": [{"name": "b", "shape": [3], "datatype": "BOOL",
                                     "data": [true, false, true]},
                                    {"name": "u", "shape": [2], "datatype": "UINT8",
                                     "data": [0, 255]}]})",
      R"({"inputs": [{"name": "e", "shape": [2, 0], "datatype": "FP64", "data": [[], []]}]})",
      R"({"inputs": [{"name": "caf\u00e9 \"x\"", "shape": [2, 3], "datatype": "FP32",
                      "data": [[-0.0, -0, 1e-45], [3.4028234e38, -1.5, 7]]}]})",
      R"({"inputs": [{"name": "i", "shape": [2], "datatype": "INT8", "data": [-128, 127]},
                     {"name": "j", "shape": [1], "datatype": "INT16", "data": [-32768]},
                     {"name": "k", "shape": [1], "datatype": "INT32", "data": [2147483647]},
                     {"name": "f", "shape": [], "datatype": "FP64", "data": [1e300]}]})",
      // Lists with the rest of the request after them: the shortcuts for plain values stop at
      // each list's last value, whatever follows it.
      R"({"inputs": [{"data": [12, -345, 6789012, 0, 99999999, -7, 5], "datatype": "INT64",
                      "name": "tokens", "shape": [7]},
                     {"data": [1, 2147483647, -2147483648, 0], "datatype": "INT32",
                      "name": "ids", "shape": [4]},
                     {"data": [0.25, -1.5, 3, 0.0078125, 2], "datatype": "FP32",
                      "name": "x", "shape": [5]}], "outputs": [{"name": "y"}]})",
  };
  for (const std::string& body : bodies) {
    EXPECT_TRUE(CommonPathAgrees(body)) << "not taken in one pass: " << body;
    // Plain ASCII (every body but the one with escapes): the ASCII reader takes it.
    if (body.find('\\') == std::string::npos) {
      EXPECT_TRUE(DecodeAsciiInferRequest(body).has_value()) << "not read as ASCII: " << body;
    }
  }
}

// The one-pass reader finds a string's end eight bytes at a time: an escape, a quote or a
// byte that is not ASCII at any place of a name of any length must be seen, and a plain name
// (DEL included, which JSON allows unescaped) read whole.
TEST(JsonCodecTest, TheOnePassReaderSeesEveryEscapeAnywhereInAName) {
  // (as written in the body, as decoded)
  const std::pair<std::string, std::string> specials[] = {
      {R"(\")", "\""}, {R"(\\)", "\\"}, {R"(\u0001)", "\x01"}, {R"(\n)", "\n"},
      {"\xC3\xA9", "\xC3\xA9"}, {"\x7F", "\x7F"}, {"~", "~"}, {" ", " "}};
  for (size_t length = 1; length <= 20; ++length) {
    for (size_t at = 0; at < length; ++at) {
      for (const auto& [written, decoded] : specials) {
        std::string name_written(length, 'a'), name(length, 'a');
        name_written.replace(at, 1, written);
        name.replace(at, 1, decoded);
        std::string body = R"({"inputs": [{"name": ")" + name_written +
                           R"(", "shape": [1], "datatype": "FP32", "data": [1]}]})";
        CommonPathAgrees(body);
        absl::StatusOr<InferRequest> request = DecodeInferRequest(body);
        ASSERT_TRUE(request.ok()) << body << ": " << request.status();
        EXPECT_EQ(request->inputs.at(0).name, name) << body;
      }
    }
  }
}

TEST(JsonCodecTest, TheOnePassDecoderLeavesEverythingElseToTheGeneralOne) {
  const std::string bodies[] = {
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": 0.5}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                      "parameters": {}}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
          "parameters": {"binary_data_output": true}})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
          "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})",
      R"({"inputs": [{"name": "x", "name": "z", "shape": [1], "datatype": "FP32",
                      "data": [1]}]})",
      R"({"id": "a", "id": "b", "inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                            "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
          "extra": null})",
      // Every error the general decoder words.
      R"({"inputs": [)", "not json", "[1, 2]", "{}", R"({"inputs": []})",
      R"({"id": 7, "inputs": [{}]})", R"({"inputs": [3]})",
      R"({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]})",
      R"({"inputs": [{"name": "", "shape": [1], "datatype": "FP32", "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [1.0], "datatype": "FP32", "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [9223372036854775808], "datatype": "FP32",
                      "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [4294967296, 4294967296], "datatype": "FP32",
                      "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP16", "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2]}]})",
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [[[1]], 2]}]})",
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [[1, 2]]}]})",
      R"({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32",
                      "data": [[1, 2, 3], [4]]}]})",
      R"({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2, 3, 4]]}]})",
      R"({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32",
                      "data": [[[1], [2]], [[3], [4]]]}]})",
      R"({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], 3, 4]}]})",
      R"({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, [3, 4]]}]})",
      R"({"inputs": [{"name": "x", "shape": [1, 2, 2], "datatype": "FP32",
                      "data": [[1, 2], [3, 4]]}]})",
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "INT8", "data": [1, 200]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8", "data": [-1]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1.5]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64",
                      "data": [9223372036854775808]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["1"]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1e39]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1e999]}]})",
      // Integers past uint64 are floats to the general decoder.
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64",
                      "data": [18446744073709551616]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64",
                      "data": [18446744073709551616]}]})",
      "\xEF\xBB\xBF" R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})",
      R"({"inputs": [{"name": "\ud800", "shape": [1], "datatype": "FP32", "data": [1]}]})",
      "{\"inputs\": [{\"name\": \"\xff\", \"shape\": [1], \"datatype\": \"FP32\", \"data\": [1]}]}",
      "   ", "",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [true]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [null]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [{}]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
                     {"name": "x", "shape": [1], "datatype": "FP32", "data": [2]}]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
          "outputs": ["y"]})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
          "outputs": {"name": "y"}})",
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]} trailing)",
  };
  for (const std::string& body : bodies) {
    EXPECT_FALSE(CommonPathAgrees(body)) << "taken in one pass: " << body;
  }
}

// Numbers written every way JSON allows, near the edges of the exact shortcuts number parsers
// take (19 digits, 2^53, 10^22) and past them: read as the general decoder reads them, bit for
// bit.
TEST(JsonCodecTest, TheOnePassDecoderReadsNumbersAsTheGeneralDecoderDoes) {
  std::mt19937_64 rng(53);
  auto number = [&]() -> std::string {
    switch (rng() % 6) {
      case 0: {  // a random double, shortest or with every digit
        uint64_t bits = rng();
        double d;
        std::memcpy(&d, &bits, sizeof(d));
        if (!std::isfinite(d)) d = 1.5;
        char text[64];
        std::snprintf(text, sizeof(text), rng() % 2 ? "%.17g" : "%.9g", d);
        return text;
      }
      case 1: {  // digits and a point somewhere, up to 24 digits
        std::string digits = std::to_string(rng() % 10 + 1);
        for (int n = static_cast<int>(rng() % 24); n > 0; --n) digits += char('0' + rng() % 10);
        size_t point = rng() % digits.size();
        return (rng() % 2 ? "-" : "") + digits.substr(0, point + 1) + "." +
               digits.substr(point + 1) + "1";
      }
      case 2:  // an exponent near the shortcut's limit
        return absl::StrCat(rng() % 9007199254740993ULL, rng() % 2 ? "e" : "E",
                            static_cast<int>(rng() % 60) - 30);
      case 3:  // 2^53 and its neighbours, with and without a fraction
        return absl::StrCat(9007199254740992ULL + rng() % 3 - 1, rng() % 2 ? ".0" : "e0");
      case 4:  // tiny and huge
        return absl::StrCat(rng() % 100, ".", rng() % 1000, "e", rng() % 2 ? "-" : "+",
                            rng() % 330);
      default:  // zeros of every sign and form
        return rng() % 2 ? "-0.0" : "0e-5";
    }
  };
  int taken = 0;
  for (int round = 0; round < 400; ++round) {
    std::string data;
    for (int i = 0; i < 10; ++i) absl::StrAppend(&data, i ? ", " : "", number());
    for (const char* type : {"FP64", "FP32"}) {
      std::string body = absl::StrCat(R"({"inputs": [{"name": "x", "shape": [10], "datatype": ")",
                                      type, R"(", "data": [)", data, "]}]}");
      if (CommonPathAgrees(body)) ++taken;
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(taken, 300);
}

// The one-pass reader takes a number's digits eight bytes at a time while eight are left in
// the body, and one at a time after that, and most values of a list of reals or integers by a
// shortcut while 40 or 16 bytes are left: runs of every length from 1 to 24 digits, before and after a
// point, ending at every distance from the body's end or far from it and followed by every
// character that can end (or wrongly continue) a number, must read as the general decoder
// reads them.
TEST(JsonCodecTest, TheOnePassReaderReadsRunsOfDigitsOfEveryLengthAnywhere) {
  std::mt19937_64 rng(8);
  auto digits = [&](int n) {
    std::string run;
    for (int i = 0; i < n; ++i) run += static_cast<char>('0' + rng() % 10);
    return run;
  };
  const std::string enders[] = {"", " ", "\n", ".5", "e3", "E-2", "/", ":", "x", "\xc3\xa9"};
  int taken = 0, checked = 0;
  for (int integer = 1; integer <= 24; ++integer) {
    for (int fraction = 0; fraction <= 24; fraction += (fraction < 10 ? 1 : 7)) {
      std::string number = digits(integer);
      if (integer > 1 && number[0] == '0') number[0] = '7';
      if (fraction > 0) number += "." + digits(fraction);
      for (const char* sign : {"", "-"}) {
        for (const std::string& ender : enders) {
          for (const char* type : {"FP32", "FP64", "INT64"}) {
            // Last in its list, so that the run ends within eight bytes of the body's end.
            std::string body = absl::StrCat(R"({"inputs": [{"name": "x", "shape": [2], "datatype": ")",
                                            type, R"(", "data": [1, )", sign, number, ender,
                                            "]}]}");
            // First, with a comma and 40 bytes after it.
            std::string far = absl::StrCat(R"({"inputs": [{"name": "x", "shape": [21], )",
                                           R"("datatype": ")", type, R"(", "data": [)", sign,
                                           number, ender,
                                           ", 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, ",
                                           "8, 9, 0]}]}");
            // Last in its list, with the rest of the input after the list.
            std::string last = absl::StrCat(R"({"inputs": [{"data": [1, )", sign, number, ender,
                                            R"(], "datatype": ")", type,
                                            R"(", "name": "x", "shape": [2]}]})");
            checked += 3;
            if (CommonPathAgrees(body)) ++taken;
            if (CommonPathAgrees(far)) ++taken;
            if (CommonPathAgrees(last)) ++taken;
          }
        }
      }
    }
    if (::testing::Test::HasFailure()) break;
  }
  // Zeros of both signs, leading zeros (JSON's error) and other edges of the shortcut, far
  // from the body's end.
  for (const char* edge : {"0", "-0", "0.0", "-0.0", "01", "-01", "00.5", "-00", "-", "-.5",
                           ".5", "1.", "+1", "9999999", "-9999999.999999999999", "99999999",
                           "1234567.1234567890123", "0.00000000000000000001", "1,,",
                           // 20 digits that wrap past 2^64 to 5, and 23 after the point.
                           "1844674.4073709551621", "0.00000000000000000000001",
                           // Integers: the widest the integer shortcut takes, one more digit,
                           // and what only a real has.
                           "-99999999", "-999999999", "2147483647", "-2147483648", "2147483648",
                           "9223372036854775807", "-9223372036854775808", "1e3", "1E0", "-"}) {
    for (const char* type : {"FP32", "FP64", "INT32", "INT64"}) {
      std::string far = absl::StrCat(R"({"inputs": [{"name": "x", "shape": [21], "datatype": ")",
                                     type, R"(", "data": [)", edge,
                                     ", 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, ",
                                     "8, 9, 0]}]}");
      ++checked;
      if (CommonPathAgrees(far)) ++taken;
    }
  }
  // The plain ones are taken in one pass (the rest is the general decoder's, and agrees).
  EXPECT_GT(taken, checked / 10);
}

// A float is read as the general decoder reads it: the nearest double, rounded to a float.
// Where that double is a midpoint between two floats, or a unit in the last place from one, a
// reader that reaches the float any other way (a product with 10^-k, a float division)
// rounds differently: values at such midpoints, written with up to 19 digits, and near them
// must read as the general decoder reads them.
TEST(JsonCodecTest, FloatsAtAMidpointBetweenTwoFloatsReadAsTheGeneralDecoderReadsThem) {
  std::mt19937_64 rng(2024);
  auto midpoint = [&]() -> std::string {
    // A float of [2^e, 2^(e+1)) and the next are 2^(e-23) apart: their midpoint is an odd
    // multiple of 2^(e-24).
    const int e = static_cast<int>(rng() % 34) - 10;
    const uint64_t odd = (uint64_t{1} << 24) + 2 * (rng() % (uint64_t{1} << 23)) + 1;
    const double exact = std::ldexp(static_cast<double>(odd), e - 24);
    // Written exactly where that takes few digits, else with 15 to 17 significant digits,
    // which land on the midpoint or a few units in the last place from it.
    char text[64];
    const int significant = 15 + static_cast<int>(rng() % 3);
    const int integer = exact >= 1 ? static_cast<int>(std::floor(std::log10(exact))) + 1 : 1;
    const int places = std::max(1, std::min(18, significant - integer));
    std::snprintf(text, sizeof(text), "%.*f", places, exact);
    return text;
  };
  int taken = 0;
  for (int round = 0; round < 500; ++round) {
    std::string data;
    for (int i = 0; i < 16; ++i) absl::StrAppend(&data, i ? ", " : "", midpoint());
    std::string body = absl::StrCat(R"({"inputs": [{"name": "x", "shape": [16], )",
                                    R"("datatype": "FP32", "data": [)", data, "]}]}");
    if (CommonPathAgrees(body)) ++taken;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(taken, 400);
}

// Random requests, shaped by a fixed seed, each with its keys in a random order and sometimes
// one thing wrong or unusual: the two decoders must agree on every one.
TEST(JsonCodecTest, TheTwoDecodersAgreeOnRandomRequests) {
  std::mt19937 rng(20261203);
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  const DataType types[] = {DataType::kBool,  DataType::kUint8, DataType::kInt8,
                            DataType::kInt16, DataType::kInt32, DataType::kInt64,
                            DataType::kFp32,  DataType::kFp64};
  auto leaf = [&]() -> std::string {
    switch (rng() % 9) {
      case 0: return chance(50) ? "true" : "false";
      case 1: return std::to_string(static_cast<int64_t>(rng() % 256) - 128);
      case 2: return std::to_string(rng() % 70000);
      case 3: return std::to_string(-static_cast<int64_t>(rng() % 3'000'000'000ULL));
      case 4: return "18446744073709551615";
      case 5: return "-9223372036854775808";
      case 6: return absl::StrCat(static_cast<double>(rng() % 1000) / 7.0);
      case 7: return chance(50) ? "3.5e38" : "1e300";
      default: return chance(50) ? "null" : "\"7\"";
    }
  };
  int taken = 0, agreed = 0;
  for (int round = 0; round < 3000; ++round) {
    int n_inputs = 1 + static_cast<int>(rng() % 3);
    std::vector<std::string> inputs;
    for (int i = 0; i < n_inputs; ++i) {
      DataType type = types[rng() % 8];
      std::vector<int64_t> shape;
      int rank = static_cast<int>(rng() % 3);
      for (int d = 0; d < rank; ++d) shape.push_back(static_cast<int64_t>(rng() % 4));
      int64_t count = *ElementCount(shape);
      if (chance(5)) count += chance(50) ? 1 : -1;
      bool nested = rank == 2 && shape[1] > 0 && chance(40);
      std::string data = "[";
      for (int64_t e = 0; e < std::max<int64_t>(0, count); ++e) {
        bool row_start = nested && e % shape[1] == 0;
        if (e > 0) data += row_start ? "],[" : ",";
        if (e == 0 && nested) data += "[";
        // Mostly values the datatype takes, sometimes anything.
        if (chance(90)) {
          switch (type) {
            case DataType::kBool: data += chance(50) ? "true" : "false"; break;
            case DataType::kFp32:
            case DataType::kFp64: data += absl::StrCat(static_cast<double>(rng() % 2001) / 8 - 125);
              break;
            case DataType::kUint8: data += std::to_string(rng() % 256); break;
            default: data += std::to_string(static_cast<int>(rng() % 255) - 127); break;
          }
        } else {
          data += leaf();
        }
      }
      if (nested && count > 0) data += "]";
      data += "]";
      std::vector<std::string> fields = {
          absl::StrCat("\"name\": \"in", chance(3) ? 0 : i, "\""),
          absl::StrCat("\"shape\": ", nlohmann::json(shape).dump()),
          absl::StrCat("\"datatype\": \"", chance(2) ? "FP16" : DataTypeName(type), "\""),
          absl::StrCat("\"data\": ", data)};
      if (chance(3)) fields.erase(fields.begin() + rng() % fields.size());
      if (chance(3)) fields.push_back("\"parameters\": {}");
      std::shuffle(fields.begin(), fields.end(), rng);
      std::string input = "{";
      for (size_t f = 0; f < fields.size(); ++f) absl::StrAppend(&input, f ? ", " : "", fields[f]);
      inputs.push_back(input + "}");
    }
    std::vector<std::string> top = {absl::StrCat("\"inputs\": [", absl::StrJoin(inputs, ", "), "]")};
    if (chance(30)) top.push_back(absl::StrCat("\"id\": \"r", round, "\""));
    if (chance(30)) top.push_back(R"("outputs": [{"name": "b"}, {"name": "a"}, {"name": "b"}])");
    if (chance(3)) top.push_back(R"("parameters": {"binary_data_output": false})");
    std::shuffle(top.begin(), top.end(), rng);
    std::string body = absl::StrCat("{", absl::StrJoin(top, ", "), "}");
    if (chance(2)) body.resize(rng() % body.size());
    if (CommonPathAgrees(body)) ++taken;
    if (DecodeInferRequestThroughDocument(body).ok()) ++agreed;
    if (::testing::Test::HasFailure()) break;
  }
  // Both kinds of case were met: bodies taken in one pass, and bodies left to the other.
  EXPECT_GT(taken, 300);
  EXPECT_LT(taken, 3000);
  EXPECT_GE(agreed, taken);
}

}  // namespace
}  // namespace shoal::serve
