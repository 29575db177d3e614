#pragma once

#include <optional>
#include <string_view>

#include "serve/frontends/json_codec.h"

namespace shoal::serve {

// The common inference request decoded straight into its tensors, without the nlohmann::json
// document DecodeInferRequest builds otherwise: an object with an optional string "id",
// "inputs" as objects of exactly name, shape, datatype and a (flat or nested) "data" list, and
// an optional "outputs" of objects with only a name. Building that document (a node per value,
// a map per object, strtod per number) cost more per small request than everything else in
// user space. A body in plain ASCII is read in one pass (ascii_infer_request.h); any other
// common body goes through simdjson's DOM.
//
// nullopt for anything else, errors included: DecodeInferRequest then decodes the body the
// general way, which takes every form and words every error. So this function accepts a body
// only where that way would accept it too, with the same result; json_codec_test holds the
// two to that.
std::optional<InferRequest> DecodeCommonInferRequest(std::string_view json);

}  // namespace shoal::serve
