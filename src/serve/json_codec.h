#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/tensor.h"

namespace shoal::serve {

// A KServe v2 inference request, decoded from its JSON form.
struct InferRequest {
  std::string id;  // echoed in the response; empty when absent
  std::vector<Tensor> inputs;
  // The outputs asked for, in the order asked; empty: every output.
  std::vector<std::string> requested_outputs;
};

// Decodes the JSON body of POST /v2/models/{name}[/versions/{v}]/infer:
//   {"id": "...", "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
//                             "data": [1, 2, 3, 4, 5, 6]}], "outputs": [{"name": "y"}]}
// `data` is row-major, flat or nested as the shape is; BOOL takes true/false, the integer
// types integers within their range, FP32/FP64 any number. Everything wrong with the body
// (malformed JSON, missing or mistyped fields, a data count that is not the shape's element
// count, values out of range, the binary tensor extension) is an InvalidArgument whose message
// says what and where, e.g. "inputs[0] (x): shape [2,3] needs 6 values, data has 5".
absl::StatusOr<InferRequest> DecodeInferRequest(std::string_view body);

// The JSON body of a successful inference:
//   {"model_name": "m", "model_version": "1", "id": "...", "outputs": [{"name": "y",
//    "datatype": "FP32", "shape": [2, 3], "data": [...]}]}
// Floats are written in their shortest round-trip form; NaN and infinities as NaN, Infinity
// and -Infinity (as Python's json module reads and writes them; strict JSON has no spelling).
std::string EncodeInferResponse(std::string_view model_name, int64_t version,
                                std::string_view id, const std::vector<Tensor>& outputs);

// {"error": "<message>"}
std::string EncodeError(std::string_view message);

}  // namespace shoal::serve
