#include "agent/task_directories.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shoal::agent {
namespace {

// mkdir of `path` and every missing parent; 0 or the errno of the first step that failed.
// Existing components are only looked at, never made again: mkdir on an existing directory of
// a read-only or foreign filesystem may answer EROFS or EACCES rather than EEXIST.
int MakeDirectoryAndParents(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    std::string prefix = path.substr(0, end);
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return ENOTDIR;
    } else if (errno != ENOENT) {
      return errno;
    } else if (::mkdir(prefix.c_str(), 0777) != 0) {
      int err = errno;
      // Another task of the job on this node may have made it meanwhile.
      if (err != EEXIST) return err;
      if (::stat(prefix.c_str(), &st) != 0) return errno;
      if (!S_ISDIR(st.st_mode)) return ENOTDIR;
    }
    if (end == std::string::npos) return 0;
  }
}

}  // namespace

absl::Status MakeTaskDirectories(const std::map<std::string, std::string>& dirs) {
  for (const auto& [variable, path] : dirs) {
    auto failed = [&](const std::string& why) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create the directory '", path, "' named in ", variable, ": ", why));
    };
    if (path.empty() || path.front() != '/' || path.find('\0') != std::string::npos) {
      return failed("not an absolute path");
    }
    if (int err = MakeDirectoryAndParents(path); err != 0) {
      const char* name = ::strerrorname_np(err);
      return failed(absl::StrCat(std::strerror(err), " (", name != nullptr ? name : "errno",
                                 " ", err, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shoal::agent
