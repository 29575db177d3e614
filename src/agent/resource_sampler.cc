#include "agent/resource_sampler.h"

#include <unistd.h>

#include <filesystem>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "process/cgroup_fs.h"

namespace shoal::agent {

namespace cgroup_fs = process::cgroup_fs;

namespace {

// A cgroup file holding one number (memory.current, memory.usage_in_bytes).
std::optional<uint64_t> ReadNumber(const std::string& path) {
  auto text = cgroup_fs::Read(path);
  uint64_t value = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

ResourceSampler::ResourceSampler(ResourceSamplerOptions options) : options_(std::move(options)) {
  if (options_.clock_ticks_per_second <= 0) options_.clock_ticks_per_second = ::sysconf(_SC_CLK_TCK);
  if (options_.page_size <= 0) options_.page_size = ::sysconf(_SC_PAGESIZE);
}

bool ResourceSampler::ReadStat(pid_t pid, ProcStat* stat) const {
  auto text = cgroup_fs::Read(options_.proc_root + "/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return false;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'. After it, field k of proc(5) is at position k - 3.
  size_t close = text->rfind(')');
  if (close == std::string::npos) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(*text).substr(close + 1), ' ', absl::SkipEmpty());
  if (fields.size() < 22) return false;
  int64_t ppid = 0;
  uint64_t utime = 0, stime = 0, rss = 0;
  int64_t cutime = 0, cstime = 0;  // signed in proc(5)
  if (!absl::SimpleAtoi(fields[1], &ppid) || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime) || !absl::SimpleAtoi(fields[13], &cutime) ||
      !absl::SimpleAtoi(fields[14], &cstime) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[21]), &rss)) {
    return false;
  }
  stat->ppid = static_cast<pid_t>(ppid);
  stat->cpu_ticks = utime + stime + static_cast<uint64_t>(std::max<int64_t>(0, cutime)) +
                    static_cast<uint64_t>(std::max<int64_t>(0, cstime));
  stat->rss_pages = rss;
  return true;
}

const std::map<pid_t, ResourceSampler::ProcStat>& ResourceSampler::AllProcesses() {
  if (scanned_) return all_;
  scanned_ = true;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.proc_root, ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || pid <= 0) continue;
    ProcStat stat;
    if (ReadStat(pid, &stat)) all_[pid] = stat;
  }
  return all_;
}

std::vector<pid_t> ResourceSampler::TreeOf(pid_t root) {
  const auto& all = AllProcesses();
  if (!all.count(root)) return {};
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& [pid, stat] : all) children[stat.ppid].push_back(pid);
  std::vector<pid_t> tree{root};
  std::set<pid_t> seen{root};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (pid_t child : children[tree[i]]) {
      if (seen.insert(child).second) tree.push_back(child);
    }
  }
  return tree;
}

std::vector<TaskUsage> ResourceSampler::Sample(const std::vector<TaskToSample>& tasks) {
  all_.clear();
  scanned_ = false;
  const int64_t now_ms = options_.clock->UnixMillis();
  std::vector<TaskUsage> usages;
  usages.reserve(tasks.size());
  for (const TaskToSample& task : tasks) {
    TaskUsage& usage = usages.emplace_back();
    usage.key = task.key;
    usage.ts_unix_ms = now_ms;

    std::optional<double> cgroup_cpu;
    std::optional<uint64_t> cgroup_memory;
    const process::TaskCgroup::Dir* tracking = nullptr;
    for (const auto& dir : task.cgroup_dirs) {
      if (dir.tracking && tracking == nullptr) tracking = &dir;
      if (dir.v2 && !cgroup_cpu) {
        if (auto usec = cgroup_fs::ReadKeyedValue(dir.path + "/cpu.stat", "usage_usec"); usec.ok()) {
          cgroup_cpu = static_cast<double>(*usec) / 1e6;
        }
      }
      if (dir.memory && !cgroup_memory) {
        cgroup_memory = ReadNumber(dir.path + (dir.v2 ? "/memory.current" : "/memory.usage_in_bytes"));
      }
    }
    if (!cgroup_cpu || !cgroup_memory) {
      std::vector<pid_t> pids = tracking != nullptr ? cgroup_fs::Procs(tracking->path) : TreeOf(task.pid);
      uint64_t ticks = 0, pages = 0;
      for (pid_t pid : pids) {
        ProcStat stat;
        auto it = scanned_ ? all_.find(pid) : all_.end();
        if (it != all_.end()) {
          stat = it->second;
        } else if (!ReadStat(pid, &stat)) {
          continue;  // exited meanwhile
        }
        ticks += stat.cpu_ticks;
        pages += stat.rss_pages;
      }
      if (!cgroup_cpu) {
        cgroup_cpu = static_cast<double>(ticks) / static_cast<double>(options_.clock_ticks_per_second);
      }
      if (!cgroup_memory) cgroup_memory = pages * static_cast<uint64_t>(options_.page_size);
    }
    usage.cpu_seconds_total = *cgroup_cpu;
    usage.rss_bytes = *cgroup_memory;

    if (options_.nvml != nullptr) {
      for (uint32_t index : task.gpus) {
        if (auto gpu = options_.nvml->Sample(index)) {
          usage.gpus.push_back({index, gpu->util_percent, gpu->memory_bytes});
        }
      }
    }
  }
  return usages;
}

}  // namespace shoal::agent
