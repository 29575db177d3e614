#include "spec/job_file_parser.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "common/duration.h"
#include "spec/yaml_text.h"

namespace shoal::spec {

absl::StatusOr<JobSpec> JobFileParser::Parse(const std::string& text) {
  if (std::optional<TextSpot> deep = FindDeepNesting(text)) {
    return Refuse(absl::StrCat(source_, ":", deep->line, ":", deep->column,
                               ": invalid job file: maps and lists nest more than ", kMaxNesting,
                               " levels deep here; a job file needs only a few"));
  }
  YAML::Node root;
  DocumentCount documents;
  try {
    root = YAML::Load(text);
    documents = CountDocuments(text);
  } catch (const YAML::ParserException& e) {
    if (std::optional<TextSpot> tab = FindIndentTab(text, e.mark.line + 1)) {
      return Refuse(absl::StrCat(source_, ":", tab->line, ":", tab->column,
                                 ": invalid YAML: a tab is used for indentation; YAML allows "
                                 "only spaces there, so indent with spaces (the YAML parser "
                                 "stopped at line ",
                                 e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg,
                                 ")"));
    }
    return Refuse(absl::StrCat(source_, ":", e.mark.line + 1, ":", e.mark.column + 1,
                               ": invalid YAML: ", e.msg));
  } catch (const YAML::Exception& e) {
    return Refuse(absl::StrCat(source_, ": invalid YAML: ", e.msg));
  }
  if (documents.stuck_at) {
    return Refuse(absl::StrCat(source_, ":", documents.stuck_at->line + 1, ":",
                               documents.stuck_at->column + 1, ": invalid YAML: ",
                               documents.stuck_on));
  }
  if (documents.count > 1) {
    return Refuse(absl::StrCat(Where(source_, documents.second_line),
                               ": the job file holds more than one YAML document (separated by "
                               "'---'); expected one"));
  }
  JobSpec spec;
  try {
    if (!root.IsDefined() || root.IsNull()) {
      Error(1, "", "the job file holds no job; expected a map with at least 'name' and 'roles'");
    } else if (!root.IsMap()) {
      Error(LineOf(root, 1), "",
            absl::StrCat("the job file must be a map with at least 'name' and 'roles'; got ",
                         Describe(root)));
    } else {
      ParseTop(root, spec);
    }
  } catch (const YAML::Exception& e) {
    // Not expected: the traversal only asks valid nodes for what their type offers.
    return absl::InternalError(absl::StrCat(source_, ": reading the job file: ", e.what()));
  }
  if (!problems_.empty()) return Refuse();
  spec.source_path = source_;
  return spec;
}

void JobFileParser::Error(int line, absl::string_view key, absl::string_view message) {
  std::string text = key.empty() ? absl::StrCat(Where(source_, line), ": ", message)
                                 : absl::StrCat(Where(source_, line), ": ", key, ": ", message);
  problems_.push_back({line, Printable(text)});
}

absl::Status JobFileParser::Refuse(const std::string& only) {
  return absl::InvalidArgumentError(Printable(only));
}

absl::Status JobFileParser::Refuse() {
  // Problems are found pass by pass (keys, then cross-role checks); the reader wants file order.
  std::stable_sort(problems_.begin(), problems_.end(),
                   [](const Problem& a, const Problem& b) { return a.line < b.line; });
  std::vector<std::string> lines;
  for (const auto& p : problems_) lines.push_back(p.text);
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

int JobFileParser::LineOf(const YAML::Node& node, int fallback) {
  if (!node.IsDefined() || node.IsNull()) return fallback;
  YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark.line + 1;
}

bool JobFileParser::IsAliasUse(const YAML::Node& value, const YAML::Node& user) {
  if (!value.IsDefined() || !user.IsDefined()) return false;
  YAML::Mark v = value.Mark(), u = user.Mark();
  return !v.is_null() && !u.is_null() && v.pos < u.pos;
}

int JobFileParser::ValueLine(const Entry& holder) {
  return holder.aliased ? holder.line : LineOf(holder.value, holder.line);
}

int JobFileParser::ItemLine(const Entry& holder, size_t i) {
  if (holder.aliased) return holder.line;
  YAML::Node item = holder.value[i];
  if (IsAliasUse(item, holder.value)) return holder.line;
  if (i > 0) {
    YAML::Node previous = holder.value[i - 1];
    if (previous.IsDefined() && !previous.Mark().is_null() && !item.Mark().is_null() &&
        item.Mark().pos <= previous.Mark().pos) {
      return holder.line;
    }
  }
  return LineOf(item, holder.line);
}

bool JobFileParser::IsMergeKey(const YAML::Node& key) {
  return key.IsScalar() && key.Scalar() == "<<" &&
         (key.Tag() == "?" || key.Tag() == "tag:yaml.org,2002:merge");
}

std::vector<Entry> JobFileParser::Entries(const Entry& holder, absl::string_view path,
                                          bool are_roles) {
  const YAML::Node& map = holder.value;
  std::set<std::string> own_keys;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it->first.IsScalar() && !IsMergeKey(it->first)) own_keys.insert(it->first.Scalar());
  }
  std::vector<Entry> entries;
  std::map<std::string, int> first_line;
  std::set<std::string> merged_keys;
  for (auto it = map.begin(); it != map.end(); ++it) {
    Entry e{"", it->first, it->second, holder.line, holder.aliased};
    if (!holder.aliased) {
      e.line = LineOf(it->first, LineOf(map, 1));
      e.aliased = IsAliasUse(it->second, it->first);
    }
    if (!e.key_node.IsScalar()) {
      Error(e.line, path,
            absl::StrCat("keys must be plain names, got ", Describe(e.key_node), " as a key"));
      continue;
    }
    e.key = e.key_node.Scalar();
    if (IsMergeKey(e.key_node)) {
      for (Entry& m : Merged(e, path, are_roles)) {
        if (own_keys.count(m.key) > 0 || !merged_keys.insert(m.key).second) continue;
        entries.push_back(std::move(m));
      }
      continue;
    }
    auto [seen, inserted] = first_line.emplace(e.key, e.line);
    if (!inserted) {
      Error(e.line, JoinKey(path, e.key),
            are_roles
                ? absl::StrCat("role defined twice, at lines ", seen->second, " and ", e.line,
                               "; role names must be unique")
                : absl::StrCat("given twice, at lines ", seen->second, " and ", e.line,
                               "; keep one"));
      continue;
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

std::vector<Entry> JobFileParser::Merged(
    const Entry& merge, absl::string_view path, bool are_roles) {
  constexpr char kForm[] =
      "must be a map to merge in, or a list of them, e.g. <<: *common or <<: [*a, *b], got ";
  std::string key = JoinKey(path, "<<");
  std::vector<Entry> sources;
  if (merge.value.IsMap()) {
    sources.push_back(merge);
  } else if (merge.value.IsSequence()) {
    for (size_t i = 0; i < merge.value.size(); ++i) {
      YAML::Node item = merge.value[i];
      if (!item.IsMap()) {
        Error(merge.line, absl::StrCat(key, "[", i, "]"), absl::StrCat(kForm, Describe(item)));
        continue;
      }
      sources.push_back(Entry{"<<", merge.key_node, item, merge.line, true});
    }
  } else {
    Error(merge.line, key, absl::StrCat(kForm, Describe(merge.value)));
    return {};
  }
  // A map may merge one that merges another; an anchor that merges itself (yaml-cpp lets
  // `&a {<<: *a}` refer to its own node) or a chain built to multiply work must still end.
  if (merge_depth_ >= kMaxMergeDepth || ++merges_ > kMaxMerges) {
    if (!merge_refused_) {
      Error(merge.line, key,
            absl::StrCat("merges nest more than ", kMaxMergeDepth, " deep or number more than ",
                         kMaxMerges, " (does an anchor merge itself?)"));
    }
    merge_refused_ = true;
    return {};
  }
  ++merge_depth_;
  std::vector<Entry> out;
  for (Entry& source : sources) {
    source.line = merge.line;
    source.aliased = true;
    for (Entry& e : Entries(source, path, are_roles)) out.push_back(std::move(e));
  }
  --merge_depth_;
  return out;
}

void JobFileParser::CheckKnownKeys(const std::vector<Entry>& entries, absl::string_view path,
                                   absl::Span<const absl::string_view> accepted) {
  for (const auto& e : entries) {
    if (std::find(accepted.begin(), accepted.end(), e.key) != accepted.end()) continue;
    std::string hint;
    if (auto closest = Closest(e.key, accepted)) {
      hint = absl::StrCat(" did you mean '", *closest, "'?");
    }
    Error(e.line, JoinKey(path, e.key),
          absl::StrCat("unknown key;", hint, " accepted keys: ", absl::StrJoin(accepted, ", ")));
  }
}

const Entry* JobFileParser::Find(const std::vector<Entry>& entries, absl::string_view key) {
  for (const auto& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

std::optional<std::string> JobFileParser::Scalar(const Entry& e, absl::string_view key,
                                                 absl::string_view expected) {
  if (e.value.IsScalar()) return e.value.Scalar();
  Error(e.line, key, absl::StrCat("must be ", expected, ", got ", Describe(e.value)));
  return std::nullopt;
}

std::optional<int64_t> JobFileParser::Integer(const Entry& e, const std::string& key, int64_t min,
                                              int64_t max) {
  std::optional<int64_t> n = e.value.IsScalar() ? ParseInt(e.value.Scalar()) : std::nullopt;
  if (!n || *n < min) {
    Error(e.line, key,
          absl::StrCat("must be an integer >= ", min, ", got ", Describe(e.value)));
    return std::nullopt;
  }
  if (*n > max) {
    Error(e.line, key, absl::StrCat("must be at most ", max, ", got ", *n));
    return std::nullopt;
  }
  return n;
}

std::optional<std::chrono::milliseconds> JobFileParser::Duration(const Entry& e,
                                                                 const std::string& key) {
  std::optional<std::chrono::milliseconds> d =
      e.value.IsScalar() ? ParseDuration(e.value.Scalar()) : std::nullopt;
  if (!d) {
    Error(e.line, key, absl::StrCat("must be ", kDurationForm, ", got ", Describe(e.value)));
  }
  return d;
}

void JobFileParser::ParseTop(const YAML::Node& root, JobSpec& spec) {
  std::vector<Entry> entries = Entries(Entry{"", root, root, 1}, "", false);
  std::vector<absl::string_view> top_keys(std::begin(kTopKeysBeforeSections),
                                          std::end(kTopKeysBeforeSections));
  for (const JobSection& section : sections_) top_keys.push_back(section.name);
  top_keys.insert(top_keys.end(), std::begin(kTopKeysAfterSections),
                  std::end(kTopKeysAfterSections));
  CheckKnownKeys(entries, "", top_keys);

  if (const Entry* e = Find(entries, "name")) {
    constexpr char kForm[] =
        "a name of letters, digits, '.', '_' and '-' that starts with a letter or digit, at "
        "most 63 characters, e.g. digits-ddp";
    if (auto text = Scalar(*e, "name", kForm)) {
      if (IsValidJobName(*text)) {
        spec.name = *text;
      } else {
        Error(e->line, "name", absl::StrCat("must be ", kForm, ", got ", Describe(e->value)));
      }
    }
  } else {
    Error(1, "name", "required; expected a job name such as digits-ddp");
  }

  if (const Entry* e = Find(entries, "framework")) {
    std::string accepted = absl::StrJoin(kFrameworks, ", ");
    if (auto text = Scalar(*e, "framework", absl::StrCat("one of ", accepted))) {
      if (*text == "none") {
        spec.framework = Framework::kNone;
      } else if (*text == "pytorch") {
        spec.framework = Framework::kPyTorch;
      } else if (*text == "tensorflow") {
        spec.framework = Framework::kTensorFlow;
      } else if (*text == "jax") {
        spec.framework = Framework::kJax;
      } else if (*text == "paddle") {
        spec.framework = Framework::kPaddle;
      } else if (*text == "horovod") {
        spec.framework = Framework::kHorovod;
      } else if (*text == "mpi") {
        spec.framework = Framework::kMpi;
      } else {
        std::string hint;
        if (auto closest = Closest(*text, kFrameworks)) {
          hint = absl::StrCat(" did you mean '", *closest, "'?");
        }
        Error(e->line, "framework",
              absl::StrCat("unknown framework ", Describe(e->value), ";", hint,
                           " accepted values: ", accepted));
      }
    }
  }

  FailureKeys job_failure;
  ParseFailureKeys(entries, "", job_failure);
  if (const Entry* e = Find(entries, "backoff")) ParseBackoff(*e, spec.backoff);
  if (const Entry* e = Find(entries, "heartbeat")) ParseHeartbeat(*e, spec.heartbeat);
  if (const Entry* e = Find(entries, "checkpoint")) ParseCheckpoint(*e, spec.checkpoint);
  if (const Entry* e = Find(entries, "dataset")) ParseDataset(*e, spec.dataset);
  if (const Entry* e = Find(entries, "tensorboard")) ParseTensorBoard(*e, spec.tensorboard);
  if (const Entry* e = Find(entries, "publish")) ParsePublish(*e, spec.publish);
  if (const Entry* e = Find(entries, "mpi")) ParseMpi(*e, spec);
  framework_ = spec.framework;

  std::vector<RoleSite> sites;
  const Entry* roles_entry = Find(entries, "roles");
  if (roles_entry == nullptr) {
    Error(1, "roles",
          "required; expected a map of role name to role, e.g. roles: {worker: {command: "
          "[python3, train.py]}}");
  } else if (roles_entry->value.IsNull() ||
             (roles_entry->value.IsMap() && roles_entry->value.size() == 0)) {
    Error(roles_entry->line, "roles",
          "must define at least one role, e.g. roles: {worker: {command: [python3, train.py]}}");
  } else if (!roles_entry->value.IsMap()) {
    Error(roles_entry->line, "roles",
          absl::StrCat("must be a map of role name to role, got ", Describe(roles_entry->value)));
  } else {
    for (const Entry& r : Entries(*roles_entry, "roles", true)) {
      RoleSite site;
      spec.roles.push_back(ParseRole(r, site));
      sites.push_back(std::move(site));
    }
  }
  // After the roles: a section's per-role settings may name only roles the file defines. Every
  // problem is sorted by line in the end, so the order of parsing changes no message.
  for (const JobSection& section : sections_) {
    if (const Entry* e = Find(entries, section.name)) ParseOwnedSection(*e, section, spec);
  }

  bool mpi = spec.framework == Framework::kMpi && roles_entry != nullptr;
  if (mpi) CheckMpiRoles(*roles_entry, sites, spec);
  CheckDependencies(spec, sites);
  ParseSuccess(Find(entries, "success"), roles_entry, spec);
  ResolveFailureHandling(job_failure, sites, spec);
  if (mpi) CheckMpiNotElastic(spec);
}

}  // namespace shoal::spec
