#include "spec/spec_parser.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "spec/job_file_parser.h"
#include "spec/parse_support.h"

namespace shoal::spec {
namespace {

// Reads the whole file, once: a pipe (`shoal run <(generate-job)`) has nothing left to read a
// second time. The error names the path and the reason.
absl::StatusOr<std::string> ReadJobFileText(const std::string& path) {
  auto refuse = [&path](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the job file: ", why));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return refuse(std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode))) {
    ::close(fd);
    return refuse("not a regular file or a pipe");
  }
  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return refuse(std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

struct Demand {
  double total = 0;
  std::vector<std::string> parts;  // "32 x worker at 2"
  const Role* first = nullptr;     // the first role asking for any, where the total is reported
  bool task_too_big = false;
};

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source_name,
                                     const std::string& base_dir, const JobSections& sections) {
  try {
    return JobFileParser(source_name, AbsoluteBaseDir(base_dir), sections).Parse(yaml_text);
  } catch (const std::exception& e) {
    // Only allocation failures are left to land here; they must not cross the module boundary.
    return absl::InternalError(absl::StrCat(source_name, ": reading the job file: ", e.what()));
  }
}

absl::StatusOr<JobFile> ReadJobFile(const std::string& path, const JobSections& sections) {
  absl::StatusOr<std::string> text = ReadJobFileText(path);
  if (!text.ok()) return text.status();
  // The file's own directory, so that working_dir means the same wherever shoal is run from.
  std::string dir = std::filesystem::path(AbsoluteBaseDir(path)).parent_path().string();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(*text, path, dir, sections);
  if (!spec.ok()) return spec.status();
  return JobFile{*std::move(text), *std::move(spec)};
}

absl::StatusOr<JobSpec> ParseJobSpecFile(const std::string& path, const JobSections& sections) {
  absl::StatusOr<JobFile> file = ReadJobFile(path, sections);
  if (!file.ok()) return file.status();
  return std::move(file->spec);
}

absl::Status CheckFitsMachine(const JobSpec& spec, const machine::MachineInventory& machine) {
  std::vector<std::pair<int, std::string>> problems;
  auto report = [&](const Role& role, int key_line, absl::string_view key, std::string message) {
    int line = key_line > 0 ? key_line : role.line;
    problems.emplace_back(line, absl::StrCat(Where(spec.source_path, line), ": roles.", role.name,
                                             ".resources.", key, ": ", std::move(message)));
  };

  // One resource: what each task of a role asks for, and how amounts read in messages.
  struct Kind {
    absl::string_view key;
    double have;
    double (*per_task)(const Role&);
    int (*line)(const Role&);
    std::string (*figure)(double);  // "2", "2GiB"
    std::string (*amount)(double);  // "2 CPUs", "2GiB of memory"
  };
  const Kind kinds[] = {
      {"cpus", machine.cpus, [](const Role& r) { return r.resources.cpus; },
       [](const Role& r) { return r.resource_lines.cpus; }, FormatCount,
       [](double n) { return absl::StrCat(FormatCount(n), n == 1 ? " CPU" : " CPUs"); }},
      {"memory", static_cast<double>(machine.memory_bytes),
       [](const Role& r) { return static_cast<double>(r.resources.memory_bytes); },
       [](const Role& r) { return r.resource_lines.memory; },
       [](double n) { return FormatByteSize(static_cast<uint64_t>(n)); },
       [](double n) { return absl::StrCat(FormatByteSize(static_cast<uint64_t>(n)), " of memory"); }},
      {"gpus", static_cast<double>(machine.gpus.size()),
       [](const Role& r) { return static_cast<double>(r.resources.gpus); },
       [](const Role& r) { return r.resource_lines.gpus; }, FormatCount,
       [](double n) { return absl::StrCat(FormatCount(n), n == 1 ? " GPU" : " GPUs"); }},
  };
  // Sums of fractional CPUs (0.1 x 10) must not fail on rounding.
  constexpr double kSlack = 1e-9;

  for (const Kind& kind : kinds) {
    Demand demand;
    for (const Role& role : spec.roles) {
      double each = kind.per_task(role);
      if (each <= 0 || role.instances == 0) continue;
      if (demand.first == nullptr) demand.first = &role;
      demand.total += each * role.instances;
      demand.parts.push_back(
          absl::StrCat(role.instances, " x ", role.name, " at ", kind.figure(each)));
      if (each > kind.have + kSlack) {
        demand.task_too_big = true;
        report(role, kind.line(role), kind.key,
               absl::StrCat("one ", role.name, " task needs ", kind.amount(each),
                            ", this machine has ", kind.figure(kind.have)));
      }
    }
    if (demand.first != nullptr && !demand.task_too_big && demand.total > kind.have + kSlack) {
      report(*demand.first, kind.line(*demand.first), kind.key,
             absl::StrCat("the job needs ", kind.amount(demand.total), " in total (",
                          absl::StrJoin(demand.parts, " + "), "), this machine has ",
                          kind.figure(kind.have)));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  std::stable_sort(problems.begin(), problems.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> lines;
  for (auto& p : problems) lines.push_back(std::move(p.second));
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

absl::Status CheckPortsFit(const JobSpec& spec, uint64_t available, const std::string& ranges) {
  uint64_t needed = spec.TotalTasks();
  if (needed <= available || spec.roles.empty()) return absl::OkStatus();
  const Role* biggest = &spec.roles.front();
  for (const Role& role : spec.roles) {
    if (role.instances > biggest->instances) biggest = &role;
  }
  int line = biggest->instances_line > 0 ? biggest->instances_line : biggest->line;
  return absl::InvalidArgumentError(Printable(absl::StrCat(
      Where(spec.source_path, line), ": roles.", biggest->name, ".instances: the job's ", needed,
      " tasks need one port each on this machine, and its agent can hand out at most ", available,
      " (ports ", ranges, "); run fewer tasks, or widen the range with SHOAL_TASK_PORTS")));
}

}  // namespace shoal::spec
