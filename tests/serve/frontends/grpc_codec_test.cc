#include "serve/frontends/grpc_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "inference/grpc_predict_v2.pb.h"

namespace shoal::serve {
namespace {

using InputTensor = inference::ModelInferRequest::InferInputTensor;

template <typename T>
std::vector<T> Values(const Tensor& tensor) {
  std::vector<T> values(tensor.data.size() / sizeof(T));
  std::memcpy(values.data(), tensor.data.data(), tensor.data.size());
  return values;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
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

InputTensor* AddInput(inference::ModelInferRequest& request, const std::string& name,
                      const std::string& datatype, std::vector<int64_t> shape) {
  InputTensor* input = request.add_inputs();
  input->set_name(name);
  input->set_datatype(datatype);
  for (int64_t dim : shape) input->add_shape(dim);
  return input;
}

std::string DecodeError(const inference::ModelInferRequest& request) {
  absl::StatusOr<InferRequest> decoded = DecodeModelInferRequest(request);
  EXPECT_FALSE(decoded.ok()) << "accepted: " << request.DebugString();
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(decoded.status().message());
}

TEST(GrpcCodecTest, DecodesTypedContentsOfEveryDatatype) {
  inference::ModelInferRequest request;
  request.set_id("req-9");
  auto* contents = AddInput(request, "f", "FP32", {2, 2})->mutable_contents();
  for (float v : {1.5f, -2.0f, 0.0f, 3.25f}) contents->add_fp32_contents(v);
  AddInput(request, "d", "FP64", {1})->mutable_contents()->add_fp64_contents(1e300);
  contents = AddInput(request, "l", "INT64", {2})->mutable_contents();
  contents->add_int64_contents(std::numeric_limits<int64_t>::min());
  contents->add_int64_contents(7);
  contents = AddInput(request, "i", "INT32", {2})->mutable_contents();
  contents->add_int_contents(-5);
  contents->add_int_contents(std::numeric_limits<int32_t>::max());
  contents = AddInput(request, "s", "INT16", {1})->mutable_contents();
  contents->add_int_contents(-32768);
  contents = AddInput(request, "c", "INT8", {2})->mutable_contents();
  contents->add_int_contents(-128);
  contents->add_int_contents(127);
  contents = AddInput(request, "u", "UINT8", {2})->mutable_contents();
  contents->add_uint_contents(0);
  contents->add_uint_contents(255);
  contents = AddInput(request, "b", "BOOL", {3})->mutable_contents();
  for (bool v : {true, false, true}) contents->add_bool_contents(v);
  request.add_outputs()->set_name("y");
  request.add_outputs()->set_name("z");
  request.add_outputs()->set_name("y");

  absl::StatusOr<InferRequest> decoded = DecodeModelInferRequest(request);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->id, "req-9");
  ASSERT_EQ(decoded->inputs.size(), 8u);
  EXPECT_EQ(decoded->inputs[0].datatype, DataType::kFp32);
  EXPECT_EQ(decoded->inputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<float>(decoded->inputs[0]), (std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f}));
  EXPECT_EQ(Values<double>(decoded->inputs[1]), (std::vector<double>{1e300}));
  EXPECT_EQ(Values<int64_t>(decoded->inputs[2]),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 7}));
  EXPECT_EQ(Values<int32_t>(decoded->inputs[3]),
            (std::vector<int32_t>{-5, std::numeric_limits<int32_t>::max()}));
  EXPECT_EQ(Values<int16_t>(decoded->inputs[4]), (std::vector<int16_t>{-32768}));
  EXPECT_EQ(Values<int8_t>(decoded->inputs[5]), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(Values<uint8_t>(decoded->inputs[6]), (std::vector<uint8_t>{0, 255}));
  EXPECT_EQ(Values<uint8_t>(decoded->inputs[7]), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(decoded->requested_outputs, (std::vector<std::string>{"y", "z"}));
}

TEST(GrpcCodecTest, DecodesRawInputContentsInTheOrderOfTheInputs) {
  inference::ModelInferRequest request;
  AddInput(request, "a", "FP32", {3});
  AddInput(request, "b", "INT16", {2, 1});
  AddInput(request, "e", "FP64", {0});
  request.add_raw_input_contents(Bytes<float>({1.0f, -0.5f, 2.0f}));
  request.add_raw_input_contents(Bytes<int16_t>({-3, 300}));
  request.add_raw_input_contents("");
  absl::StatusOr<InferRequest> decoded = DecodeModelInferRequest(request);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(Values<float>(decoded->inputs[0]), (std::vector<float>{1.0f, -0.5f, 2.0f}));
  EXPECT_EQ(Values<int16_t>(decoded->inputs[1]), (std::vector<int16_t>{-3, 300}));
  EXPECT_EQ(decoded->inputs[1].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(decoded->inputs[2].data.empty());
}

TEST(GrpcCodecTest, RefusesRequestsWithoutWellFormedInputs) {
  inference::ModelInferRequest request;
  EXPECT_EQ(DecodeError(request),
            "'inputs' is required: a non-empty list of {name, shape, datatype, contents}");
  AddInput(request, "", "FP32", {1})->mutable_contents()->add_fp32_contents(1);
  EXPECT_EQ(DecodeError(request), "inputs[0]: 'name' is required and must be a non-empty string");

  request.Clear();
  AddInput(request, "x", "", {1});
  EXPECT_THAT(DecodeError(request), testing::StartsWith("inputs[0] (x): 'datatype' is required"));
  request.Clear();
  AddInput(request, "x", "FP16", {1});
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): datatype 'FP16' is not supported; supported: BOOL, UINT8, INT8, "
            "INT16, INT32, INT64, FP32, FP64");
  request.Clear();
  AddInput(request, "x", "FP32", {2, -1});
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): 'shape' must be a list of integers >= 0, got [2,-1]");
  request.Clear();
  AddInput(request, "x", "FP32", std::vector<int64_t>(33, 1));
  EXPECT_EQ(DecodeError(request), "inputs[0] (x): shape has 33 dimensions; at most 32");
  request.Clear();
  AddInput(request, "x", "FP32", {4611686018427387904, 4});
  EXPECT_EQ(DecodeError(request), "inputs[0] (x): shape [4611686018427387904,4] is too large");

  request.Clear();
  AddInput(request, "x", "FP32", {1})->mutable_contents()->add_fp32_contents(1);
  AddInput(request, "x", "FP32", {1})->mutable_contents()->add_fp32_contents(2);
  EXPECT_EQ(DecodeError(request), "inputs[1] (x): input 'x' is given twice");

  request.Clear();
  AddInput(request, "x", "FP32", {1})->mutable_contents()->add_fp32_contents(1);
  request.add_outputs();
  EXPECT_EQ(DecodeError(request), "outputs[0] must have a non-empty 'name'");
}

