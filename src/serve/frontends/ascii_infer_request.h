#pragma once

#include <optional>
#include <string_view>

#include "serve/core/infer_request.h"

namespace shoal::serve {

// The common inference request (DecodeCommonInferRequest's form) when its body is plain
// ASCII: no string with an escape, a control or a non-ASCII byte. Read in one pass straight
// into the tensors, a number's digits eight bytes at a time: simdjson's tape, and the walk
// over it, cost ~320 instructions a number of a tensor's data, this ~140.
//
// nullopt for anything else, errors included; DecodeCommonInferRequest then tries simdjson,
// and DecodeInferRequest the general way. A body it takes decodes as the general way decodes
// it; json_codec_test and fuzz_infer_request hold it to that.
std::optional<InferRequest> DecodeAsciiInferRequest(std::string_view json);

}  // namespace shoal::serve
