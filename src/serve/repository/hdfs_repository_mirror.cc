#include "serve/repository/hdfs_repository_mirror.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "serve/repository/model_repository.h"

namespace shoal::serve {
namespace {

namespace fs = std::filesystem;

bool IsHidden(const std::string& name) { return name.empty() || name[0] == '.'; }

bool IsVersionName(const std::string& name) {
  int64_t version = 0;
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isdigit(static_cast<unsigned char>(c));
         }) && absl::SimpleAtoi(name, &version) && version >= 1 && name == std::to_string(version);
}

std::string RandomSuffix() {
  static thread_local std::mt19937_64 random{std::random_device{}()};
  return absl::StrCat(random() & 0xffffffffu);
}

// Takes `path` out of the watcher's view in one rename (to a hidden name beside it), then
// deletes it.
absl::Status RemoveAtOnce(const fs::path& path) {
  fs::path hidden =
      path.parent_path() / absl::StrCat(".removing-", path.filename().string(), "-", RandomSuffix());
  std::error_code ec;
  fs::rename(path, hidden, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove ", path.string(), ": ", ec.message()));
  }
  fs::remove_all(hidden, ec);
  return absl::OkStatus();
}

std::vector<std::string> LocalNames(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

// The cache directory to use: `given` prepared (created, or emptied when an earlier mirror's),
// or a fresh temporary one. (directory, whether it is temporary).
absl::StatusOr<std::pair<std::string, bool>> PrepareCacheDir(const std::string& given) {
  std::error_code ec;
  if (given.empty()) {
    absl::StatusOr<std::string> made = MakeTemporaryDirectory("shoal-serve-hdfs-");
    if (!made.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot make a temporary directory for the copy of the repository: ",
          made.status().message()));
    }
    std::ofstream(fs::path(*made) / HdfsRepositoryMirror::kMarkerName).flush();
    return std::make_pair(*made, true);
  }
  fs::path dir = fs::absolute(given, ec);
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--repository-cache-dir ", given, ": cannot make the directory",
        ec ? absl::StrCat(": ", ec.message()) : std::string()));
  }
  std::vector<std::string> names = LocalNames(dir);
  bool ours = std::find(names.begin(), names.end(), HdfsRepositoryMirror::kMarkerName) !=
              names.end();
  if (!ours && !names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--repository-cache-dir ", given, " is neither empty nor an earlier copy of an hdfs:// "
        "repository (no ", HdfsRepositoryMirror::kMarkerName, "); shoal serve replaces what the "
        "directory holds, so give it an empty or new one"));
  }
  // What an earlier run copied may be stale or half-removed: start from nothing.
  for (const std::string& name : names) {
    if (name != HdfsRepositoryMirror::kMarkerName) fs::remove_all(dir / name, ec);
  }
  std::ofstream marker(dir / HdfsRepositoryMirror::kMarkerName);
  if (!marker) {
    return absl::InvalidArgumentError(
        absl::StrCat("--repository-cache-dir ", given, ": cannot write in it"));
  }
  return std::make_pair(dir.string(), false);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HdfsRepositoryMirror>> HdfsRepositoryMirror::Start(
    const HdfsMirrorOptions& options) {
  std::string webhdfs = options.webhdfs;
  if (webhdfs.empty()) {
    if (const char* env = std::getenv("SHOAL_WEBHDFS")) webhdfs = env;
  }
  absl::StatusOr<common::HdfsLocation> location = common::ParseHdfsLocation(options.uri, webhdfs);
  if (!location.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model-repository: ", location.status().message()));
  }
  absl::StatusOr<std::pair<std::string, bool>> cache = PrepareCacheDir(options.cache_dir);
  if (!cache.ok()) return cache.status();
  std::unique_ptr<HdfsRepositoryMirror> mirror(
      new HdfsRepositoryMirror(options, *location, cache->first, cache->second));
  if (absl::Status synced = mirror->Sync(); !synced.ok()) {
    std::string message(synced.message());
    if (absl::IsUnavailable(synced)) {
      message = absl::StrCat("the NameNode's WebHDFS at ", location->webhdfs,
                             " does not answer (", message, "); if its HTTP port is not 9870, "
                             "set SHOAL_WEBHDFS=http://HOST:PORT");
    }
    absl::Status failed(synced.code(),
                        absl::StrCat("--model-repository ", options.uri, ": ", message));
    return failed;  // the destructor removes a temporary cache directory
  }
  if (options.poll_interval.count() > 0) {
    mirror->thread_ = std::thread([raw = mirror.get()] { raw->Run(); });
  }
  return mirror;
}

HdfsRepositoryMirror::HdfsRepositoryMirror(HdfsMirrorOptions options,
                                           common::HdfsLocation location, std::string local_dir,
                                           bool temporary)
    : options_(std::move(options)),
      location_(std::move(location)),
      hdfs_(location_.webhdfs, location_.user),
      local_dir_(std::move(local_dir)),
      temporary_(temporary) {}

HdfsRepositoryMirror::~HdfsRepositoryMirror() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (temporary_) {
    std::error_code ec;
    fs::remove_all(local_dir_, ec);
  }
}

