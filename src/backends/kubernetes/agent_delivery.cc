#include "backends/kubernetes/agent_delivery.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/kubernetes/kubernetes_section.h"

namespace shoal::backends {
namespace fs = std::filesystem;
namespace {

// Where the DaemonSet's init container sees the parent of the host directory: the new copy is
// written beside the old one and renamed over it, which only works within one mount.
constexpr char kHostParentMount[] = "/host";

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status FromErrorCode(const std::string& what, const std::error_code& ec) {
  return absl::InternalError(absl::StrCat(what, ": ", ec.message()));
}

bool SameFileContents(const fs::path& a, const fs::path& b) {
  std::ifstream in_a(a, std::ios::binary);
  std::ifstream in_b(b, std::ios::binary);
  if (!in_a || !in_b) return false;
  std::vector<char> buf_a(1 << 16), buf_b(1 << 16);
  for (;;) {
    in_a.read(buf_a.data(), static_cast<std::streamsize>(buf_a.size()));
    in_b.read(buf_b.data(), static_cast<std::streamsize>(buf_b.size()));
    if (in_a.gcount() != in_b.gcount()) return false;
    if (std::memcmp(buf_a.data(), buf_b.data(), static_cast<size_t>(in_a.gcount())) != 0) {
      return false;
    }
    if (!in_a || !in_b) return !in_a && !in_b;
  }
}

// Does `to` hold exactly `from`'s entries (types, modes, symlink targets, bytes)?
bool SameTree(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(to, ec))) return false;
  size_t entries = 0;
  for (auto it = fs::recursive_directory_iterator(from, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    ++entries;
    const fs::path rel = it->path().lexically_relative(from);
    const fs::file_status want = it->symlink_status(ec);
    const fs::file_status have = fs::symlink_status(to / rel, ec);
    if (ec || want.type() != have.type() || want.permissions() != have.permissions()) {
      return false;
    }
    if (fs::is_symlink(want)) {
      if (fs::read_symlink(it->path(), ec) != fs::read_symlink(to / rel, ec) || ec) return false;
    } else if (fs::is_regular_file(want)) {
      if (fs::file_size(it->path(), ec) != fs::file_size(to / rel, ec) || ec) return false;
      if (!SameFileContents(it->path(), to / rel)) return false;
    }
  }
  if (ec) return false;
  size_t have_entries = 0;
  for (auto it = fs::recursive_directory_iterator(to, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    ++have_entries;
  }
  return !ec && have_entries == entries;
}

absl::Status SyncPath(const fs::path& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("cannot open ", path.string()));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno(absl::StrCat("cannot sync ", path.string()));
  return absl::OkStatus();
}

// A copy of `from` at `to` (absent), each file synced: a node that crashes after the rename
// must not come back with an agent of empty files.
absl::Status CopyTree(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (!fs::create_directory(to, from, ec)) {
    // Existing already: another installer's, however unlikely; never write into it.
    if (!ec) ec = std::make_error_code(std::errc::file_exists);
    return FromErrorCode(absl::StrCat("cannot create ", to.string()), ec);
  }
  for (auto it = fs::recursive_directory_iterator(from, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path target = to / it->path().lexically_relative(from);
    const fs::file_status status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_symlink(status)) {
      fs::copy_symlink(it->path(), target, ec);
    } else if (fs::is_directory(status)) {
      fs::create_directory(target, it->path(), ec);
    } else if (fs::is_regular_file(status)) {
      fs::copy_file(it->path(), target, ec);
      if (!ec) {
        if (absl::Status st = SyncPath(target, O_RDONLY); !st.ok()) return st;
      }
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat(it->path().string(), " is neither a file, a directory nor a symlink"));
    }
    if (ec) return FromErrorCode(absl::StrCat("cannot copy to ", target.string()), ec);
  }
  if (ec) return FromErrorCode(absl::StrCat("cannot read ", from.string()), ec);
  return absl::OkStatus();
}

// Two installers on one node (two DaemonSets naming one path) are both pid 1 in their
// containers, but do not start in the same nanosecond; CopyTree refuses an existing directory.
std::string UniqueSuffix() {
  uint64_t nanos = static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch() / std::chrono::nanoseconds(1));
  return absl::StrFormat("%x-%x", static_cast<uint32_t>(::getpid()), nanos);
}

}  // namespace

