#include "backends/slurm/srun_command.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shoal::backends {

uint64_t SlurmMinutes(std::chrono::milliseconds limit) {
  uint64_t minutes = static_cast<uint64_t>((limit.count() + 59999) / 60000);
  return std::max<uint64_t>(minutes, 1);
}

std::vector<SlurmComponent> SlurmComponents(const spec::JobSpec& job) {
  std::vector<SlurmComponent> components;
  auto same = [](const spec::Resources& a, const spec::Resources& b) {
    return std::max(1.0, std::ceil(a.cpus)) == std::max(1.0, std::ceil(b.cpus)) &&
           a.memory_bytes == b.memory_bytes && a.gpus == b.gpus;
  };
  for (const auto& role : job.roles) {
    auto it = std::find_if(components.begin(), components.end(),
                           [&](const SlurmComponent& c) { return same(c.per_task, role.resources); });
    if (it == components.end()) {
      components.push_back({role.resources, {}, 0});
      it = components.end() - 1;
    }
    it->roles.push_back({role.name, role.instances, 0});
    it->tasks += role.instances;
  }
  uint32_t rank = 0;
  for (auto& c : components) {
    for (auto& part : c.roles) {
      part.first_rank = rank;
      rank += part.instances;
    }
  }
  return components;
}

std::string SlurmPlaceMap(const std::vector<SlurmComponent>& components) {
  std::vector<std::string> parts;
  for (const auto& c : components) {
    for (const auto& part : c.roles) parts.push_back(absl::StrCat(part.role, ":", part.first_rank));
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::string> SlurmPlaceOf(const std::string& place_map, uint32_t rank) {
  std::string best_role;
  uint32_t best_first = 0;
  bool found = false;
  for (absl::string_view entry : absl::StrSplit(place_map, ',', absl::SkipEmpty())) {
    size_t colon = entry.rfind(':');
    uint32_t first = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(entry.substr(colon + 1), &first)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the place map must be ROLE:RANK[,ROLE:RANK...], got '", place_map, "'"));
    }
    if (first <= rank && (!found || first >= best_first)) {
      best_role = std::string(entry.substr(0, colon));
      best_first = first;
      found = true;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("no role in '", place_map, "' holds Slurm task ", rank));
  }
  return absl::StrCat(best_role, ".", rank - best_first);
}

std::vector<std::string> SrunCommand(const spec::JobSpec& job, const SlurmRequest& request,
                                     const std::string& srun, const std::string& job_name,
                                     const std::string& shoal_binary,
                                     const std::vector<std::string>& agent_args) {
  std::vector<SlurmComponent> components = SlurmComponents(job);
  std::string place_map = SlurmPlaceMap(components);
  std::vector<std::string> argv = {srun};
  for (size_t k = 0; k < components.size(); ++k) {
    const SlurmComponent& component = components[k];
    const spec::Resources& want = component.per_task;
    if (k > 0) argv.push_back(":");
    // Every component carries the job-wide options: Slurm reads them per component.
    argv.push_back("--job-name=" + job_name);
    if (!request.partition.empty()) argv.push_back("--partition=" + request.partition);
    if (!request.account.empty()) argv.push_back("--account=" + request.account);
    if (!request.constraint.empty()) argv.push_back("--constraint=" + request.constraint);
    if (request.time_limit.count() > 0) {
      argv.push_back(absl::StrCat("--time=", SlurmMinutes(request.time_limit)));
    }
    uint32_t cpus = static_cast<uint32_t>(std::max(1.0, std::ceil(want.cpus)));
    argv.push_back(absl::StrCat("--ntasks=", component.tasks));
    argv.push_back(absl::StrCat("--cpus-per-task=", cpus));
    if (want.memory_bytes > 0) {
      // Per CPU is the only per-task memory request Slurm has; rounded up to whole MiB.
      uint64_t mib = (want.memory_bytes + (1 << 20) - 1) >> 20;
      argv.push_back(absl::StrCat("--mem-per-cpu=", (mib + cpus - 1) / cpus, "M"));
    }
    if (want.gpus > 0) argv.push_back(absl::StrCat("--gpus-per-task=", want.gpus));
    // A dead agent is the master's to handle (its policy may restart the group or shrink the
    // job): Slurm must not end the others, nor the job when a node fails.
    argv.push_back("--kill-on-bad-exit=0");
    argv.push_back("--no-kill");
    argv.push_back(shoal_binary);
    argv.push_back("agent");
    argv.insert(argv.end(), agent_args.begin(), agent_args.end());
    argv.push_back("--slurm-place=" + place_map);
  }
  return argv;
}

namespace {

// "3", "0-2", "0,2-3" -> the ranks.
std::vector<uint32_t> ParseRanks(absl::string_view text) {
  std::vector<uint32_t> ranks;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    uint32_t lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo)) continue;
    hi = lo;
    if (ends.size() == 2 && !absl::SimpleAtoi(ends[1], &hi)) continue;
    for (uint32_t r = lo; r <= hi && r - lo < 100000; ++r) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

std::optional<SrunLineEvent> ClassifySrunLine(const std::string& line) {
  static const std::regex queued(R"(srun: job (\d+) queued and waiting for resources)");
  static const std::regex allocated(R"(srun: job (\d+) has been allocated resources)");
  static const std::regex refused(R"(srun: error: (Unable to allocate resources: .*))");
  static const std::regex fatal(R"(srun: (?:fatal|error): ((?:Invalid|Requested|Memory specification|Batch job submission failed|Job submit/allocate failed).*))");
  static const std::regex cancelled(
      R"(\*\*\* (?:JOB|STEP) (\d+)(?:\.\S+)? ON \S+ CANCELLED AT \S+( DUE TO [A-Z ]+?)?( \*\*\*|$))");
  static const std::regex task_ended(
      R"(srun: error: (\S+): tasks? ([0-9,\-]+): (.*))");
  std::smatch m;
  SrunLineEvent e;
  if (std::regex_search(line, m, queued)) {
    e.kind = SrunLineEvent::kQueued;
    (void)absl::SimpleAtoi(m[1].str(), &e.slurm_job);
    e.reason = absl::StrCat("Slurm job ", m[1].str(), " is queued, waiting for resources");
    return e;
  }
  if (std::regex_search(line, m, allocated)) {
    e.kind = SrunLineEvent::kAllocated;
    (void)absl::SimpleAtoi(m[1].str(), &e.slurm_job);
    e.reason = absl::StrCat("Slurm job ", m[1].str(), " was allocated");
    return e;
  }
  if (std::regex_search(line, m, refused) || std::regex_search(line, m, fatal)) {
    e.kind = SrunLineEvent::kRefused;
    e.reason = absl::StrCat("Slurm refused the job: ", m[1].str());
    return e;
  }
  if (std::regex_search(line, m, cancelled)) {
    e.kind = SrunLineEvent::kCancelled;
    (void)absl::SimpleAtoi(m[1].str(), &e.slurm_job);
    std::string due(absl::StripPrefix(m[2].str(), " DUE TO "));
    for (char& c : due) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    e.reason = due.empty()
                   ? absl::StrCat("Slurm job ", m[1].str(),
                                  " was cancelled outside Shoal (scancel or an administrator)")
                   : absl::StrCat("Slurm cancelled job ", m[1].str(), " due to ", due);
    return e;
  }
  if (std::regex_search(line, m, task_ended)) {
    e.kind = SrunLineEvent::kTaskEnded;
    e.task_ranks = ParseRanks(m[2].str());
    e.reason = absl::StrCat("the agent on Slurm node ", m[1].str(), " ended: ", m[3].str());
    if (e.task_ranks.empty()) return std::nullopt;
    return e;
  }
  return std::nullopt;
}

}  // namespace shoal::backends
