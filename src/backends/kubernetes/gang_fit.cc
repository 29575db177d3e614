#include "backends/kubernetes/gang_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shoal::backends {
namespace {

const nlohmann::json& Field(const nlohmann::json& object, const char* key) {
  static const nlohmann::json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string Str(const nlohmann::json& object, const char* key) {
  const nlohmann::json& v = Field(object, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

std::optional<int64_t> Quantity(const nlohmann::json& resources, const char* key,
                                int64_t scale) {
  const nlohmann::json& v = Field(resources, key);
  if (v.is_string()) return ParseQuantity(v.get<std::string>(), scale);
  if (v.is_number()) return static_cast<int64_t>(std::llround(v.get<double>() * scale));
  return std::nullopt;
}

PodRequest ContainerRequest(const nlohmann::json& container) {
  const nlohmann::json& resources = Field(container, "resources");
  const nlohmann::json& requests = Field(resources, "requests");
  const nlohmann::json& limits = Field(resources, "limits");
  // Kubernetes defaults a missing request to the limit.
  auto pick = [&](const char* key, int64_t scale) {
    if (auto q = Quantity(requests, key, scale)) return *q;
    return Quantity(limits, key, scale).value_or(0);
  };
  return {pick("cpu", 1000), pick("memory", 1), pick("nvidia.com/gpu", 1)};
}

struct NodeRoom {
  std::string name;
  PodRequest free;
  int64_t free_pods = 0;
  std::map<std::string, std::string> labels;
  std::vector<nlohmann::json> taints;  // NoSchedule and NoExecute only
};

bool Tolerates(const nlohmann::json& pod, const nlohmann::json& taint) {
  const nlohmann::json& tolerations = Field(Field(pod, "spec"), "tolerations");
  if (!tolerations.is_array()) return false;
  for (const nlohmann::json& t : tolerations) {
    std::string effect = Str(t, "effect");
    if (!effect.empty() && effect != Str(taint, "effect")) continue;
    std::string op = Str(t, "operator").empty() ? "Equal" : Str(t, "operator");
    std::string key = Str(t, "key");
    if (op == "Exists" && (key.empty() || key == Str(taint, "key"))) return true;
    if (op == "Equal" && key == Str(taint, "key") && Str(t, "value") == Str(taint, "value")) {
      return true;
    }
  }
  return false;
}

// Why `node` cannot take `pod`, in the scheduler's words ("Insufficient cpu"), or "".
std::string Refusal(const NodeRoom& node, const nlohmann::json& pod, const PodRequest& want) {
  const nlohmann::json& selector = Field(Field(pod, "spec"), "nodeSelector");
  if (selector.is_object()) {
    for (const auto& [key, value] : selector.items()) {
      auto it = node.labels.find(key);
      if (it == node.labels.end() || !value.is_string() || it->second != value.get<std::string>()) {
        return "node(s) didn't match Pod's node affinity/selector";
      }
    }
  }
  for (const nlohmann::json& taint : node.taints) {
    if (!Tolerates(pod, taint)) {
      return absl::StrCat("node(s) had untolerated taint {", Str(taint, "key"), ": ",
                          Str(taint, "value"), "}");
    }
  }
  if (node.free_pods < 1) return "Too many pods";
  if (node.free.milli_cpus < want.milli_cpus) return "Insufficient cpu";
  if (node.free.memory_bytes < want.memory_bytes) return "Insufficient memory";
  if (node.free.gpus < want.gpus) return "Insufficient nvidia.com/gpu";
  return "";
}

bool Admits(const NodeRoom& node, const nlohmann::json& pod, const PodRequest& want) {
  return Refusal(node, pod, want).empty();
}

std::string Cpus(int64_t milli) { return absl::StrFormat("%.2f cpus", milli / 1000.0); }
std::string Memory(int64_t bytes) { return absl::StrFormat("%.1f GiB", bytes / 1073741824.0); }

}  // namespace

std::optional<int64_t> ParseQuantity(absl::string_view text, int64_t scale) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return std::nullopt;
  struct Suffix {
    const char* text;
    double factor;
  };
  static const Suffix kSuffixes[] = {
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"Pi", 1125899906842624.0}, {"Ei", 1152921504606846976.0}, {"m", 1e-3}, {"k", 1e3},
      {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18}};
  double factor = 1;
  absl::string_view number = text;
  for (const Suffix& s : kSuffixes) {
    if (absl::EndsWith(text, s.text)) {
      factor = s.factor;
      number = text.substr(0, text.size() - std::string_view(s.text).size());
      break;
    }
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || value < 0 || !std::isfinite(value)) {
    return std::nullopt;
  }
  // Kubernetes rounds a fractional base unit up (a request of 0.5m cpu is 1m).
  return static_cast<int64_t>(std::ceil(value * factor * scale - 1e-9));
}

PodRequest RequestOf(const nlohmann::json& pod) {
  const nlohmann::json& spec = Field(pod, "spec");
  PodRequest sum;
  if (Field(spec, "containers").is_array()) {
    for (const nlohmann::json& c : Field(spec, "containers")) {
      PodRequest r = ContainerRequest(c);
      sum.milli_cpus += r.milli_cpus;
      sum.memory_bytes += r.memory_bytes;
      sum.gpus += r.gpus;
    }
  }
  if (Field(spec, "initContainers").is_array()) {
    for (const nlohmann::json& c : Field(spec, "initContainers")) {
      PodRequest r = ContainerRequest(c);
      sum.milli_cpus = std::max(sum.milli_cpus, r.milli_cpus);
      sum.memory_bytes = std::max(sum.memory_bytes, r.memory_bytes);
      sum.gpus = std::max(sum.gpus, r.gpus);
    }
  }
  return sum;
}

GangFit FitGang(const std::vector<nlohmann::json>& nodes, const std::vector<nlohmann::json>& bound,
                const std::vector<nlohmann::json>& gang) {
  std::vector<NodeRoom> rooms;
  std::map<std::string, size_t> by_name;
  for (const nlohmann::json& n : nodes) {
    const nlohmann::json& meta = Field(n, "metadata");
    const nlohmann::json& spec = Field(n, "spec");
    if (Field(spec, "unschedulable").is_boolean() && Field(spec, "unschedulable").get<bool>()) {
      continue;
    }
    const nlohmann::json& allocatable = Field(Field(n, "status"), "allocatable");
    NodeRoom room;
    room.name = Str(meta, "name");
    room.free = {Quantity(allocatable, "cpu", 1000).value_or(0),
                 Quantity(allocatable, "memory", 1).value_or(0),
                 Quantity(allocatable, "nvidia.com/gpu", 1).value_or(0)};
    room.free_pods = Quantity(allocatable, "pods", 1).value_or(110);
    if (Field(meta, "labels").is_object()) {
      for (const auto& [k, v] : Field(meta, "labels").items()) {
        if (v.is_string()) room.labels[k] = v.get<std::string>();
      }
    }
    if (Field(spec, "taints").is_array()) {
      for (const nlohmann::json& t : Field(spec, "taints")) {
        std::string effect = Str(t, "effect");
        if (effect == "NoSchedule" || effect == "NoExecute") room.taints.push_back(t);
      }
    }
    by_name[room.name] = rooms.size();
    rooms.push_back(std::move(room));
  }
  // The gang's priority (the API server fills spec.priority from priorityClassName): bound pods
  // of lower priority are room the scheduler will preempt for it.
  int64_t gang_priority = std::numeric_limits<int64_t>::max();
  for (const nlohmann::json& pod : gang) {
    const nlohmann::json& p = Field(Field(pod, "spec"), "priority");
    gang_priority = std::min<int64_t>(gang_priority, p.is_number() ? p.get<int64_t>() : 0);
  }
  for (const nlohmann::json& pod : bound) {
    auto it = by_name.find(Str(Field(pod, "spec"), "nodeName"));
    if (it == by_name.end()) continue;
    const nlohmann::json& p = Field(Field(pod, "spec"), "priority");
    if (!gang.empty() && (p.is_number() ? p.get<int64_t>() : 0) < gang_priority) continue;
    PodRequest r = RequestOf(pod);
    NodeRoom& room = rooms[it->second];
    room.free.milli_cpus -= r.milli_cpus;
    room.free.memory_bytes -= r.memory_bytes;
    room.free.gpus -= r.gpus;
    room.free_pods -= 1;
  }
  std::vector<NodeRoom> before = rooms;

  std::vector<size_t> order(gang.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<PodRequest> wants;
  for (const nlohmann::json& pod : gang) wants.push_back(RequestOf(pod));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (wants[a].gpus != wants[b].gpus) return wants[a].gpus > wants[b].gpus;
    return wants[a].milli_cpus > wants[b].milli_cpus;
  });
  GangFit out;
  out.nodes.assign(gang.size(), "");
  size_t placed = 0;
  std::string first_refused;  // the scheduler-style reasons for the first pod left over
  for (size_t i : order) {
    for (NodeRoom& room : rooms) {
      if (!Admits(room, gang[i], wants[i])) continue;
      room.free.milli_cpus -= wants[i].milli_cpus;
      room.free.memory_bytes -= wants[i].memory_bytes;
      room.free.gpus -= wants[i].gpus;
      room.free_pods -= 1;
      out.nodes[i] = room.name;
      ++placed;
      break;
    }
    if (out.nodes[i].empty() && first_refused.empty()) {
      std::map<std::string, int> reasons;
      for (const NodeRoom& room : rooms) ++reasons[Refusal(room, gang[i], wants[i])];
      std::vector<std::string> parts;
      for (const auto& [why, n] : reasons) parts.push_back(absl::StrCat(n, " ", why));
      first_refused = absl::StrCat("0/", rooms.size(), " nodes are available: ",
                                   absl::StrJoin(parts, ", "), ". ");
      if (rooms.empty()) first_refused = "no schedulable node. ";
    }
  }
  if (placed == gang.size()) {
    out.fits = true;
    return out;
  }
  out.nodes.clear();
  PodRequest total;
  for (const PodRequest& r : wants) {
    total.milli_cpus += r.milli_cpus;
    total.memory_bytes += r.memory_bytes;
    total.gpus += r.gpus;
  }
  std::vector<std::string> free;
  for (const NodeRoom& room : before) {
    std::string line = absl::StrCat(room.name, " ", Cpus(std::max<int64_t>(0, room.free.milli_cpus)),
                                    ", ", Memory(std::max<int64_t>(0, room.free.memory_bytes)));
    if (room.free.gpus > 0) absl::StrAppend(&line, ", ", room.free.gpus, " GPUs");
    free.push_back(line);
    if (free.size() == 3 && before.size() > 3) {
      free.push_back(absl::StrCat("and ", before.size() - 3, " more nodes"));
      break;
    }
  }
  out.reason = absl::StrCat(
      first_refused, "The gang of ", gang.size(), " pods (", Cpus(total.milli_cpus), ", ",
      Memory(total.memory_bytes), total.gpus > 0 ? absl::StrCat(", ", total.gpus, " GPUs") : "",
      " in all) does not fit now: ", placed, " of them would; free: ",
      free.empty() ? "no schedulable node" : absl::StrJoin(free, "; "));
  return out;
}

}  // namespace shoal::backends
