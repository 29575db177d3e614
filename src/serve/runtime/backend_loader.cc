#include "serve/runtime/backend_loader.h"

#include <dlfcn.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serve/runtime/model_backend.h"

#ifndef SHOAL_SERVE_TORCH_MODULE
#error "SHOAL_SERVE_TORCH_MODULE (the module's build path) is set by src/serve/CMakeLists.txt"
#endif

namespace shoal::serve {

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadTorchBackend() {
  std::filesystem::path module_name = std::filesystem::path(SHOAL_SERVE_TORCH_MODULE).filename();
  std::vector<std::string> candidates = {SHOAL_SERVE_TORCH_MODULE};
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(
        (self.parent_path().parent_path() / "lib" / "shoal" / module_name).string());
  }
  std::vector<std::string> failures;
  for (const std::string& path : candidates) {
    if (!std::filesystem::exists(path, ec)) {
      failures.push_back(absl::StrCat(path, ": not there"));
      continue;
    }
    // RTLD_LOCAL: libtorch and its ~290 libraries stay out of the global symbol scope.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      failures.push_back(dlerror());
      continue;
    }
    auto create = reinterpret_cast<ModelBackend* (*)()>(
        dlsym(handle, kShoalServeTorchBackendSymbol));
    if (!create) {
      failures.push_back(absl::StrCat(path, ": no ", kShoalServeTorchBackendSymbol));
      dlclose(handle);
      continue;
    }
    ModelBackend* backend = create();
    if (!backend) {
      failures.push_back(absl::StrCat(path, ": the TorchScript runtime failed to start"));
      continue;
    }
    return std::unique_ptr<ModelBackend>(backend);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot load the TorchScript runtime module (rebuild shoal; Debian package libtorch-dev): ",
      absl::StrJoin(failures, "; ")));
}

}  // namespace shoal::serve
