#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"

namespace shoal::backends {

std::vector<NodeGrant> OnePlacePerTask(const spec::JobSpec& job) {
  std::vector<NodeGrant> places;
  for (const auto& role : job.roles) {
    for (uint32_t i = 0; i < role.instances; ++i) {
      NodeGrant g;
      g.name = absl::StrCat(role.name, ".", i);
      g.for_task = absl::StrCat(role.name, ":", i);
      g.cpus = std::max(1.0, std::ceil(role.resources.cpus));
      g.memory_bytes = role.resources.memory_bytes;
      g.gpus_from_agent = role.resources.gpus > 0;
      g.gpu_count = role.resources.gpus;
      places.push_back(std::move(g));
    }
  }
  return places;
}

}  // namespace shoal::backends