TEST(GrpcCodecTest, RefusesTypedContentsThatDoNotMatchTheShapeOrDatatype) {
  inference::ModelInferRequest request;
  auto* contents = AddInput(request, "x", "FP32", {2, 3})->mutable_contents();
  for (int i = 0; i < 5; ++i) contents->add_fp32_contents(i);
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): shape [2,3] needs 6 values, contents.fp32_contents has 5");

  request.Clear();
  AddInput(request, "x", "FP32", {2});
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): shape [2] needs 2 values, contents.fp32_contents has 0");

  request.Clear();
  contents = AddInput(request, "x", "FP32", {2})->mutable_contents();
  contents->add_fp64_contents(1);
  contents->add_fp64_contents(2);
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): FP32 values go in contents.fp32_contents; got 2 in "
            "contents.fp64_contents");

  request.Clear();
  contents = AddInput(request, "x", "INT8", {2})->mutable_contents();
  contents->add_int_contents(5);
  contents->add_int_contents(200);
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): contents.int_contents[1] is out of range for INT8: 200");

  request.Clear();
  AddInput(request, "x", "UINT8", {1})->mutable_contents()->add_uint_contents(256);
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): contents.uint_contents[0] is out of range for UINT8: 256");

  request.Clear();
  AddInput(request, "x", "INT16", {1})->mutable_contents()->add_int_contents(-40000);
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): contents.int_contents[0] is out of range for INT16: -40000");
}

TEST(GrpcCodecTest, RefusesRawContentsThatDoNotAddUp) {
  inference::ModelInferRequest request;
  AddInput(request, "a", "FP32", {2});
  AddInput(request, "b", "FP32", {2});
  request.add_raw_input_contents(Bytes<float>({1, 2}));
  EXPECT_EQ(DecodeError(request),
            "raw_input_contents has 1 entries for 2 inputs; give one per input, in the order of "
            "'inputs'");

  request.add_raw_input_contents(Bytes<float>({1, 2, 3}));
  EXPECT_EQ(DecodeError(request),
            "inputs[1] (b): raw_input_contents[1] has 12 bytes, but shape [2] of FP32 needs 8");

  request.set_raw_input_contents(1, std::string(7, '\0'));
  EXPECT_EQ(DecodeError(request),
            "inputs[1] (b): raw_input_contents[1] has 7 bytes, but shape [2] of FP32 needs 8");

  request.set_raw_input_contents(1, Bytes<float>({1, 2}));
  request.mutable_inputs(1)->mutable_contents()->add_fp32_contents(1);
  EXPECT_EQ(DecodeError(request),
            "inputs[1] (b): has contents.fp32_contents, but the request sends its tensors in "
            "raw_input_contents; send every input one way");

  request.Clear();
  AddInput(request, "x", "BOOL", {2});
  request.add_raw_input_contents(std::string("\x01\x02", 2));
  EXPECT_EQ(DecodeError(request),
            "inputs[0] (x): BOOL element 1 is the byte 2; BOOL elements are one byte, 0 (false) "
            "or 1 (true)");
}

