#include "backends/kubernetes/kubernetes_section.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"

namespace shoal::backends {
namespace {

constexpr absl::string_view kSectionKeys[] = {
    "namespace",   "image",          "image_pull_policy", "agent_image", "agent_host_path",
    "service_account",
    "node_selector", "tolerations",  "priority_class",    "labels",      "annotations",
    "host_network", "volumes",       "roles"};
constexpr absl::string_view kRoleKeys[] = {"image", "image_pull_policy", "volumes",
                                           "node_selector", "tolerations"};
constexpr absl::string_view kVolumeKeys[] = {"name",      "host_path",  "persistent_volume_claim",
                                             "config_map", "empty_dir", "mount_path",
                                             "read_only"};
constexpr absl::string_view kVolumeSources[] = {"host_path", "persistent_volume_claim",
                                                "config_map", "empty_dir"};
constexpr absl::string_view kEmptyDirKeys[] = {"medium", "size_limit"};
constexpr absl::string_view kTolerationKeys[] = {"key", "operator", "value", "effect",
                                                 "toleration_seconds"};
constexpr absl::string_view kEffects[] = {"NoSchedule", "PreferNoSchedule", "NoExecute"};

constexpr char kSectionForm[] =
    "the keys of docs/backends/kubernetes.md, e.g. {namespace: ml, image: train:1.2}";
constexpr char kVolumeForm[] =
    "volumes, each {name, host_path | persistent_volume_claim | config_map | empty_dir, "
    "mount_path, read_only}";
constexpr char kTolerationForm[] =
    "tolerations, each {key, operator, value, effect, toleration_seconds}";

bool IsLabelNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

bool IsLabelName(absl::string_view text) {
  if (text.empty() || text.size() > 63) return false;
  if (!absl::ascii_isalnum(static_cast<unsigned char>(text.front())) ||
      !absl::ascii_isalnum(static_cast<unsigned char>(text.back()))) {
    return false;
  }
  return std::all_of(text.begin(), text.end(), IsLabelNameChar);
}

std::optional<bool> ReadBool(spec::SectionReader& reader, absl::string_view key) {
  std::optional<std::string> text = reader.Text(key, "true or false");
  if (!text) return std::nullopt;
  if (*text == "true") return true;
  if (*text == "false") return false;
  reader.Error(key, absl::StrCat("must be true or false, got ", reader.Describe(key)));
  return std::nullopt;
}

// A key's text when it obeys `valid`; otherwise reported ("must be <form>, got ...").
std::optional<std::string> ReadChecked(spec::SectionReader& reader, absl::string_view key,
                                       bool (*valid)(absl::string_view), absl::string_view form) {
  std::optional<std::string> text = reader.Text(key, form);
  if (!text) return std::nullopt;
  if (!valid(*text)) {
    reader.Error(key, absl::StrCat("must be ", form, ", got ", reader.Describe(key)));
    return std::nullopt;
  }
  return text;
}

// A map of label-like keys to text (labels, annotations, node_selector).
std::map<std::string, std::string> ReadStringMap(spec::SectionReader& parent,
                                                 absl::string_view key, bool values_are_labels,
                                                 bool shoal_keys_allowed) {
  std::map<std::string, std::string> out;
  std::unique_ptr<spec::SectionReader> map = parent.Nested(key);
  if (map == nullptr) return out;
  if (!map->ExpectMap("keys and text values, e.g. {team: vision}")) return out;
  for (const std::string& k : map->Keys()) {
    if (!IsQualifiedName(k)) {
      map->Error(k, absl::StrCat("keys must be [prefix/]name with at most 63 letters, digits, "
                                 "'-', '_' and '.', e.g. example.com/team, got '",
                                 k, "'"));
      continue;
    }
    if (!shoal_keys_allowed && absl::StartsWith(k, kShoalLabelPrefix)) {
      map->Error(k, absl::StrCat("keys under ", kShoalLabelPrefix,
                                 " are Shoal's own (the job's id, role and place)"));
      continue;
    }
    std::optional<std::string> value = map->Text(k, "text");
    if (!value) continue;
    if (values_are_labels && !IsLabelValue(*value)) {
      map->Error(k, absl::StrCat("must be a label value: at most 63 letters, digits, '-', '_' "
                                 "and '.', starting and ending with a letter or digit, got ",
                                 map->Describe(k)));
      continue;
    }
    out[k] = *value;
  }
  return out;
}

std::vector<KubeToleration> ReadTolerations(spec::SectionReader& parent) {
  std::vector<KubeToleration> out;
  for (std::unique_ptr<spec::SectionReader>& item : parent.Items("tolerations", kTolerationForm)) {
    if (!item->ExpectMap("key, operator, value, effect and/or toleration_seconds")) continue;
    item->AcceptKeys(kTolerationKeys);
    KubeToleration t;
    if (auto key = item->Text("key", "a taint key")) {
      if (!IsQualifiedName(*key)) {
        item->Error("key", absl::StrCat("must be a taint key such as nvidia.com/gpu, got ",
                                        item->Describe("key")));
      } else {
        t.key = *key;
      }
    }
    t.op = item->Text("operator", "Equal or Exists").value_or("Equal");
    if (t.op != "Equal" && t.op != "Exists") {
      item->Error("operator",
                  absl::StrCat("must be Equal or Exists, got ", item->Describe("operator")));
    }
    if (auto value = item->Text("value", "a taint value")) {
      if (t.op == "Exists") {
        item->Error("value", "must not be given with operator Exists");
      } else {
        t.value = *value;
      }
    }
    if (t.op == "Equal" && t.key.empty() && item->Has("key") == false) {
      item->Error("key", "required with operator Equal; use operator: Exists to tolerate "
                         "every taint");
    }
    if (auto effect = item->Text("effect", "a taint effect")) {
      if (std::find(std::begin(kEffects), std::end(kEffects), *effect) == std::end(kEffects)) {
        item->Error("effect", absl::StrCat("must be one of NoSchedule, PreferNoSchedule, "
                                           "NoExecute, got ",
                                           item->Describe("effect")));
      } else {
        t.effect = *effect;
      }
    }
    if (auto seconds = item->Text("toleration_seconds", "a whole number of seconds")) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(*seconds, &n) || n < 0) {
        item->Error("toleration_seconds",
                    absl::StrCat("must be a whole number of seconds, 0 or more, got ",
                                 item->Describe("toleration_seconds")));
      } else if (t.effect != "NoExecute") {
        item->Error("toleration_seconds", "only applies with effect: NoExecute");
      } else {
        t.toleration_seconds = n;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<KubeVolume> ReadVolumes(spec::SectionReader& parent) {
  std::vector<KubeVolume> out;
  std::set<std::string> names;
  std::set<std::string> mount_paths;
  for (std::unique_ptr<spec::SectionReader>& item : parent.Items("volumes", kVolumeForm)) {
    if (!item->ExpectMap(
            "name, one of host_path, persistent_volume_claim, config_map, empty_dir, and "
            "mount_path, e.g. {name: data, host_path: /data, mount_path: /data}")) {
      continue;
    }
    item->AcceptKeys(kVolumeKeys);
    KubeVolume v;
    bool ok = true;
    if (auto name = ReadChecked(*item, "name", IsDnsLabel,
                                "a volume name: at most 63 lowercase letters, digits and '-'")) {
      if (!names.insert(*name).second) {
        item->Error("name", absl::StrCat("volume '", *name, "' is defined twice; names must "
                                         "be unique"));
        ok = false;
      }
      v.name = *name;
    } else {
      if (!item->Has("name")) item->Error("name", "required, e.g. name: data");
      ok = false;
    }
    std::vector<std::string> sources;
    for (absl::string_view s : kVolumeSources) {
      if (item->Has(s)) sources.emplace_back(s);
    }
    if (sources.size() != 1) {
      item->Error(sources.empty() ? "name" : sources[1],
                  sources.empty()
                      ? "needs one source: host_path, persistent_volume_claim, config_map or "
                        "empty_dir"
                      : absl::StrCat("has more than one source (", absl::StrJoin(sources, ", "),
                                     "); give one"));
      ok = false;
    } else if (sources[0] == "host_path") {
      v.source = KubeVolume::Source::kHostPath;
      if (auto path = item->Text("host_path", "an absolute path on the node")) {
        if (!absl::StartsWith(*path, "/")) {
          item->Error("host_path", absl::StrCat("must be an absolute path on the node, got ",
                                                item->Describe("host_path")));
          ok = false;
        }
        v.source_name = *path;
      } else {
        ok = false;
      }
    } else if (sources[0] == "persistent_volume_claim" || sources[0] == "config_map") {
      v.source = sources[0] == "config_map" ? KubeVolume::Source::kConfigMap
                                            : KubeVolume::Source::kPersistentVolumeClaim;
      if (auto name = ReadChecked(*item, sources[0], IsDnsSubdomain, kObjectNameForm)) {
        v.source_name = *name;
      } else {
        ok = false;
      }
    } else {
      v.source = KubeVolume::Source::kEmptyDir;
      std::unique_ptr<spec::SectionReader> empty = item->Nested("empty_dir");
      if (empty->ExpectMap("medium and/or size_limit, or {} for the node's disk, e.g. "
                           "{medium: Memory, size_limit: 1GiB}")) {
        empty->AcceptKeys(kEmptyDirKeys);
        if (auto medium = empty->Text("medium", "Memory, or nothing for the node's disk")) {
          if (*medium != "Memory") {
            empty->Error("medium", absl::StrCat("must be Memory (or left out for the node's "
                                                "disk), got ",
                                                empty->Describe("medium")));
            ok = false;
          }
          v.empty_dir_medium = *medium;
        }
        if (auto size = empty->Text("size_limit", "a size such as 1GiB")) {
          absl::StatusOr<uint64_t> bytes = ParseByteSize(*size);
          if (!bytes.ok() || *bytes == 0) {
            empty->Error("size_limit", absl::StrCat("must be a size such as 512MiB or 1GiB, got ",
                                                    empty->Describe("size_limit")));
            ok = false;
          } else {
            v.size_limit = *bytes;
          }
        }
      } else {
        ok = false;
      }
    }
    if (auto path = item->Text("mount_path", "an absolute path in the container")) {
      if (!absl::StartsWith(*path, "/")) {
        item->Error("mount_path", absl::StrCat("must be an absolute path in the container, got ",
                                               item->Describe("mount_path")));
        ok = false;
      } else if (*path == kAgentMountPath ||
                 absl::StartsWith(*path, absl::StrCat(kAgentMountPath, "/"))) {
        item->Error("mount_path", absl::StrCat(kAgentMountPath,
                                               " is where Shoal mounts its agent; choose "
                                               "another path"));
        ok = false;
      } else if (!mount_paths.insert(*path).second) {
        item->Error("mount_path",
                    absl::StrCat("two volumes are mounted at ", *path, "; give each its own"));
        ok = false;
      }
      v.mount_path = *path;
    } else {
      if (!item->Has("mount_path")) {
        item->Error("mount_path", "required: where the volume appears in the container");
      }
      ok = false;
    }
    if (auto read_only = ReadBool(*item, "read_only")) v.read_only = *read_only;
    if (ok) out.push_back(std::move(v));
  }
  return out;
}

void ReadRoles(spec::SectionReader& section, KubernetesConfig& out) {
  std::unique_ptr<spec::SectionReader> roles = section.Nested("roles");
  if (roles == nullptr) return;
  if (!roles->ExpectMap("role names of the job, each with image, image_pull_policy, volumes, "
                        "node_selector and/or tolerations")) {
    return;
  }
  std::vector<std::string> defined = section.RoleNames();
  for (const std::string& role : roles->Keys()) {
    if (std::find(defined.begin(), defined.end(), role) == defined.end()) {
      roles->Error(role, absl::StrCat("no such role in roles; the job's roles are ",
                                      absl::StrJoin(defined, ", ")));
      continue;
    }
    std::unique_ptr<spec::SectionReader> r = roles->Nested(role);
    if (!r->ExpectMap("image, image_pull_policy, volumes, node_selector and/or tolerations")) {
      continue;
    }
    r->AcceptKeys(kRoleKeys);
    KubeRoleSettings settings;
    settings.image = ReadChecked(*r, "image", IsImageReference, kImageForm);
    settings.image_pull_policy =
        ReadChecked(*r, "image_pull_policy", IsPullPolicy, kPullPolicyForm);
    settings.volumes = ReadVolumes(*r);
    // The pod would have two volumes of one name, or two at one path.
    for (const KubeVolume& v : settings.volumes) {
      for (const KubeVolume& common : out.volumes) {
        if (v.name == common.name || v.mount_path == common.mount_path) {
          r->Error("volumes", absl::StrCat("volume '", v.name, "' at ", v.mount_path,
                                           " clashes with kubernetes.volumes' '", common.name,
                                           "' at ", common.mount_path,
                                           "; give it its own name and path"));
        }
      }
    }
    settings.node_selector = ReadStringMap(*r, "node_selector", true, true);
    settings.tolerations = ReadTolerations(*r);
    out.roles[role] = std::move(settings);
  }
}

std::shared_ptr<const spec::SectionValue> ParseKubernetesSection(spec::SectionReader& section) {
  auto out = std::make_shared<KubernetesConfig>();
  if (!section.ExpectMap(kSectionForm)) return out;
  section.AcceptKeys(kSectionKeys);
  out->namespace_ = ReadChecked(section, "namespace", IsDnsLabel, kNamespaceForm).value_or("");
  out->image = ReadChecked(section, "image", IsImageReference, kImageForm).value_or("");
  out->image_pull_policy =
      ReadChecked(section, "image_pull_policy", IsPullPolicy, kPullPolicyForm).value_or("");
  out->agent_image =
      ReadChecked(section, "agent_image", IsImageReference, kImageForm).value_or("");
  out->agent_host_path =
      ReadChecked(section, "agent_host_path", IsAgentHostPath, kAgentHostPathForm).value_or("");
  out->service_account =
      ReadChecked(section, "service_account", IsDnsSubdomain, kObjectNameForm).value_or("");
  out->priority_class =
      ReadChecked(section, "priority_class", IsDnsSubdomain, kObjectNameForm).value_or("");
  out->node_selector = ReadStringMap(section, "node_selector", true, true);
  out->tolerations = ReadTolerations(section);
  out->labels = ReadStringMap(section, "labels", true, false);
  out->annotations = ReadStringMap(section, "annotations", false, true);
  if (auto host_network = ReadBool(section, "host_network")) out->host_network = *host_network;
  out->volumes = ReadVolumes(section);
  ReadRoles(section, *out);
  return out;
}

}  // namespace

bool IsDnsLabel(absl::string_view text) {
  if (text.empty() || text.size() > 63) return false;
  auto ok = [](char c) { return absl::ascii_islower(static_cast<unsigned char>(c)) ||
                                absl::ascii_isdigit(static_cast<unsigned char>(c)); };
  if (!ok(text.front()) || !ok(text.back())) return false;
  return std::all_of(text.begin(), text.end(), [&](char c) { return ok(c) || c == '-'; });
}

bool IsDnsSubdomain(absl::string_view text) {
  if (text.empty() || text.size() > 253) return false;
  for (absl::string_view part : absl::StrSplit(text, '.')) {
    if (part.empty()) return false;
    auto ok = [](char c) { return absl::ascii_islower(static_cast<unsigned char>(c)) ||
                                  absl::ascii_isdigit(static_cast<unsigned char>(c)); };
    if (!ok(part.front()) || !ok(part.back())) return false;
    if (!std::all_of(part.begin(), part.end(), [&](char c) { return ok(c) || c == '-'; })) {
      return false;
    }
  }
  return true;
}

bool IsImageReference(absl::string_view text) {
  if (text.empty() || text.size() > 1024) return false;
  return std::none_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isspace(static_cast<unsigned char>(c)) ||
           absl::ascii_iscntrl(static_cast<unsigned char>(c));
  });
}

bool IsPullPolicy(absl::string_view text) {
  return text == "Always" || text == "IfNotPresent" || text == "Never";
}

bool IsAgentHostPath(absl::string_view text) {
  // The DaemonSet installs beside it, in its parent: the root has none.
  if (text.size() < 2 || text.front() != '/' || text.back() == '/') return false;
  if (absl::StrContains(text, "//")) return false;
  for (absl::string_view part : absl::StrSplit(text.substr(1), '/')) {
    if (part == "." || part == "..") return false;
  }
  return std::none_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_iscntrl(static_cast<unsigned char>(c));
  });
}

bool IsQualifiedName(absl::string_view text) {
  size_t slash = text.find('/');
  if (slash == absl::string_view::npos) return IsLabelName(text);
  absl::string_view prefix = text.substr(0, slash);
  absl::string_view name = text.substr(slash + 1);
  return IsDnsSubdomain(prefix) && IsLabelName(name);
}

bool IsLabelValue(absl::string_view text) { return text.empty() || IsLabelName(text); }

spec::JobSection KubernetesJobSection() { return {"kubernetes", ParseKubernetesSection}; }

const KubernetesConfig& KubernetesConfigOf(const spec::JobSpec& job) {
  static const KubernetesConfig kDefaults;
  const KubernetesConfig* written = job.Section<KubernetesConfig>("kubernetes");
  return written != nullptr ? *written : kDefaults;
}

}  // namespace shoal::backends
