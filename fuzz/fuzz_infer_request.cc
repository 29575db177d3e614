// The KServe v2 REST request decoder (src/serve/frontends/json_codec.h), JSON and binary tensor
// extension, on any body. Both of its paths run, the one-pass simdjson path for the common
// form and the general nlohmann::json path, and must give the same answer: the decoder's
// contract is that the fast path only ever takes a body the general one decodes the same way.
//
// Input: the request body, or "#<header value>\n<body>" for a request with an
// Inference-Header-Content-Length header (the binary tensor extension).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "serve/frontends/json_codec.h"

namespace {

using shoal::serve::InferRequest;
using shoal::serve::Tensor;

bool SameTensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].datatype != b[i].datatype || a[i].shape != b[i].shape ||
        a[i].data.size() != b[i].data.size() ||
        (!a[i].data.empty() &&
         std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size()) != 0)) {
      return false;
    }
  }
  return true;
}

bool SameRequests(const InferRequest& a, const InferRequest& b) {
  return a.id == b.id && SameTensors(a.inputs, b.inputs) &&
         a.requested_outputs == b.requested_outputs &&
         a.binary_outputs.by_default == b.binary_outputs.by_default &&
         a.binary_outputs.per_output == b.binary_outputs.per_output;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::optional<std::string_view> header;
  if (!input.empty() && input[0] == '#') {
    size_t newline = input.find('\n');
    if (newline == std::string_view::npos) return 0;
    header = input.substr(1, newline - 1);
    input.remove_prefix(newline + 1);
  }
  absl::StatusOr<InferRequest> decoded = shoal::serve::DecodeInferRequest(input, header);
  absl::StatusOr<InferRequest> general =
      shoal::serve::DecodeInferRequestThroughDocument(input, header);
  if (decoded.ok() != general.ok()) __builtin_trap();
  if (decoded.ok()) {
    if (!SameRequests(*decoded, *general)) __builtin_trap();
  } else if (decoded.status().code() != absl::StatusCode::kInvalidArgument ||
             decoded.status().message() != general.status().message()) {
    __builtin_trap();
  }
  return 0;
}