TEST(GrpcCodecTest, EncodesOutputsTypedOrRaw) {
  std::vector<Tensor> outputs = {
      MakeTensor<float>("y", DataType::kFp32, {2}, {0.5f, -1.0f}),
      MakeTensor<int8_t>("c", DataType::kInt8, {2}, {-7, 9}),
      MakeTensor<uint8_t>("u", DataType::kUint8, {1}, {200}),
      MakeTensor<uint8_t>("b", DataType::kBool, {2}, {0, 1}),
      MakeTensor<int64_t>("n", DataType::kInt64, {1, 1}, {-42}),
      MakeTensor<double>("d", DataType::kFp64, {1}, {2.5})};

  inference::ModelInferResponse typed;
  EncodeModelInferResponse("m", 3, "id-1", outputs, /*raw=*/false, &typed);
  EXPECT_EQ(typed.model_name(), "m");
  EXPECT_EQ(typed.model_version(), "3");
  EXPECT_EQ(typed.id(), "id-1");
  EXPECT_EQ(typed.raw_output_contents_size(), 0);
  ASSERT_EQ(typed.outputs_size(), 6);
  EXPECT_EQ(typed.outputs(0).name(), "y");
  EXPECT_EQ(typed.outputs(0).datatype(), "FP32");
  EXPECT_THAT(typed.outputs(0).shape(), testing::ElementsAre(2));
  EXPECT_THAT(typed.outputs(0).contents().fp32_contents(), testing::ElementsAre(0.5f, -1.0f));
  EXPECT_THAT(typed.outputs(1).contents().int_contents(), testing::ElementsAre(-7, 9));
  EXPECT_THAT(typed.outputs(2).contents().uint_contents(), testing::ElementsAre(200u));
  EXPECT_THAT(typed.outputs(3).contents().bool_contents(), testing::ElementsAre(false, true));
  EXPECT_THAT(typed.outputs(4).shape(), testing::ElementsAre(1, 1));
  EXPECT_THAT(typed.outputs(4).contents().int64_contents(), testing::ElementsAre(-42));
  EXPECT_THAT(typed.outputs(5).contents().fp64_contents(), testing::ElementsAre(2.5));

  inference::ModelInferResponse raw;
  EncodeModelInferResponse("m", 3, "", outputs, /*raw=*/true, &raw);
  ASSERT_EQ(raw.raw_output_contents_size(), 6);
  EXPECT_FALSE(raw.outputs(0).has_contents());
  EXPECT_EQ(raw.outputs(0).datatype(), "FP32");
  EXPECT_EQ(raw.raw_output_contents(0), Bytes<float>({0.5f, -1.0f}));
  EXPECT_EQ(raw.raw_output_contents(1), Bytes<int8_t>({-7, 9}));
  EXPECT_EQ(raw.raw_output_contents(3), std::string("\x00\x01", 2));
  EXPECT_EQ(raw.raw_output_contents(4), Bytes<int64_t>({-42}));
}

TEST(GrpcCodecTest, RawOutputsDecodeBackAsRawInputs) {
  std::vector<Tensor> outputs = {MakeTensor<float>("x", DataType::kFp32, {2, 2}, {1, 2, 3, 4})};
  inference::ModelInferResponse response;
  EncodeModelInferResponse("m", 1, "", outputs, /*raw=*/true, &response);
  inference::ModelInferRequest request;
  AddInput(request, "x", response.outputs(0).datatype(),
           {response.outputs(0).shape().begin(), response.outputs(0).shape().end()});
  request.add_raw_input_contents(response.raw_output_contents(0));
  absl::StatusOr<InferRequest> decoded = DecodeModelInferRequest(request);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->inputs[0].data, outputs[0].data);
}

}  // namespace
}  // namespace shoal::serve
