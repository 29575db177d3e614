#pragma once

// A KServe v2 inference request as the server handles it, whichever front end decoded it.
// The front ends (frontends/: REST's JSON and binary tensors, gRPC's protobuf) build it and the
// served versions (repository/served_version.h) take it; it knows neither wire format.

#include <map>
#include <string>
#include <vector>

#include "serve/core/tensor.h"

namespace shoal::serve {

// Which outputs a REST request wants as raw bytes after the JSON (the binary tensor
// extension): the request's parameters.binary_data_output for all of them, overridden by an
// output's own parameters.binary_data.
struct BinaryOutputs {
  bool by_default = false;
  std::map<std::string, bool> per_output;

  bool IsBinary(const std::string& output) const {
    auto it = per_output.find(output);
    return it == per_output.end() ? by_default : it->second;
  }
  bool Any() const {
    if (by_default) return true;
    for (const auto& [name, binary] : per_output) {
      if (binary) return true;
    }
    return false;
  }
};

// A KServe v2 inference request, decoded from its JSON (REST) or protobuf (gRPC) form.
struct InferRequest {
  std::string id;  // echoed in the response; empty when absent
  std::vector<Tensor> inputs;
  // The outputs asked for, in the order asked; empty: every output.
  std::vector<std::string> requested_outputs;
  BinaryOutputs binary_outputs;  // REST only
};

}  // namespace shoal::serve