nlohmann::json AgentDaemonSet(const AgentDaemonSetOptions& options) {
  const fs::path host_path(options.agent_host_path);
  const std::string parent = host_path.parent_path().string();
  const std::string target =
      absl::StrCat(kHostParentMount, "/", host_path.filename().string());
  // Not app.kubernetes.io/managed-by=shoal, which marks a job's objects (Shoal creates and
  // deletes those); this one is the administrator's, applied with kubectl.
  const nlohmann::json labels = {{"app.kubernetes.io/name", kAgentDaemonSetName},
                                 {"app.kubernetes.io/component", "agent-installer"}};
  nlohmann::json meta = {{"name", kAgentDaemonSetName},
                         {"labels", labels},
                         {"annotations", {{"shoal.io/agent-host-path", options.agent_host_path}}}};
  if (!options.ns.empty()) meta["namespace"] = options.ns;

  nlohmann::json install = {
      {"name", "install"},
      {"image", options.agent_image},
      {"imagePullPolicy", "IfNotPresent"},
      // The agent image's own shoal, with its own loader and libraries: no shell needed.
      {"command",
       {absl::StrCat(kAgentMountPath, "/bin/shoal"), "kubernetes", "agent-install", "--from",
        kAgentMountPath, "--to", target}},
      {"volumeMounts", {{{"name", "host"}, {"mountPath", kHostParentMount}}}},
      {"resources", {{"requests", {{"cpu", "10m"}, {"memory", "32Mi"}}}}}};
  nlohmann::json hold = {
      {"name", "pause"},
      {"image", options.pause_image},
      {"imagePullPolicy", "IfNotPresent"},
      {"resources",
       {{"requests", {{"cpu", "1m"}, {"memory", "8Mi"}}},
        {"limits", {{"cpu", "10m"}, {"memory", "16Mi"}}}}}};
  nlohmann::json pod_spec = {
      {"initContainers", nlohmann::json::array({install})},
      {"containers", nlohmann::json::array({hold})},
      {"volumes",
       {{{"name", "host"}, {"hostPath", {{"path", parent}, {"type", "DirectoryOrCreate"}}}}}},
      // Every node runs Shoal's pods, whatever its taints; one per node, so a Job's pods on a
      // tainted GPU node find their agent too.
      {"tolerations", {{{"operator", "Exists"}}}},
      {"automountServiceAccountToken", false},
      {"enableServiceLinks", false},
      {"terminationGracePeriodSeconds", 1}};
  return {{"apiVersion", "apps/v1"},
          {"kind", "DaemonSet"},
          {"metadata", meta},
          {"spec",
           {{"selector", {{"matchLabels", labels}}},
            {"updateStrategy", {{"type", "RollingUpdate"}}},
            {"template", {{"metadata", {{"labels", labels}}}, {"spec", pod_spec}}}}}};
}

absl::Status InstallAgent(const std::string& from_text, const std::string& to_text,
                          std::string* what_happened) {
  const fs::path from(from_text);
  const fs::path to(to_text);
  std::error_code ec;
  if (!fs::is_directory(from, ec)) {
    return absl::NotFoundError(absl::StrCat("--from ", from_text, " is not a directory"));
  }
  if (!fs::exists(from / "bin" / "shoal", ec)) {
    return absl::NotFoundError(absl::StrCat("--from ", from_text,
                                            " holds no bin/shoal: not an agent directory"));
  }
  const fs::file_status existing = fs::symlink_status(to, ec);
  const bool replacing = fs::exists(existing);
  if (replacing && !fs::is_directory(existing)) {
    return absl::FailedPreconditionError(
        absl::StrCat(to_text, " exists and is not a directory; remove it or choose another "
                              "agent host path"));
  }
  if (replacing && SameTree(from, to)) {
    if (what_happened) *what_happened = absl::StrCat(to_text, " already holds this agent");
    return absl::OkStatus();
  }
  const fs::path fresh = absl::StrCat(to_text, ".tmp-", UniqueSuffix());
  if (absl::Status st = CopyTree(from, fresh); !st.ok()) {
    fs::remove_all(fresh, ec);
    return st;
  }
  const fs::path previous = absl::StrCat(to_text, ".previous");
  if (!replacing) {
    if (::rename(fresh.c_str(), to.c_str()) != 0) {
      absl::Status st = Errno(absl::StrCat("cannot rename ", fresh.string(), " to ", to_text));
      fs::remove_all(fresh, ec);
      return st;
    }
  } else if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    // `fresh` now names the old copy.
    fs::remove_all(previous, ec);
    if (::rename(fresh.c_str(), previous.c_str()) != 0) {
      return Errno(absl::StrCat("installed, but cannot keep the old agent as ",
                                previous.string()));
    }
  } else if (errno == EINVAL || errno == ENOSYS) {
    // A filesystem without RENAME_EXCHANGE: `to` is absent between the two renames; a pod whose
    // mount falls in between fails to start and is retried by the kubelet.
    fs::remove_all(previous, ec);
    if (::rename(to.c_str(), previous.c_str()) != 0 ||
        ::rename(fresh.c_str(), to.c_str()) != 0) {
      absl::Status st = Errno(absl::StrCat("cannot move ", fresh.string(), " to ", to_text));
      fs::remove_all(fresh, ec);
      return st;
    }
  } else {
    absl::Status st = Errno(absl::StrCat("cannot exchange ", fresh.string(), " and ", to_text));
    fs::remove_all(fresh, ec);
    return st;
  }
  if (absl::Status st = SyncPath(to.parent_path().empty() ? "." : to.parent_path(),
                                 O_RDONLY | O_DIRECTORY);
      !st.ok()) {
    return st;
  }
  if (what_happened) {
    *what_happened = replacing ? absl::StrCat("replaced the agent in ", to_text, " (the old one is ",
                                              previous.string(), ")")
                               : absl::StrCat("installed the agent in ", to_text);
  }
  return absl::OkStatus();
}

}  // namespace shoal::backends
