#include "master/parquet_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "common/webhdfs.h"

namespace shoal::master {
namespace {

constexpr char kMagic[] = "PAR1";
// The magic at both ends and the footer's length between: the smallest Parquet file.
constexpr off_t kMinParquetSize = 12;

// What a Spark directory holds beside its data: `_SUCCESS`, `_metadata`, `.part-*.crc`.
bool IsDataFileName(const std::string& name) {
  return !name.empty() && name[0] != '.' && name[0] != '_' && !absl::EndsWith(name, ".crc");
}

// OK when `path` begins and ends with the Parquet magic; FailedPrecondition saying why not.
absl::Status CheckLocalParquet(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  }
  char head[4] = {}, tail[4] = {};
  bool parquet = st.st_size >= kMinParquetSize && ::pread(fd.get(), head, 4, 0) == 4 &&
                 ::pread(fd.get(), tail, 4, st.st_size - 4) == 4 &&
                 std::memcmp(head, kMagic, 4) == 0 && std::memcmp(tail, kMagic, 4) == 0;
  if (!parquet) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not a Parquet file (a Parquet file begins and ends with PAR1; this one has ",
        st.st_size, " bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListLocal(const std::string& location) {
  struct stat st {};
  if (::stat(location.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(location, " does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("stat ", location, ": ", std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) {
    if (auto s = CheckLocalParquet(location); !s.ok()) return s;
    return std::vector<std::string>{location};
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(location, " is neither a Parquet file nor a directory of them"));
  }
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(location, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!IsDataFileName(name)) continue;
    std::error_code type_ec;
    if (it->is_directory(type_ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          location, " holds the directory ", name,
          ": partitioned Parquet datasets (partitionBy) are not read; write the dataset "
          "without partitionBy, or name one partition's directory"));
    }
    names.push_back(std::move(name));
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list ", location, ": ", ec.message()));
  }
  if (names.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(location,
                     " holds no Parquet files (hidden and _-prefixed files such as "
                     "_SUCCESS are not data)"));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> files;
  for (const std::string& name : names) {
    std::string path = absl::StrCat(location, "/", name);
    if (auto s = CheckLocalParquet(path); !s.ok()) return s;
    files.push_back(std::move(path));
  }
  return files;
}

absl::StatusOr<std::vector<std::string>> ListHdfs(const std::string& location,
                                                  const std::string& webhdfs) {
  absl::StatusOr<common::HdfsLocation> where = common::ParseHdfsLocation(location, webhdfs);
  if (!where.ok()) return where.status();
  common::WebHdfs fs(where->webhdfs, where->user);
  // LISTSTATUS of a file answers the file itself, with an empty name.
  absl::StatusOr<std::vector<common::HdfsEntry>> entries = fs.List(where->path);
  if (!entries.ok()) {
    if (absl::IsNotFound(entries.status())) {
      return absl::NotFoundError(
          absl::StrCat(location, " does not exist (", entries.status().message(), ")"));
    }
    return entries.status();
  }
  auto not_parquet = [&](const std::string& uri) {
    return absl::FailedPreconditionError(absl::StrCat(
        uri,
        " is not a Parquet file: over WebHDFS a Parquet file is one whose name ends in "
        ".parquet"));
  };
  if (entries->size() == 1 && (*entries)[0].name.empty() && !(*entries)[0].directory) {
    if (!absl::EndsWith(where->path, ".parquet")) return not_parquet(location);
    return std::vector<std::string>{where->uri};
  }
  std::vector<std::string> names;
  for (const common::HdfsEntry& entry : *entries) {
    if (!IsDataFileName(entry.name)) continue;
    if (entry.directory) {
      return absl::FailedPreconditionError(absl::StrCat(
          location, " holds the directory ", entry.name,
          ": partitioned Parquet datasets (partitionBy) are not read; write the dataset "
          "without partitionBy, or name one partition's directory"));
    }
    if (!absl::EndsWith(entry.name, ".parquet")) {
      return not_parquet(absl::StrCat(where->uri, "/", entry.name));
    }
    names.push_back(entry.name);
  }
  if (names.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(location,
                     " holds no Parquet files (hidden and _-prefixed files such as "
                     "_SUCCESS are not data)"));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> files;
  for (const std::string& name : names) files.push_back(absl::StrCat(where->uri, "/", name));
  return files;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListParquetDataset(const std::string& location,
                                                            const std::string& webhdfs) {
  if (absl::StartsWith(location, "hdfs://")) return ListHdfs(location, webhdfs);
  return ListLocal(location);
}

}  // namespace shoal::master
