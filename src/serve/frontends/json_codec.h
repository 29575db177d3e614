#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/core/infer_request.h"
#include "serve/core/tensor.h"

namespace shoal::serve {

// The HTTP header of the binary tensor extension: the length of the JSON at the start of a
// body whose binary tensor data follows the JSON.
inline constexpr char kInferenceHeaderContentLength[] = "Inference-Header-Content-Length";

// Decodes the JSON body of POST /v2/models/{name}[/versions/{v}]/infer:
//   {"id": "...", "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
//                             "data": [1, 2, 3, 4, 5, 6]}], "outputs": [{"name": "y"}]}
// `data` is row-major, flat or nested as the shape is; BOOL takes true/false, the integer
// types integers within their range, FP32/FP64 any number. Everything wrong with the body
// (malformed JSON, missing or mistyped fields, a data count that is not the shape's element
// count, values out of range) is an InvalidArgument whose message says what and where, e.g.
// "inputs[0] (x): shape [2,3] needs 6 values, data has 5".
//
// The binary tensor extension: `json_size_header` is the Inference-Header-Content-Length
// header's value when the request has one: the body's first that many bytes are the JSON, and
// the rest is the bytes of the inputs with parameters.binary_data_size (instead of `data`),
// one after the other in the order of `inputs`, little-endian and row-major (BOOL: one byte, 0
// or 1). Every size must add up: the header a number no larger than the body, each
// binary_data_size the input's shape x datatype size, their sum the bytes after the JSON;
// anything else is an InvalidArgument saying which number is off.
absl::StatusOr<InferRequest> DecodeInferRequest(
    std::string_view body, std::optional<std::string_view> json_size_header = std::nullopt);

// DecodeInferRequest without its one-pass path for the common form (common_infer_request.h):
// every body through a JSON document. For the tests that hold the two to the same answers.
absl::StatusOr<InferRequest> DecodeInferRequestThroughDocument(
    std::string_view body, std::optional<std::string_view> json_size_header = std::nullopt);

// Deeper shapes are refused.
inline constexpr size_t kMaxRequestRank = 32;

// The JSON body of a successful inference:
//   {"model_name": "m", "model_version": "1", "id": "...", "outputs": [{"name": "y",
//    "datatype": "FP32", "shape": [2, 3], "data": [...]}]}
// Floats are written in their shortest round-trip form; NaN and infinities as NaN, Infinity
// and -Infinity (as Python's json module reads and writes them; strict JSON has no spelling).
std::string EncodeInferResponse(std::string_view model_name, int64_t version,
                                std::string_view id, const std::vector<Tensor>& outputs);

// A response body with the binary tensor extension: the outputs `binary` selects appear in the
// JSON with parameters.binary_data_size instead of data, and their bytes follow the JSON in
// the order of `outputs`. `json_size` is the JSON's length (the Inference-Header-Content-Length
// to send) when some output is binary, nullopt when the body is all JSON.
struct EncodedInferResponse {
  std::string body;
  std::optional<size_t> json_size;
};
EncodedInferResponse EncodeInferResponse(std::string_view model_name, int64_t version,
                                         std::string_view id, const std::vector<Tensor>& outputs,
                                         const BinaryOutputs& binary);

// {"error": "<message>"}
std::string EncodeError(std::string_view message);

}  // namespace shoal::serve
