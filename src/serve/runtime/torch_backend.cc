// The TorchScript runtime module: the only file of Shoal that includes libtorch. Built as
// libshoal_serve_torch.so and loaded by `shoal serve` only (model_backend.h says why).
// Every entry point catches what libtorch throws (c10::Error and std::exception) and turns it
// into an error string: nothing is thrown across the module boundary.

#include <dlfcn.h>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/core/CPUAllocator.h>
#include <torch/script.h>
#include <torch/version.h>

#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/runtime/large_block_cache.h"
#include "serve/runtime/model_backend.h"

namespace shoal::serve {
namespace {

std::optional<at::ScalarType> ToScalarType(DataType type) {
  switch (type) {
    case DataType::kBool: return at::kBool;
    case DataType::kUint8: return at::kByte;
    case DataType::kInt8: return at::kChar;
    case DataType::kInt16: return at::kShort;
    case DataType::kInt32: return at::kInt;
    case DataType::kInt64: return at::kLong;
    case DataType::kFp32: return at::kFloat;
    case DataType::kFp64: return at::kDouble;
  }
  return std::nullopt;
}

std::optional<DataType> FromScalarType(at::ScalarType type) {
  switch (type) {
    case at::kBool: return DataType::kBool;
    case at::kByte: return DataType::kUint8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kFloat: return DataType::kFp32;
    case at::kDouble: return DataType::kFp64;
    default: return std::nullopt;
  }
}

// Copies a CPU tensor's elements into `out` (contiguous, row-major).
bool CopyOut(const at::Tensor& value, std::string name, Tensor* out, std::string* error) {
  at::Tensor t = value;
  if (!t.device().is_cpu()) t = t.cpu();
  std::optional<DataType> type = FromScalarType(t.scalar_type());
  if (!type) {
    *error = "the model returned a tensor of type " + std::string(c10::toString(t.scalar_type())) +
             ", which has no supported KServe datatype";
    return false;
  }
  t = t.contiguous();
  out->name = std::move(name);
  out->datatype = *type;
  out->shape.assign(t.sizes().begin(), t.sizes().end());
  size_t bytes = static_cast<size_t>(t.numel()) * DataTypeSize(*type);
  out->data.resize(bytes);
  if (bytes > 0) std::memcpy(out->data.data(), t.data_ptr(), bytes);
  return true;
}

bool CollectOutputs(const c10::IValue& result, std::vector<Tensor>* outputs, std::string* error) {
  auto add = [&](const c10::IValue& value, std::string name) {
    if (!value.isTensor()) {
      *error = "the model returned " + value.tagKind() + " where a tensor was expected";
      return false;
    }
    outputs->emplace_back();
    return CopyOut(value.toTensor(), std::move(name), &outputs->back(), error);
  };
  if (result.isTensor()) return add(result, "");
  if (result.isTuple()) {
    for (const c10::IValue& element : result.toTupleRef().elements()) {
      if (!add(element, "")) return false;
    }
    return true;
  }
  if (result.isList()) {
    for (const c10::IValue& element : result.toListRef()) {
      if (!add(element, "")) return false;
    }
    return true;
  }
  if (result.isGenericDict()) {
    for (const auto& entry : result.toGenericDict()) {
      if (!entry.key().isString()) {
        *error = "the model returned a dict whose keys are not strings";
        return false;
      }
      if (!add(entry.value(), entry.key().toStringRef())) return false;
    }
    return true;
  }
  *error = "the model returned " + result.tagKind() +
           "; expected a tensor, a tuple or list of tensors, or a Dict[str, Tensor]";
  return false;
}

// A TorchScript error's message without the interpreter's traceback, which quotes the model's
// source: the last line ("RuntimeError: The size of tensor a (2) must match ...") is the cause.
std::string WithoutTraceback(const std::string& message) {
  if (message.find("Traceback of TorchScript") == std::string::npos) return message;
  size_t end = message.find_last_not_of("\n ");
  if (end == std::string::npos) return message;
  size_t start = message.rfind('\n', end);
  return message.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start + 1));
}

class TorchModel final : public BackendModel {
 public:
  TorchModel(torch::jit::Module module, std::vector<std::string> argument_names)
      : module_(std::move(module)), argument_names_(std::move(argument_names)) {}

  const std::vector<std::string>& ArgumentNames() const override { return argument_names_; }

  bool Run(std::vector<Tensor>& inputs, std::vector<Tensor>* outputs,
           std::string* error) override {
    try {
      c10::InferenceMode inference_mode;
      std::vector<c10::IValue> arguments;
      arguments.reserve(inputs.size());
      for (Tensor& input : inputs) {
        // Wraps the request's bytes without a copy; they outlive the call, and CopyOut copies
        // any output that aliases them (an identity model returns its input).
        arguments.emplace_back(torch::from_blob(input.data.data(), input.shape,
                                                at::TensorOptions().dtype(*ToScalarType(
                                                    input.datatype))));
      }
      c10::IValue result = module_.forward(std::move(arguments));
      outputs->clear();
      return CollectOutputs(result, outputs, error);
    } catch (const c10::Error& e) {
      *error = WithoutTraceback(e.what_without_backtrace());
    } catch (const std::exception& e) {
      *error = WithoutTraceback(e.what());
    }
    return false;
  }

