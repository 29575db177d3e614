#include "process/resource_limits.h"

#include <filesystem>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "process/cgroup_fs.h"

namespace shoal::process {
namespace {

// The agent's own cgroup path in each hierarchy, from /proc/self/cgroup
// ("hierarchy-id:controller,list:/path"; cgroup v2 is "0::/path").
struct SelfCgroups {
  std::map<std::string, std::string> v1;  // controller -> path
  std::string v2;                         // empty when unknown
};

SelfCgroups ReadSelfCgroups(const std::string& file) {
  SelfCgroups self;
  auto text = cgroup_fs::Read(file);
  if (!text.ok()) return self;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) {
      self.v2 = std::string(parts[2]);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
      self.v1[std::string(controller)] = std::string(parts[2]);
    }
  }
  return self;
}

// The agent's own cgroup first (nested limits, delegation), then the hierarchy's root.
std::vector<std::string> CandidateParents(const std::string& mount, const std::string& own) {
  std::vector<std::string> parents;
  if (!own.empty() && own != "/") parents.push_back(absl::StrCat(mount, own));
  parents.push_back(mount);
  return parents;
}

bool ListsWord(const std::string& path, const std::string& word) {
  auto text = cgroup_fs::Read(path);
  if (!text.ok()) return false;
  for (absl::string_view w : absl::StrSplit(*text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (w == word) return true;
  }
  return false;
}

// Makes `controller` available to the children of `dir` (cgroup v2).
absl::Status EnableForChildren(const std::string& dir, const std::string& controller) {
  std::string file = absl::StrCat(dir, "/cgroup.subtree_control");
  if (ListsWord(file, controller)) return absl::OkStatus();
  return cgroup_fs::Write(file, absl::StrCat("+", controller));
}

}  // namespace

absl::StatusOr<ResourceLimits::Hierarchy> ResourceLimits::SetUp(const Options& options,
                                                                 const std::string& label,
                                                                 const std::string& parent,
                                                                 bool v2,
                                                                 const std::string& controller) {
  bool enable = v2 && !controller.empty();
  if (enable) {
    if (!ListsWord(absl::StrCat(parent, "/cgroup.controllers"), controller)) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " at ", parent, " does not offer the ", controller, " controller"));
    }
    absl::Status status = EnableForChildren(parent, controller);
    if (!status.ok()) return status;
  }
  Hierarchy h;
  h.label = label;
  h.v2 = v2;
  h.name_dir = absl::StrCat(parent, "/", options.cgroup_name);
  h.instance_dir = absl::StrCat(h.name_dir, "/", options.instance_id);
  // Another agent may rmdir the shared name directory between our two mkdirs: retry once.
  absl::Status status;
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = cgroup_fs::MakeDir(h.name_dir);
    if (status.ok() && enable) status = EnableForChildren(h.name_dir, controller);
    if (status.ok()) status = cgroup_fs::MakeDir(h.instance_dir);
    if (status.code() != absl::StatusCode::kNotFound) break;
  }
  if (status.ok() && enable) status = EnableForChildren(h.instance_dir, controller);
  if (status.ok() && !v2 && label == "cgroup v1 memory" &&
      !cgroup_fs::Exists(absl::StrCat(h.instance_dir, "/memory.limit_in_bytes"))) {
    status = absl::FailedPreconditionError(
        absl::StrCat(h.instance_dir, " has no memory.limit_in_bytes"));
  }
  if (!status.ok()) {
    cgroup_fs::RemoveDir(h.instance_dir).IgnoreError();
    cgroup_fs::RemoveDir(h.name_dir).IgnoreError();
    return status;
  }
  return h;
}

