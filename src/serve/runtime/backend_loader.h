#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::serve {

class ModelBackend;

// Loads the TorchScript runtime module (libshoal_serve_torch.so; model_backend.h says why it
// is separate) and creates its backend. The module is looked for at the path it was built at,
// then in <directory of the shoal binary>/../lib/shoal/ (an installed tree).
// FailedPrecondition names every place looked at and why each failed. The module stays
// loaded for the life of the process.
absl::StatusOr<std::unique_ptr<ModelBackend>> LoadTorchBackend();

}  // namespace shoal::serve
