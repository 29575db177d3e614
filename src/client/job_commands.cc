// `shoal status`, `list`, `logs`, `kill`: read the job directory, and ask the master when it is
// alive (it knows more than the last status.json it wrote).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/job_directory.h"
#include "client/master_client.h"
#include "client/status_render.h"
#include "common/files.h"
#include "master/tensorboard_sidecar.h"
#include "nlohmann/json.hpp"
#include "process/process_launcher.h"
#include "spec/spec_parser.h"

namespace shoal::client {
namespace {

using Ms = std::chrono::milliseconds;

absl::StatusOr<std::string> Locate(const std::string& root, const std::string& job) {
  auto dir = FindJob(root, job);
  if (!dir.ok()) std::cerr << "shoal: " << dir.status().message() << "\n";
  return dir;
}

}  // namespace

int ShowStatus(const std::string& root, const std::string& job, bool json) {
  auto dir = Locate(root, job);
  if (!dir.ok()) return kExitUsage;
  auto status = CurrentStatus(*dir);
  if (json) {
    std::cout << status->dump(2) << "\n";
  } else {
    int64_t now_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    std::cout << StatusTable(*status, now_unix_ms);
  }
  return kExitOk;
}

int ListJobs(const std::string& root, bool json) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& dir : ListJobDirs(root)) {
    auto status = CurrentStatus(dir);
    nlohmann::json row = {{"job_id", status->value("job_id", "")},
                          {"name", status->value("name", "")},
                          {"state", status->value("state", "")},
                          {"reason", status->value("reason", "")},
                          {"tasks", status->value("tasks", nlohmann::json::array()).size()},
                          {"created_unix_ms", status->value("created_unix_ms", int64_t{0})},
                          {"job_dir", dir}};
    all.push_back(row);
  }
  if (json) {
    std::cout << all.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-44s %-10s %-6s %s\n", "JOB", "STATE", "TASKS", "REASON");
  for (const auto& r : all) {
    std::cout << absl::StrFormat("%-44s %-10s %-6d %s\n", r.value("job_id", ""),
                                 r.value("state", ""), r.value("tasks", 0), r.value("reason", ""));
  }
  return kExitOk;
}

int ShowLogs(const std::string& root, const std::string& job, const std::string& task, bool follow) {
  auto dir = Locate(root, job);
  if (!dir.ok()) return kExitUsage;
  std::string prefix = task.empty() ? "" : task + " | ";
  if (!task.empty()) {
    auto status = CurrentStatus(*dir);
    bool known = false;
    for (const auto& t : status->value("tasks", nlohmann::json::array())) {
      known |= t.value("task", "") == task;
    }
    if (!known) {
      std::cerr << "shoal: job " << job << " has no task '" << task
                << "'; tasks are named role:index, e.g. worker:0\n";
      return kExitUsage;
    }
  }
  std::ifstream in(*dir + "/logs.txt");
  std::string line, partial;
  auto emit = [&](const std::string& l) {
    if (prefix.empty()) {
      std::cout << l << "\n";
    } else if (absl::StartsWith(l, prefix)) {
      std::cout << l.substr(prefix.size()) << "\n";
    }
  };
  for (;;) {
    while (std::getline(in, line)) {
      if (in.eof()) {  // a line still being written: keep it for the next round
        partial += line;
        break;
      }
      emit(partial + line);
      partial.clear();
    }
    std::cout.flush();
    if (!follow) break;
    auto status = CurrentStatus(*dir);
    bool ended = IsTerminalState(status->value("state", "")) || status->value("state", "") == "lost";
    in.clear();
    if (ended) {
      // One more pass: the master flushes the last lines before it writes the final status.
      while (std::getline(in, line)) emit(partial + line), partial.clear();
      break;
    }
    std::this_thread::sleep_for(Ms(200));
  }
  if (!partial.empty()) emit(partial);
  return kExitOk;
}