std::unique_ptr<ResourceLimits> ResourceLimits::Detect(const Options& options) {
  std::unique_ptr<ResourceLimits> limits(new ResourceLimits());
  SelfCgroups self = ReadSelfCgroups(options.self_cgroup_file);
  std::vector<std::string> memory_reasons;
  std::vector<std::string> tracking_reasons;

  std::string v2_mount;
  if (options.allow_v2) {
    if (cgroup_fs::IsCgroupV2(options.cgroup_root)) {
      v2_mount = options.cgroup_root;
    } else if (cgroup_fs::IsCgroupV2(absl::StrCat(options.cgroup_root, "/unified"))) {
      v2_mount = absl::StrCat(options.cgroup_root, "/unified");
    } else {
      memory_reasons.push_back(absl::StrCat("no cgroup v2 mount at ", options.cgroup_root,
                                            " or ", options.cgroup_root, "/unified"));
    }
  } else {
    memory_reasons.push_back("cgroup v2 not allowed by options");
  }
  if (!v2_mount.empty()) {
    for (const std::string& parent : CandidateParents(v2_mount, self.v2)) {
      auto h = SetUp(options, "cgroup v2", parent, /*v2=*/true, "memory");
      if (h.ok()) {
        limits->memory_ = *h;
        limits->tracking_ = *h;
        limits->tracking_is_memory_ = true;
        break;
      }
      memory_reasons.push_back(std::string(h.status().message()));
    }
  }
  if (!limits->memory_) {
    std::string mount = absl::StrCat(options.cgroup_root, "/memory");
    if (!cgroup_fs::IsCgroupV1(mount)) {
      memory_reasons.push_back(absl::StrCat("no cgroup v1 memory hierarchy at ", mount));
    } else {
      for (const std::string& parent : CandidateParents(mount, self.v1["memory"])) {
        auto h = SetUp(options, "cgroup v1 memory", parent, /*v2=*/false, "");
        if (h.ok()) {
          limits->memory_ = *h;
          break;
        }
        memory_reasons.push_back(std::string(h.status().message()));
      }
    }
  }

  if (!limits->tracking_ && !v2_mount.empty()) {
    for (const std::string& parent : CandidateParents(v2_mount, self.v2)) {
      auto h = SetUp(options, "cgroup v2", parent, /*v2=*/true, "");
      if (h.ok()) {
        limits->tracking_ = *h;
        break;
      }
      tracking_reasons.push_back(std::string(h.status().message()));
    }
  }
  for (const char* controller : {"pids", "freezer"}) {
    if (limits->tracking_) break;
    std::string mount = absl::StrCat(options.cgroup_root, "/", controller);
    if (!cgroup_fs::IsCgroupV1(mount)) {
      tracking_reasons.push_back(
          absl::StrCat("no cgroup v1 ", controller, " hierarchy at ", mount));
      continue;
    }
    for (const std::string& parent : CandidateParents(mount, self.v1[controller])) {
      auto h = SetUp(options, absl::StrCat("cgroup v1 ", controller), parent, /*v2=*/false, "");
      if (h.ok()) {
        limits->tracking_ = *h;
        break;
      }
      tracking_reasons.push_back(std::string(h.status().message()));
    }
  }
  if (!limits->tracking_ && limits->memory_) {
    limits->tracking_ = limits->memory_;
    limits->tracking_is_memory_ = true;
  }

  if (!limits->memory_) {
    limits->memory_reasons_ = absl::StrJoin(memory_reasons, "; ");
    limits->notices_.push_back(
        absl::StrCat("memory limits are advisory: no writable memory cgroup (v2 or v1): ",
                     limits->memory_reasons_));
  }
  if (!limits->tracking_) {
    limits->notices_.push_back(absl::StrCat(
        "processes that leave their process group (setsid) cannot be found or killed: no "
        "writable cgroup (v2, v1 pids, freezer or memory): ",
        absl::StrJoin(tracking_reasons, "; ")));
  }
  return limits;
}

ResourceLimits::~ResourceLimits() {
  std::vector<const Hierarchy*> hierarchies;
  if (memory_) hierarchies.push_back(&*memory_);
  if (tracking_ && !tracking_is_memory_) hierarchies.push_back(&*tracking_);
  for (const Hierarchy* h : hierarchies) {
    cgroup_fs::RemoveDir(h->instance_dir).IgnoreError();
    // Shared by every agent instance on the machine: EBUSY while another one lives.
    cgroup_fs::RemoveDir(h->name_dir).IgnoreError();
  }
}

