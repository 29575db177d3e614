#include "client/job_directory.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/master_client.h"
#include "common/files.h"
#include "process/process.h"

namespace shoal::client {

std::string ResolveJobsRoot(const std::string& flag_value) {
  if (!flag_value.empty()) return std::filesystem::absolute(flag_value).string();
  if (const char* env = std::getenv("SHOAL_JOBS_DIR"); env && *env) {
    return std::filesystem::absolute(env).string();
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home && *home ? home : "/tmp", "/.shoal/jobs");
}

std::string NewJobId(const std::string& job_name) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  return absl::StrFormat("%s-%s-%04x", job_name, stamp, rd() & 0xffff);
}

absl::StatusOr<std::string> NewToken() {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open /dev/urandom", errno);
  unsigned char bytes[32];
  ssize_t n = ::read(fd, bytes, sizeof(bytes));
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof(bytes))) return absl::InternalError("short read from /dev/urandom");
  std::string hex;
  for (unsigned char b : bytes) hex += absl::StrFormat("%02x", b);
  return hex;
}

std::vector<std::string> ListJobDirs(const std::string& root) {
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    if (!e.is_directory() || e.path().filename().string().front() == '.') continue;
    if (!std::filesystem::exists(e.path() / "spec.yaml")) continue;
    dirs.emplace_back(std::filesystem::last_write_time(e.path() / "spec.yaml", ec), e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  std::vector<std::string> out;
  for (auto& [t, d] : dirs) out.push_back(d);
  return out;
}

absl::StatusOr<std::string> FindJob(const std::string& root, const std::string& job) {
  if (job.empty() || job.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", job, "' is not a job id"));
  }
  std::string exact = absl::StrCat(root, "/", job);
  if (std::filesystem::exists(exact + "/spec.yaml")) return exact;
  std::vector<std::string> matches;
  for (const auto& dir : ListJobDirs(root)) {
    if (absl::StartsWith(std::filesystem::path(dir).filename().string(), job)) matches.push_back(dir);
  }
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) {
    return absl::NotFoundError(absl::StrCat("no job '", job, "' under ", root,
                                            " (see `shoal list`)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("'", job, "' matches ", matches.size(),
                                                 " jobs; give more of the id"));
}

std::optional<MasterInfo> ReadMasterInfo(const std::string& job_dir) {
  auto text = ReadFile(job_dir + "/master.json");
  if (!text.ok()) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  MasterInfo info;
  info.address = j.value("address", "");
  info.pid = j.value("pid", 0);
  info.alive = ProcessRunning(info.pid, job_dir);
  return info;
}

std::optional<nlohmann::json> ReadStatusFile(const std::string& job_dir) {
  auto text = ReadFile(job_dir + "/status.json");
  if (!text.ok()) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

bool IsTerminalState(const std::string& s) {
  return s == "succeeded" || s == "failed" || s == "killed";
}

std::optional<nlohmann::json> CurrentStatus(const std::string& job_dir) {
  auto info = ReadMasterInfo(job_dir);
  if (info && info->alive) {
    if (auto client = MasterClient::Connect(job_dir); client.ok()) {
      if (auto st = (*client)->GetStatus(std::chrono::milliseconds(2000)); st.ok()) return *st;
    }
  }
  auto file = ReadStatusFile(job_dir);
  if (file && !IsTerminalState(file->value("state", "")) && !(info && info->alive)) {
    (*file)["state"] = "lost";
    (*file)["reason"] = "its master is no longer running (see master.log)";
  }
  if (!file) {
    nlohmann::json j = {{"job_id", std::filesystem::path(job_dir).filename().string()},
                        {"state", "unknown"},
                        {"reason", "no status written yet"},
                        {"tasks", nlohmann::json::array()}};
    return j;
  }
  return file;
}

}  // namespace shoal::client