int KillJob(const std::string& root, const std::string& job) {
  auto dir = Locate(root, job);
  if (!dir.ok()) return kExitUsage;
  auto info = ReadMasterInfo(*dir);
  if (!info || !info->alive) {
    auto status = CurrentStatus(*dir);
    std::cout << "job " << status->value("job_id", "") << " has already ended ("
              << status->value("state", "") << ")\n";
    return kExitOk;
  }
  auto client = MasterClient::Connect(*dir);
  absl::Status st = client.ok() ? (*client)->Kill("killed by `shoal kill`") : client.status();
  if (!st.ok() && absl::IsUnavailable(st)) {
    // The master ended between our look and the call: the job is over, which is what was asked.
    auto status = CurrentStatus(*dir);
    std::string state = status->value("state", "");
    if (IsTerminalState(state) || state == "lost") {
      std::cout << "job " << status->value("job_id", "") << " has already ended (" << state << ")\n";
      return kExitOk;
    }
  }
  if (!st.ok()) {
    std::cerr << "shoal: " << st.message() << "\n";
    return kExitJobFailed;
  }
  // Wait for the master to confirm every task is gone.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    auto status = CurrentStatus(*dir);
    std::string state = status->value("state", "");
    if (IsTerminalState(state) || state == "lost") {
      std::cout << "job " << status->value("job_id", "") << " " << state << "\n";
      return kExitOk;
    }
    std::this_thread::sleep_for(Ms(100));
  }
  std::cerr << "shoal: the master did not confirm the kill within 15s\n";
  return kExitJobFailed;
}

}  // namespace shoal::client

namespace shoal::client {

int ServeTensorBoard(const std::string& root, const std::string& job,
                     const spec::JobSections& sections) {
  auto dir = Locate(root, job);
  if (!dir.ok()) return kExitUsage;
  auto text = ReadFile(*dir + "/spec.yaml");
  auto submit_text = ReadFile(*dir + "/submit.json");
  if (!text.ok() || !submit_text.ok()) {
    std::cerr << "shoal: " << *dir << " has no spec.yaml or submit.json\n";
    return kExitUsage;
  }
  auto submit = nlohmann::json::parse(*submit_text, nullptr, false);
  std::string base = submit.is_object() ? submit.value("base_dir", *dir) : *dir;
  auto spec = spec::ParseJobSpec(*text, *dir + "/spec.yaml", base, sections);
  if (!spec.ok()) {
    std::cerr << "shoal: the job's spec.yaml no longer parses: " << spec.status().message() << "\n";
    return kExitUsage;
  }
  auto command = master::ResolveTensorBoardCommand(spec->tensorboard);
  if (!command.ok()) {
    std::cerr << "shoal: " << command.status().message() << "\n";
    return kExitUsage;
  }
  std::string logdir = master::TensorBoardLogdir(spec->tensorboard, *dir);
  std::error_code ec;
  bool has_logs = std::filesystem::is_directory(logdir, ec) &&
                  std::filesystem::recursive_directory_iterator(logdir, ec) !=
                      std::filesystem::recursive_directory_iterator();
  if (!spec->tensorboard.configured && !has_logs) {
    // Serving an empty directory would look like a TensorBoard with nothing to show yet.
    std::cerr << "shoal: job " << std::filesystem::path(*dir).filename().string()
              << " has no `tensorboard` section, so its tasks were given no TensorBoard "
                 "directory and "
              << logdir << " holds no logs; add `tensorboard: {}` to the job file (docs/job-spec.md)\n";
    return kExitUsage;
  }
  if (!has_logs) {
    std::cerr << "shoal | " << logdir
              << " holds no TensorBoard logs yet; they appear as the tasks write them\n";
  }
  std::vector<std::string> argv = *command;
  for (const char* a : {"--logdir", logdir.c_str(), "--host", "127.0.0.1", "--port", "0"}) {
    argv.emplace_back(a);
  }
  std::cerr << "shoal | TensorBoard over " << logdir << " (Ctrl-C stops it)\n";
  // TensorBoard prints its own URL; it is this command from here on.
  absl::Status replaced = process::ExecInPlace(argv);
  std::cerr << "shoal: " << replaced.message() << "\n";
  return kExitJobFailed;
}

}  // namespace shoal::client