void ResourceLimits::RemoveStaleInstances(std::chrono::seconds min_age) const {
  auto now = std::filesystem::file_time_type::clock::now();
  for (const auto* h : {&memory_, &tracking_}) {
    if (!h->has_value()) continue;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator((*h)->name_dir, ec)) {
      if (!entry.is_directory(ec) || entry.path().string() == (*h)->instance_dir) continue;
      auto created = std::filesystem::last_write_time(entry.path(), ec);
      if (ec || now - created < min_age) continue;
      cgroup_fs::RemoveTree(entry.path().string()).IgnoreError();
    }
  }
}

std::string ResourceLimits::Describe() const {
  std::string memory = memory_ ? absl::StrCat(memory_->label, " at ", memory_->instance_dir)
                               : absl::StrCat("advisory (", memory_reasons_, ")");
  std::string tracking = tracking_
                             ? absl::StrCat(tracking_->label, " at ", tracking_->instance_dir)
                             : "process group only";
  return absl::StrCat("memory limits: ", memory, "; process tracking: ", tracking);
}

absl::StatusOr<std::unique_ptr<TaskCgroup>> ResourceLimits::CreateTask(
    const std::string& task, uint64_t memory_limit_bytes) const {
  std::vector<TaskCgroup::Dir> dirs;
  auto fail = [&dirs](absl::Status status) {
    for (const TaskCgroup::Dir& dir : dirs) cgroup_fs::RemoveDir(dir.path).IgnoreError();
    return status;
  };
  if (tracking_) {
    TaskCgroup::Dir dir;
    dir.path = absl::StrCat(tracking_->instance_dir, "/", task);
    dir.v2 = tracking_->v2;
    dir.tracking = true;
    dir.memory = tracking_is_memory_;
    absl::Status status = cgroup_fs::MakeDir(dir.path);
    if (!status.ok()) return fail(status);
    dirs.push_back(dir);
  }
  if (memory_ && !tracking_is_memory_ && memory_limit_bytes > 0) {
    TaskCgroup::Dir dir;
    dir.path = absl::StrCat(memory_->instance_dir, "/", task);
    dir.v2 = memory_->v2;
    dir.memory = true;
    absl::Status status = cgroup_fs::MakeDir(dir.path);
    if (!status.ok()) return fail(status);
    dirs.push_back(dir);
  }
  if (memory_limit_bytes > 0) {
    std::string limit = absl::StrCat(memory_limit_bytes);
    for (const TaskCgroup::Dir& dir : dirs) {
      if (!dir.memory) continue;
      if (dir.v2) {
        absl::Status status = cgroup_fs::Write(absl::StrCat(dir.path, "/memory.max"), limit);
        if (!status.ok()) return fail(status);
        // No swapping around the limit, and an OOM kill takes the whole task (all or nothing,
        // like a failed rank). Older kernels lack these files: the limit still holds.
        cgroup_fs::Write(absl::StrCat(dir.path, "/memory.swap.max"), "0").IgnoreError();
        cgroup_fs::Write(absl::StrCat(dir.path, "/memory.oom.group"), "1").IgnoreError();
      } else {
        absl::Status status =
            cgroup_fs::Write(absl::StrCat(dir.path, "/memory.limit_in_bytes"), limit);
        if (!status.ok()) return fail(status);
        // memory+swap; absent without swap accounting, which is fine.
        cgroup_fs::Write(absl::StrCat(dir.path, "/memory.memsw.limit_in_bytes"), limit)
            .IgnoreError();
      }
    }
  }
  if (dirs.empty()) return std::unique_ptr<TaskCgroup>();
  return std::make_unique<TaskCgroup>(std::move(dirs));
}

}  // namespace shoal::process