 private:
  torch::jit::Module module_;
  const std::vector<std::string> argument_names_;
};

// libtorch's CPU allocator for the whole process (only `shoal serve` loads this module):
// posix_memalign and free as libtorch's own, with large blocks kept for reuse.
class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const override {
    void* data = Cache().Allocate(bytes);
    if (data == nullptr && bytes > 0) {
      TORCH_CHECK(false, "shoal serve: out of memory allocating ", bytes, " bytes");
    }
    return {data, data, &Delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  // Never destroyed: tensors may be freed during the process's exit.
  static LargeBlockCache& Cache() {
    static LargeBlockCache* cache = new LargeBlockCache();
    return *cache;
  }

 private:
  static void Delete(void* data) { Cache().Free(data); }
};

class TorchBackend final : public ModelBackend {
 public:
  TorchBackend() {
    static CachingCpuAllocator* allocator = new CachingCpuAllocator();
    // Priority 1: above libtorch's default (0), registered when libc10 loaded.
    c10::SetCPUAllocator(allocator, /*priority=*/1);
    // The server runs each model instance on a thread of its own and sizes intra-op
    // parallelism per thread (PrepareThread); inter-op parallelism (torch.jit.fork) would add
    // a pool nobody sized. Only settable before the pool starts, hence here, once.
    try {
      at::set_num_interop_threads(1);
    } catch (const std::exception&) {
    }
  }

  std::unique_ptr<BackendModel> Load(const std::string& path, std::string* error) override {
    try {
      torch::jit::Module module = torch::jit::load(path, torch::kCPU);
      module.eval();
      auto forward = module.find_method("forward");
      if (!forward) {
        *error = path + ": the TorchScript module has no forward method";
        return nullptr;
      }
      std::vector<std::string> names;
      const auto& arguments = forward->function().getSchema().arguments();
      for (size_t i = 1; i < arguments.size(); ++i) names.push_back(arguments[i].name());
      return std::make_unique<TorchModel>(std::move(module), std::move(names));
    } catch (const c10::Error& e) {
      *error = path + ": not a loadable TorchScript file: " + e.what_without_backtrace();
    } catch (const std::exception& e) {
      *error = path + ": not a loadable TorchScript file: " + e.what();
    }
    return nullptr;
  }

  void PrepareThread(int intra_op_threads) override {
    // ATen's OpenMP backend keeps the thread count per calling thread (omp_set_num_threads
    // sets this thread's ICV), and lazily initialises each thread from a process-wide value on
    // its first parallel call, overwriting what set_num_threads set before. get_num_threads()
    // runs that lazy initialisation now, so the count set next sticks to this thread.
    try {
      (void)at::get_num_threads();
      at::set_num_threads(intra_op_threads > 0 ? intra_op_threads : 1);
    } catch (const std::exception&) {
    }
  }

  // The kernels OpenBLAS chose when libtorch loaded it (cpu_kernels.h says why they matter);
  // empty where libtorch was built on another BLAS.
  static std::string OpenBlasCore() {
    void* library = dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) return {};
    auto corename = reinterpret_cast<char* (*)()>(dlsym(library, "openblas_get_corename"));
    std::string name = corename != nullptr && corename() != nullptr ? corename() : "";
    dlclose(library);  // drops only the reference RTLD_NOLOAD took
    return name;
  }

  // The instruction set of ATen's own vectorised kernels ("AVX2", "AVX512"; cpu_kernels.h),
  // from the build summary: libtorch does not export the call that reads it. Fixed the first
  // time a kernel runs or this is asked.
  static std::string AtenCapability() {
    constexpr std::string_view kLabel = "CPU capability usage: ";
    std::string config;
    try {
      config = at::show_config();
    } catch (const std::exception&) {
      return {};
    }
    size_t at = config.find(kLabel);
    if (at == std::string::npos) return {};
    at += kLabel.size();
    size_t end = config.find('\n', at);
    return config.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }

  void ReleaseIdleMemory() override { CachingCpuAllocator::Cache().TrimIfIdle(); }

  std::string Description() const override {
    std::string parallel = at::get_parallel_info().find("OpenMP") != std::string::npos
                               ? "OpenMP"
                               : "native thread pool";
    std::string blas = OpenBlasCore();
    std::string aten = AtenCapability();
    return "libtorch " TORCH_VERSION " (" + parallel +
           (blas.empty() ? std::string() : ", OpenBLAS " + blas + " kernels") +
           (aten.empty() ? std::string() : ", ATen " + aten + " kernels") + ")";
  }
};

}  // namespace
}  // namespace shoal::serve

extern "C" __attribute__((visibility("default"))) shoal::serve::ModelBackend*
ShoalServeCreateTorchBackend() {
  try {
    return new shoal::serve::TorchBackend();
  } catch (...) {
    return nullptr;
  }
}
