#pragma once

// ModelInfer's protobuf messages (proto/inference/grpc_predict_v2.proto) to and from the
// server's InferRequest and Tensors. The generated types are only declared here: their
// header stays in the .cc files that build or read the messages.

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/core/infer_request.h"
#include "serve/core/tensor.h"

namespace inference {
class ModelInferRequest;
class ModelInferResponse;
}  // namespace inference

namespace shoal::serve {

// Decodes a ModelInfer request. Each input's elements come either from its typed `contents`
// (the field of its datatype: bool_contents for BOOL, int_contents for INT8/INT16/INT32,
// int64_contents, uint_contents for UINT8, fp32_contents, fp64_contents) or, for every input
// at once, from `raw_input_contents` (one entry per input, in order, little-endian row-major
// bytes). Everything wrong (no inputs, unknown datatype, a count or byte size that is not the
// shape's, values out of range, both forms mixed, contents in another datatype's field) is an
// InvalidArgument whose message says what and where, worded as the REST codec words it:
// "inputs[0] (x): shape [2,3] needs 6 values, contents.fp32_contents has 5".
absl::StatusOr<InferRequest> DecodeModelInferRequest(const inference::ModelInferRequest& request);

// Fills `response` (empty) with the outputs: as raw_output_contents when `raw`, else in each
// output's typed contents.
void EncodeModelInferResponse(std::string_view model_name, int64_t version, std::string_view id,
                              const std::vector<Tensor>& outputs, bool raw,
                              inference::ModelInferResponse* response);

}  // namespace shoal::serve
