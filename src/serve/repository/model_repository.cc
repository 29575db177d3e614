#include "serve/repository/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serve/repository/model_config.h"

namespace shoal::serve {
namespace {

namespace fs = std::filesystem;

bool IsServableName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

std::optional<int64_t> ParseVersion(const std::string& name) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      })) {
    return std::nullopt;
  }
  int64_t version = 0;
  if (!absl::SimpleAtoi(name, &version) || version < 1) return std::nullopt;
  // "01" would be a second spelling of version 1.
  if (name != std::to_string(version)) return std::nullopt;
  return version;
}

// The entries of `dir`, sorted by name; the error names `dir`.
absl::StatusOr<std::vector<fs::directory_entry>> ListDir(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.string(), ": cannot list the directory: ", ec.message()));
  }
  std::vector<fs::directory_entry> entries;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    entries.push_back(*it);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.string(), ": cannot list the directory: ", ec.message()));
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.path().filename() < b.path().filename(); });
  return entries;
}

// "name size mtime_ns\n" for every file under `dir`, in a fixed order; an unreadable entry
// shows up as such, so that it changes the fingerprint when it becomes readable.
std::string Fingerprint(const fs::path& dir) {
  std::vector<std::string> lines;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec);
  if (ec) return absl::StrCat("unreadable: ", ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) {
      lines.push_back(absl::StrCat("unreadable: ", ec.message()));
      break;
    }
    std::error_code file_ec;
    if (!it->is_regular_file(file_ec)) continue;
    uintmax_t size = it->file_size(file_ec);
    auto mtime = it->last_write_time(file_ec);
    lines.push_back(absl::StrCat(fs::relative(it->path(), dir, file_ec).string(), " ", size, " ",
                                 mtime.time_since_epoch().count()));
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrJoin(lines, "\n");
}

bool IsDirectory(const fs::directory_entry& entry) {
  std::error_code ec;
  return entry.is_directory(ec);  // follows symlinks, as a repository of links should work
}

}  // namespace

absl::StatusOr<RepositoryScan> ScanModelRepository(const std::string& dir) {
  std::error_code ec;
  fs::file_status status = fs::status(dir, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat(
        "model repository ", dir, " does not exist", ec && ec != std::errc::no_such_file_or_directory
                                                         ? absl::StrCat(" (", ec.message(), ")")
                                                         : ""));
  }
  if (!fs::is_directory(status)) {
    return absl::FailedPreconditionError(
        absl::StrCat("model repository ", dir, " is not a directory"));
  }
  auto top = ListDir(dir);
  if (!top.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model repository ", dir, " is unreadable: ", top.status().message()));
  }
  RepositoryScan scan;
  for (const fs::directory_entry& entry : *top) {
    std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || !IsDirectory(entry)) continue;
    if (!IsServableName(name)) {
      scan.ignored.push_back(absl::StrCat(
          entry.path().string(),
          ": not a model name; model names use letters, digits, '_', '-' and '.'"));
      continue;
    }
    ModelEntry model;
    model.name = name;
    model.dir = entry.path().string();
    fs::path config = entry.path() / kModelConfigFileName;
    if (fs::exists(config, ec)) model.config_path = config.string();
    auto versions = ListDir(entry.path());
    if (!versions.ok()) {
      model.skipped_versions.push_back(std::string(versions.status().message()));
      scan.models.push_back(std::move(model));
      continue;
    }
    for (const fs::directory_entry& v : *versions) {
      std::string vname = v.path().filename().string();
      if (vname.empty() || vname[0] == '.' || !IsDirectory(v)) continue;
      std::optional<int64_t> number = ParseVersion(vname);
      if (!number) {
        model.skipped_versions.push_back(
            absl::StrCat(v.path().string(), ": not a version; version directories are integers >= 1 without leading zeros"));
        continue;
      }
      fs::path file = v.path() / kModelFileName;
      if (!fs::is_regular_file(file, ec)) {
        model.skipped_versions.push_back(
            absl::StrCat(v.path().string(), ": no ", kModelFileName, " in it"));
        continue;
      }
      model.versions.push_back({*number, file.string(), Fingerprint(v.path()),
                                fs::is_regular_file(v.path() / kVersionCompleteMarker, ec)});
    }
    // "10" sorts before "9" by name; versions are numbers.
    std::sort(model.versions.begin(), model.versions.end(),
              [](const VersionEntry& a, const VersionEntry& b) { return a.version < b.version; });
    scan.models.push_back(std::move(model));
  }
  return scan;
}

}  // namespace shoal::serve
