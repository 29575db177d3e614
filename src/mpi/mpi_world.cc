#include "mpi/mpi_world.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace shoal::mpi {
namespace {

constexpr char kWorkerRole[] = "worker";

absl::StatusOr<nlohmann::json> ParseTasks(const std::string& cluster_json) {
  nlohmann::json doc = nlohmann::json::parse(cluster_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("tasks") ||
      !doc["tasks"].is_array()) {
    return absl::InvalidArgumentError("the cluster spec is not Shoal's cluster JSON (no tasks)");
  }
  return doc["tasks"];
}

absl::StatusOr<MpiHost> HostOf(const nlohmann::json& t) {
  if (!t.is_object() || !t.contains("index") || !t["index"].is_number_unsigned() ||
      !t.contains("address") || !t["address"].is_string() || !t.contains("port") ||
      !t["port"].is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed task in the cluster spec: ",
                                                   t.dump()));
  }
  MpiHost h;
  h.index = t["index"].get<uint32_t>();
  h.alias = HostAlias(h.index);
  h.address = t["address"].get<std::string>();
  h.port = t["port"].get<uint32_t>();
  return h;
}

}  // namespace

std::string HostAlias(uint32_t index) { return absl::StrCat("shoal-worker-", index); }

absl::StatusOr<std::vector<MpiHost>> WorkerHosts(const std::string& cluster_json) {
  auto tasks = ParseTasks(cluster_json);
  if (!tasks.ok()) return tasks.status();
  std::vector<MpiHost> hosts;
  for (const auto& t : *tasks) {
    if (!t.is_object() || t.value("role", "") != kWorkerRole) continue;
    auto h = HostOf(t);
    if (!h.ok()) return h.status();
    hosts.push_back(*h);
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError("the cluster spec has no worker tasks to run ranks on");
  }
  std::sort(hosts.begin(), hosts.end(),
            [](const MpiHost& a, const MpiHost& b) { return a.index < b.index; });
  return hosts;
}

absl::StatusOr<MpiHost> FindTask(const std::string& cluster_json, const std::string& role,
                                 uint32_t index) {
  auto tasks = ParseTasks(cluster_json);
  if (!tasks.ok()) return tasks.status();
  for (const auto& t : *tasks) {
    if (!t.is_object() || t.value("role", "") != role) continue;
    auto h = HostOf(t);
    if (!h.ok()) return h.status();
    if (h->index == index) return h;
  }
  return absl::NotFoundError(absl::StrCat("task ", role, ":", index, " is not in the cluster spec"));
}

std::string Hostfile(const std::vector<MpiHost>& hosts, uint32_t slots_per_worker) {
  std::string out;
  for (const auto& h : hosts) absl::StrAppend(&out, h.alias, " slots=", slots_per_worker, "\n");
  return out;
}

std::vector<std::string> LauncherArgv(const std::vector<std::string>& command, uint32_t ranks) {
  if (!command.empty()) {
    std::string base = command[0].substr(command[0].find_last_of('/') + 1);
    if (base == "mpirun" || base == "mpiexec" || base == "orterun") return command;
  }
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(ranks), "--bind-to", "none"};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::string EncodeRequest(const RshRequest& request) {
  return nlohmann::json{{"secret", request.secret}, {"command", request.command}}.dump() + "\n";
}

absl::StatusOr<RshRequest> DecodeRequest(const std::string& line) {
  nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("secret") ||
      !doc["secret"].is_string() || !doc.contains("command") || !doc["command"].is_string()) {
    return absl::InvalidArgumentError("expected one JSON line {\"secret\": ..., \"command\": ...}");
  }
  RshRequest r;
  r.secret = doc["secret"].get<std::string>();
  r.command = doc["command"].get<std::string>();
  if (r.command.empty()) return absl::InvalidArgumentError("the command is empty");
  return r;
}

bool SecretsEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace shoal::mpi
