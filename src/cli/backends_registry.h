#pragma once

#include "backends/backend_registry.h"

namespace shoal::cli {

// The backends this binary offers: built on first use, read-only after. The only place that
// maps backend names to their implementations (docs/design/0010-backend-registry.md).
const backends::BackendRegistry& BuiltInBackends();

}  // namespace shoal::cli