void HdfsRepositoryMirror::Run() {
  std::string last_error;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping),
                           absl::Milliseconds(options_.poll_interval.count()));
      if (stopping_) return;
    }
    absl::Status synced = Sync();
    if (!synced.ok()) {
      std::string error(synced.message());
      if (error != last_error) {
        std::cerr << "shoal serve: copying " << location_.uri << ": " << error
                  << " (the copy keeps serving as it is; trying again every "
                  << options_.poll_interval.count() << " ms)" << std::endl;
      }
      last_error = error;
      continue;
    }
    if (!last_error.empty()) {
      std::cerr << "shoal serve: copying " << location_.uri << " works again" << std::endl;
    }
    last_error.clear();
  }
}

absl::Status HdfsRepositoryMirror::Sync() {
  absl::StatusOr<std::vector<common::HdfsEntry>> entries = hdfs_.List(location_.path);
  if (!entries.ok()) return entries.status();
  std::set<std::string> models;
  for (const common::HdfsEntry& entry : *entries) {
    if (entry.directory && !IsHidden(entry.name)) models.insert(entry.name);
  }
  for (const std::string& name : LocalNames(local_dir_)) {
    if (IsHidden(name) || models.count(name) > 0) continue;
    if (absl::Status removed = RemoveAtOnce(fs::path(local_dir_) / name); !removed.ok()) {
      return removed;
    }
    configs_.erase(name);
    std::cerr << "shoal serve: " << location_.uri << "/" << name
              << " is gone from HDFS; its copy is removed" << std::endl;
  }
  for (const std::string& model : models) {
    if (absl::Status synced = SyncModel(model); !synced.ok()) return synced;
  }
  return absl::OkStatus();
}

absl::Status HdfsRepositoryMirror::SyncModel(const std::string& model) {
  const std::string hdfs_dir = absl::StrCat(location_.path, "/", model);
  absl::StatusOr<std::vector<common::HdfsEntry>> entries = hdfs_.List(hdfs_dir);
  if (absl::IsNotFound(entries.status())) return absl::OkStatus();  // removed since listed
  if (!entries.ok()) return entries.status();
  const common::HdfsEntry* config = nullptr;
  std::set<std::string> versions;
  for (const common::HdfsEntry& entry : *entries) {
    if (!entry.directory && entry.name == "config.yaml") config = &entry;
    if (entry.directory && IsVersionName(entry.name)) versions.insert(entry.name);
  }
  const fs::path local = fs::path(local_dir_) / model;
  std::error_code ec;
  // A model whose first publisher has only claimed a number yet: nothing to serve, and an empty
  // model directory would be refused (and logged) by the scan.
  if (config == nullptr && versions.empty() && !fs::exists(local, ec)) return absl::OkStatus();
  fs::create_directories(local, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", local.string(), ": ", ec.message()));
  }

  // The config first: a version published with a new config must not load under the old one.
  auto known = configs_.find(model);
  if (config == nullptr && known != configs_.end()) {
    fs::remove(local / "config.yaml", ec);
    configs_.erase(known);
  } else if (config != nullptr &&
             (known == configs_.end() ||
              known->second != std::make_pair(config->length, config->modification_time_ms))) {
    fs::path temp = local / absl::StrCat(".config.yaml.", RandomSuffix());
    absl::Status copied = hdfs_.Download(hdfs_dir + "/config.yaml", temp.string());
    if (copied.ok()) fs::rename(temp, local / "config.yaml", ec);
    if (!copied.ok() || ec) {
      fs::remove(temp, ec);
      return copied.ok() ? absl::FailedPreconditionError(absl::StrCat(
                               "cannot write ", (local / "config.yaml").string()))
                         : copied;
    }
    configs_[model] = {config->length, config->modification_time_ms};
  }

  for (const std::string& name : LocalNames(local)) {
    if (!IsVersionName(name) || versions.count(name) > 0) continue;
    if (absl::Status removed = RemoveAtOnce(local / name); !removed.ok()) return removed;
    std::cerr << "shoal serve: " << location_.uri << "/" << model << "/" << name
              << " is gone from HDFS; its copy is removed" << std::endl;
  }
  for (const std::string& version : versions) {
    if (fs::exists(local / version, ec)) continue;
    fs::path incoming = local / absl::StrCat(".download-", version, "-", RandomSuffix());
    absl::Status copied = CopyDirectory(absl::StrCat(hdfs_dir, "/", version), incoming.string());
    if (absl::IsNotFound(copied)) {  // pruned while being copied
      fs::remove_all(incoming, ec);
      continue;
    }
    if (copied.ok()) {
      // The copy is renamed in whole: the marker lets the watcher load it at once.
      std::ofstream(incoming / kVersionCompleteMarker).flush();
      fs::rename(incoming, local / version, ec);
    }
    if (!copied.ok() || ec) {
      fs::remove_all(incoming, ec);
      return copied.ok() ? absl::FailedPreconditionError(absl::StrCat(
                               "cannot rename the copy into ", (local / version).string()))
                         : copied;
    }
  }
  return absl::OkStatus();
}

absl::Status HdfsRepositoryMirror::CopyDirectory(const std::string& from, const std::string& to) {
  absl::StatusOr<std::vector<common::HdfsEntry>> entries = hdfs_.List(from);
  if (!entries.ok()) return entries.status();
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot make ", to, ": ", ec.message()));
  }
  for (const common::HdfsEntry& entry : *entries) {
    std::string source = absl::StrCat(from, "/", entry.name);
    std::string target = (fs::path(to) / entry.name).string();
    absl::Status copied =
        entry.directory ? CopyDirectory(source, target) : hdfs_.Download(source, target);
    if (!copied.ok()) return copied;
  }
  return absl::OkStatus();
}

}  // namespace shoal::serve
