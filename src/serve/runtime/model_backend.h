#pragma once

// The boundary between the server and the TorchScript runtime module
// (libshoal_serve_torch.so, torch_backend.cc). The module is loaded with dlopen only by
// `shoal serve` (backend_loader.h): linking libtorch into the `shoal` binary would load ~290
// shared libraries and cost ~0.7 s and ~160 MB at the start of every shoal command (docs/design/
// 0005-serving.md). Both sides are built together from this header, so they share the C++ ABI;
// only standard types cross it, errors as strings, and no exception ever does.

#include <memory>
#include <string>
#include <vector>

#include "serve/core/tensor.h"

namespace shoal::serve {

// One loaded copy of a TorchScript module (one model instance). Thread-compatible: one caller
// at a time, always the same thread after ModelBackend::PrepareThread.
class BackendModel {
 public:
  virtual ~BackendModel() = default;
  // The forward method's argument names, `self` left out, in order.
  virtual const std::vector<std::string>& ArgumentNames() const = 0;
  // Runs forward with `inputs` as its positional arguments, in inference mode. Outputs: one
  // for a returned tensor, one per element (positional, empty name) for a tuple or list of
  // tensors, one per entry (named by its key) for a Dict[str, Tensor]. False with `*error` set
  // when the model throws or returns anything else. `inputs`' bytes may be aliased while it
  // runs; the outputs own their bytes.
  virtual bool Run(std::vector<Tensor>& inputs, std::vector<Tensor>* outputs,
                   std::string* error) = 0;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  // Loads the TorchScript file at `path` (torch::jit::load, eval mode); nullptr with `*error`
  // set when it cannot be read or is not a TorchScript module with a forward method.
  virtual std::unique_ptr<BackendModel> Load(const std::string& path, std::string* error) = 0;
  // Makes intra-op parallel work started from the calling thread use `intra_op_threads`
  // threads. Call once on each thread that runs models, before its first Run.
  virtual void PrepareThread(int intra_op_threads) = 0;
  // Called every few seconds: memory the runtime keeps for reuse (large_block_cache.h) goes
  // back to the system when no model ran since the last call.
  virtual void ReleaseIdleMemory() {}
  // "libtorch 1.13.0 (OpenMP)", for logs and server metadata.
  virtual std::string Description() const = 0;
};

}  // namespace shoal::serve

// The module's one exported symbol; the caller owns the result.
extern "C" shoal::serve::ModelBackend* ShoalServeCreateTorchBackend();
inline constexpr char kShoalServeTorchBackendSymbol[] = "ShoalServeCreateTorchBackend";
