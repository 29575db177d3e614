#include "master/placement.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::master {

absl::StatusOr<std::vector<PlacedTask>> PlaceTasks(const spec::JobSpec& job,
                                                   const std::vector<TaskRecord>& tasks,
                                                   const std::vector<backends::NodeGrant>& nodes) {
  struct Free {
    double cpus;
    uint64_t memory;
    size_t next_core = 0;
    size_t next_gpu = 0;
  };
  std::vector<Free> free;
  for (const auto& n : nodes) free.push_back({n.cpus, n.memory_bytes});
  std::vector<PlacedTask> placed;
  for (const auto& task : tasks) {
    const spec::Role* role = job.FindRole(task.role);
    if (role == nullptr) return absl::InternalError("task of an unknown role " + task.role);
    const spec::Resources& want = role->resources;
    bool done = false;
    for (size_t n = 0; n < nodes.size() && !done; ++n) {
      const auto& node = nodes[n];
      Free& f = free[n];
      if (f.cpus + 1e-9 < want.cpus || f.memory < want.memory_bytes ||
          node.gpus.size() - f.next_gpu < want.gpus) {
        continue;
      }
      PlacedTask p{task.role, task.index, node.name, {}, {}};
      f.cpus -= want.cpus;
      f.memory -= want.memory_bytes;
      for (uint32_t g = 0; g < want.gpus; ++g) p.gpus.push_back(node.gpus[f.next_gpu++]);
      double whole = std::floor(want.cpus);
      if (want.cpus >= 1 && whole == want.cpus && node.cores.size() - f.next_core >= whole) {
        for (int c = 0; c < static_cast<int>(whole); ++c) p.cores.push_back(node.cores[f.next_core++]);
      }
      placed.push_back(std::move(p));
      done = true;
    }
    if (!done) {
      return absl::ResourceExhaustedError(
          absl::StrCat("task ", task.Key(), " does not fit on any granted node"));
    }
  }
  return placed;
}

}  // namespace shoal::master
