// JobFileParser: the job's optional sections: checkpoint, dataset, tensorboard, mpi (with the
// roles framework: mpi requires), and the sections read for their owners (JobSections).
#include <algorithm>
#include <deque>

#include "absl/strings/strip.h"
#include "spec/job_file_parser.h"

namespace shoal::spec {

void JobFileParser::ParseCheckpoint(const Entry& e, CheckpointConfig& out) {
  const std::string path = "checkpoint";
  // Written at all, even with nothing after it: checkpoints are on, with the defaults.
  out.configured = true;
  if (e.value.IsNull()) return;
  if (!e.value.IsMap()) {
    Error(e.line, path,
          absl::StrCat("must be a map with dir and/or keep, e.g. {dir: ./ckpt, keep: 3}, got ",
                       Describe(e.value)));
    return;
  }
  std::vector<Entry> entries = Entries(e, path, false);
  CheckKnownKeys(entries, path, kCheckpointKeys);
  if (const Entry* d = Find(entries, "dir")) {
    std::string key = JoinKey(path, "dir");
    if (auto text = Scalar(*d, key, kCheckpointDirForm)) {
      if (text->empty()) {
        Error(d->line, key,
              absl::StrCat("must be ", kCheckpointDirForm, " (leave it out for the default), "
                           "got ''"));
      } else if ((*text)[0] == '~') {
        Error(d->line, key,
              absl::StrCat("'~' is not expanded; must be ", kCheckpointDirForm, ", got ",
                           Describe(d->value)));
      } else if (HasNul(*text)) {
        Error(d->line, key, kNulMessage);
      } else if (HasUriScheme(*text)) {
        absl::string_view rest = absl::string_view(*text).substr(text->find("://") + 3);
        if (rest.find_first_not_of('/') == absl::string_view::npos) {
          Error(d->line, key,
                absl::StrCat("must name a place after ", text->substr(0, text->find("://") + 3),
                             ", a host and/or a path, e.g. hdfs://nn/ckpt, got ",
                             Describe(d->value)));
        } else {
          out.dir = *text;  // for the storage it names to read; not a local path
        }
      } else {
        out.dir = ResolveDir(base_dir_, *text);
      }
    }
  }
  if (const Entry* k = Find(entries, "keep")) {
    if (auto n = Integer(*k, JoinKey(path, "keep"), 1, kMaxCount)) {
      out.keep = static_cast<uint32_t>(*n);
    }
  }
}

void JobFileParser::ParsePublish(const Entry& e, PublishConfig& out) {
  const std::string path = "publish";
  constexpr char kForm[] = "a map with repository (a directory or hdfs://namenode/path) and "
                           "optionally keep, e.g. {repository: ./models, keep: 5}";
  out.configured = true;
  if (!e.value.IsMap()) {
    Error(e.line, path, absl::StrCat("must be ", kForm, ", got ", Describe(e.value)));
    return;
  }
  std::vector<Entry> entries = Entries(e, path, false);
  CheckKnownKeys(entries, path, kPublishKeys);
  const Entry* r = Find(entries, "repository");
  if (r == nullptr) {
    Error(e.line, path, absl::StrCat("needs repository: ", kForm));
  } else {
    std::string key = JoinKey(path, "repository");
    constexpr char kDirForm[] =
        "a directory, absolute or relative to the job file, e.g. ./models, or "
        "hdfs://namenode[:port]/path";
    if (auto text = Scalar(*r, key, kDirForm)) {
      if (text->empty()) {
        Error(r->line, key, absl::StrCat("must be ", kDirForm, ", got ''"));
      } else if ((*text)[0] == '~') {
        Error(r->line, key, absl::StrCat("'~' is not expanded; must be ", kDirForm, ", got ",
                                         Describe(r->value)));
      } else if (HasNul(*text)) {
        Error(r->line, key, kNulMessage);
      } else if (HasUriScheme(*text)) {
        // What the SDK's publish_model and `shoal serve` take: hdfs://namenode[:port]/path.
        absl::string_view rest = *text;
        bool hdfs = absl::ConsumePrefix(&rest, "hdfs://");
        size_t slash = rest.find('/');
        absl::string_view authority = rest.substr(0, slash);
        bool has_host = !authority.empty() && authority.front() != ':';
        if (!hdfs) {
          Error(r->line, key,
                absl::StrCat("models go to a directory or to hdfs://namenode[:port]/path, got ",
                             Describe(r->value)));
        } else if (!has_host || slash == absl::string_view::npos ||
                   rest.substr(slash).find_first_not_of('/') == absl::string_view::npos) {
          Error(r->line, key,
                absl::StrCat("must be hdfs://namenode[:port]/path, a NameNode host and a path "
                             "below it, e.g. hdfs://nn:8020/models, got ",
                             Describe(r->value)));
        } else {
          out.repository = *text;  // for the SDK to reach through WebHDFS; not a local path
        }
      } else {
        out.repository = ResolveDir(base_dir_, *text);
      }
    }
  }
  if (const Entry* k = Find(entries, "keep")) {
    if (auto n = Integer(*k, JoinKey(path, "keep"), 1, kMaxCount)) {
      out.keep = static_cast<uint32_t>(*n);
    }
  }
}

void JobFileParser::ParseMpi(const Entry& e, JobSpec& spec) {
  const std::string path = "mpi";
  if (e.value.IsNull()) return;
  if (!e.value.IsMap()) {
    Error(e.line, path,
          absl::StrCat("must be a map, e.g. {slots_per_worker: 2}, got ", Describe(e.value)));
    return;
  }
  std::vector<Entry> entries = Entries(e, path, false);
  CheckKnownKeys(entries, path, kMpiKeys);
  if (const Entry* s = Find(entries, "slots_per_worker")) {
    if (auto n = Integer(*s, JoinKey(path, "slots_per_worker"), 1, kMaxInstances)) {
      spec.mpi.slots_per_worker = static_cast<uint32_t>(*n);
    }
  }
  if (spec.framework != Framework::kMpi) {
    Error(e.line, path,
          absl::StrCat("only applies to framework: mpi; this job's framework is ",
                       FrameworkName(spec.framework)));
  }
}

void JobFileParser::CheckMpiRoles(const Entry& roles_entry, std::vector<RoleSite>& sites,
                                  JobSpec& spec) {
  Role* launcher = nullptr;
  RoleSite* launcher_site = nullptr;
  Role* worker = nullptr;
  for (size_t i = 0; i < spec.roles.size(); ++i) {
    if (spec.roles[i].name == kMpiLauncher) {
      launcher = &spec.roles[i];
      launcher_site = &sites[i];
    }
    if (spec.roles[i].name == kMpiWorker) worker = &spec.roles[i];
  }
  if (launcher == nullptr || worker == nullptr) {
    Error(roles_entry.line, "roles",
          "framework: mpi needs a 'launcher' role (one task whose command is the MPI program, "
          "run through mpirun) and a 'worker' role (the tasks that host the ranks, without a "
          "command)");
    return;
  }
  if (launcher->instances != 1 || launcher->min_instances != 0) {
    Error(launcher->line, "roles.launcher.instances",
          absl::StrCat("framework: mpi runs exactly one launcher, got ", launcher->instances));
  }
  worker->untracked = true;
  if (std::find(launcher->depends_on.begin(), launcher->depends_on.end(), kMpiWorker) ==
      launcher->depends_on.end()) {
    launcher->depends_on.push_back(kMpiWorker);
    launcher_site->depends_on_item_lines.push_back(launcher->line);
  }
}

void JobFileParser::CheckMpiNotElastic(const JobSpec& spec) {
  for (const Role& r : spec.roles) {
    if ((r.name == kMpiLauncher || r.name == kMpiWorker) &&
        (r.on_failure == OnFailure::kElastic || r.min_instances != 0)) {
      Error(r.line, JoinKey("roles", r.name),
            "an MPI world cannot change size while it runs, so framework: mpi roles cannot be "
            "elastic; use on_failure: restart-group to restart the whole world");
    }
  }
}

void JobFileParser::ParseTensorBoard(const Entry& e, TensorBoardConfig& out) {
  const std::string path = "tensorboard";
  // Written at all, even as `tensorboard:`, turns it on with the defaults.
  out.configured = true;
  if (e.value.IsNull()) return;
  if (!e.value.IsMap()) {
    Error(e.line, path,
          absl::StrCat("must be a map with logdir and/or command, e.g. {logdir: ./runs}, got ",
                       Describe(e.value)));
    return;
  }
  std::vector<Entry> entries = Entries(e, path, false);
  CheckKnownKeys(entries, path, kTensorBoardKeys);
  if (const Entry* d = Find(entries, "logdir")) {
    std::string key = JoinKey(path, "logdir");
    constexpr char kForm[] = "a directory path, absolute or relative to the job file";
    if (auto text = Scalar(*d, key, kForm)) {
      if (text->empty() || (*text)[0] == '~') {
        Error(d->line, key,
              absl::StrCat("must be ", kForm, " ('~' is not expanded; leave the key out for "
                           "the default), got ", Describe(d->value)));
      } else if (HasNul(*text)) {
        Error(d->line, key, kNulMessage);
      } else {
        out.logdir = ResolveDir(base_dir_, *text);
      }
    }
  }
  if (const Entry* c = Find(entries, "command")) {
    std::string key = JoinKey(path, "command");
    bool ok = c->value.IsSequence() && c->value.size() > 0;
    std::vector<std::string> argv;
    for (size_t i = 0; ok && i < c->value.size(); ++i) {
      if (!c->value[i].IsScalar() || c->value[i].Scalar().empty() ||
          HasNul(c->value[i].Scalar())) {
        ok = false;
      } else {
        argv.push_back(c->value[i].Scalar());
      }
    }
    if (!ok) {
      Error(c->line, key,
            absl::StrCat("must be a non-empty list of strings, the TensorBoard program and its "
                         "first arguments, e.g. [/opt/venv/bin/tensorboard], got ",
                         Describe(c->value)));
    } else {
      out.command = std::move(argv);
    }
  }
}

void JobFileParser::ParseDataset(const Entry& e, DatasetConfig& out) {
  const std::string path = "dataset";
  out.configured = true;
  constexpr char kForms[] =
      "either shards (a list of files, e.g. [a.npz, b.npz]), samples and shard_size (e.g. "
      "samples: 1797, shard_size: 64) or parquet (a Parquet dataset, e.g. parquet: "
      "./digits.parquet)";
  if (!e.value.IsMap()) {
    Error(e.line, path, absl::StrCat("must be a map with ", kForms, ", got ", Describe(e.value)));
    return;
  }
  std::vector<Entry> entries = Entries(e, path, false);
  CheckKnownKeys(entries, path, kDatasetKeys);
  const Entry* shards = Find(entries, "shards");
  const Entry* samples = Find(entries, "samples");
  const Entry* shard_size = Find(entries, "shard_size");
  const Entry* parquet = Find(entries, "parquet");

  if (shards != nullptr) ParseShards(*shards, JoinKey(path, "shards"), out);
  if (samples != nullptr) {
    if (auto n = Integer(*samples, JoinKey(path, "samples"), 1, kMaxSamples)) {
      out.samples = static_cast<uint64_t>(*n);
    }
  }
  if (shard_size != nullptr) {
    if (auto n = Integer(*shard_size, JoinKey(path, "shard_size"), 1, kMaxSamples)) {
      out.shard_size = static_cast<uint64_t>(*n);
    }
  }
  if (parquet != nullptr) ParseParquet(*parquet, JoinKey(path, "parquet"), out);

  // The keys that each choose a form; two of them is one too many, reported at the second.
  std::vector<const Entry*> forms;
  for (const Entry* f : {shards, samples, parquet}) {
    if (f != nullptr) forms.push_back(f);
  }
  std::sort(forms.begin(), forms.end(),
            [](const Entry* a, const Entry* b) { return a->line < b->line; });
  if (forms.size() > 1) {
    const Entry* earlier = forms[0];
    const Entry* later = forms[1];
    Error(later->line, JoinKey(path, later->key),
          absl::StrCat("cannot be given together with ", JoinKey(path, earlier->key),
                       " (line ", earlier->line, "); a dataset is ", kForms));
  } else if (shard_size != nullptr && (shards != nullptr || parquet != nullptr)) {
    Error(shard_size->line, JoinKey(path, "shard_size"),
          shards != nullptr
              ? "only goes with samples; with shards each file is one shard, so drop it"
              : "only goes with samples; with parquet each Parquet file is one shard, so drop it");
  } else if (forms.empty()) {
    if (shard_size != nullptr) {
      Error(e.line, JoinKey(path, "samples"),
            "required with shard_size; expected an integer >= 1, e.g. samples: 1797");
    } else {
      Error(e.line, path, absl::StrCat("needs ", kForms));
    }
  } else if (samples != nullptr && shard_size == nullptr) {
    Error(e.line, JoinKey(path, "shard_size"),
          "required with samples; expected an integer >= 1, e.g. shard_size: 64");
  }

  if (const Entry* ep = Find(entries, "epochs")) {
    if (auto n = Integer(*ep, JoinKey(path, "epochs"), 1, kMaxCount)) {
      out.epochs = static_cast<uint32_t>(*n);
    }
  }
  if (const Entry* l = Find(entries, "lease_timeout")) {
    std::string key = JoinKey(path, "lease_timeout");
    if (auto d = Duration(*l, key)) {
      if (d->count() == 0) {
        Error(l->line, key, "must be longer than 0, e.g. 60s, got 0s");
      } else {
        out.lease_timeout = *d;
      }
    }
  }
}

void JobFileParser::ParseShards(const Entry& e, const std::string& key, DatasetConfig& out) {
  if (!e.value.IsSequence()) {
    Error(e.line, key,
          absl::StrCat("must be a list of files, e.g. [a.npz, b.npz], got ", Describe(e.value)));
    return;
  }
  if (e.value.size() == 0) {
    Error(e.line, key, "must name at least one file, e.g. [a.npz, b.npz]");
    return;
  }
  for (size_t i = 0; i < e.value.size(); ++i) {
    YAML::Node item = e.value[i];
    int line = ItemLine(e, i);
    std::string item_key = absl::StrCat(key, "[", i, "]");
    if (!item.IsScalar()) {
      Error(line, item_key, absl::StrCat("must be a file name, got ", Describe(item)));
    } else if (item.Scalar().empty()) {
      Error(line, item_key, "must not be empty; expected a file name such as a.npz");
    } else if (HasNul(item.Scalar())) {
      Error(line, item_key, kNulMessage);
    } else {
      out.files.push_back(item.Scalar());
    }
  }
}

void JobFileParser::ParseParquet(const Entry& e, const std::string& key, DatasetConfig& out) {
  constexpr char kForm[] =
      "a Parquet file or a directory of them (as Spark writes it), absolute or relative to the "
      "job file, or hdfs://namenode[:port]/path, e.g. ./digits.parquet";
  auto text = Scalar(e, key, kForm);
  if (!text) return;
  if (text->empty()) {
    Error(e.line, key, absl::StrCat("must be ", kForm, ", got ''"));
  } else if ((*text)[0] == '~') {
    Error(e.line, key,
          absl::StrCat("'~' is not expanded; must be ", kForm, ", got ", Describe(e.value)));
  } else if (HasNul(*text)) {
    Error(e.line, key, kNulMessage);
  } else if (HasUriScheme(*text)) {
    // Listed through WebHDFS when the job is submitted (src/master/parquet_dataset.h).
    absl::string_view rest = *text;
    bool hdfs = absl::ConsumePrefix(&rest, "hdfs://");
    size_t slash = rest.find('/');
    absl::string_view authority = rest.substr(0, slash);
    bool has_host = !authority.empty() && authority.front() != ':';
    if (!hdfs) {
      Error(e.line, key,
            absl::StrCat("a Parquet dataset is read from a local path or from "
                         "hdfs://namenode[:port]/path, got ",
                         Describe(e.value)));
    } else if (!has_host || slash == absl::string_view::npos ||
               rest.substr(slash).find_first_not_of('/') == absl::string_view::npos) {
      Error(e.line, key,
            absl::StrCat("must be hdfs://namenode[:port]/path, a NameNode host and a path "
                         "below it, e.g. hdfs://nn:8020/data/digits.parquet, got ",
                         Describe(e.value)));
    } else {
      out.parquet = *text;
    }
  } else {
    out.parquet = ResolveDir(base_dir_, *text);
  }
  out.parquet_line = e.line;
}

class JobFileParser::OwnedSectionReader final : public SectionReader {
 public:
  // `path` names the value in messages: the section's key, or a path inside it
  // (`kubernetes.roles.worker`, `kubernetes.volumes[0]`).
  OwnedSectionReader(JobFileParser& parser, const Entry& section, std::string path,
                     const std::vector<std::string>& role_names)
      : parser_(parser), section_(section), path_(std::move(path)), role_names_(role_names) {}

  const std::string& name() const override { return path_; }

  bool ExpectMap(absl::string_view form) override {
    if (!section_.value.IsMap()) {
      parser_.Error(
          section_.line, path_,
          absl::StrCat("must be a map with ", form, ", got ", spec::Describe(section_.value)));
      return false;
    }
    entries_ = parser_.Entries(section_, path_, false);
    return true;
  }

  void AcceptKeys(absl::Span<const absl::string_view> accepted) override {
    parser_.CheckKnownKeys(entries_, path_, accepted);
  }

  bool Has(absl::string_view key) const override { return Find(entries_, key) != nullptr; }

  std::optional<std::string> Text(absl::string_view key, absl::string_view expected) override {
    const Entry* e = Find(entries_, key);
    if (e == nullptr) return std::nullopt;
    return parser_.Scalar(*e, JoinKey(path_, key), expected);
  }

  std::optional<std::chrono::milliseconds> Duration(absl::string_view key) override {
    const Entry* e = Find(entries_, key);
    if (e == nullptr) return std::nullopt;
    return parser_.Duration(*e, JoinKey(path_, key));
  }

  std::string Describe(absl::string_view key) const override {
    const Entry* e = Find(entries_, key);
    return e == nullptr ? "nothing" : spec::Describe(e->value);
  }

  void Error(absl::string_view key, absl::string_view message) override {
    const Entry* e = Find(entries_, key);
    parser_.Error(e != nullptr ? e->line : section_.line, JoinKey(path_, key), message);
  }

  std::vector<std::string> Keys() const override {
    std::vector<std::string> keys;
    keys.reserve(entries_.size());
    for (const Entry& e : entries_) keys.push_back(e.key);
    return keys;
  }

  std::unique_ptr<SectionReader> Nested(absl::string_view key) override {
    const Entry* e = Find(entries_, key);
    if (e == nullptr) return nullptr;
    return std::make_unique<OwnedSectionReader>(parser_, *e, JoinKey(path_, key), role_names_);
  }

  std::vector<std::unique_ptr<SectionReader>> Items(absl::string_view key,
                                                    absl::string_view form) override {
    std::vector<std::unique_ptr<SectionReader>> out;
    const Entry* e = Find(entries_, key);
    if (e == nullptr) return out;
    std::string path = JoinKey(path_, key);
    if (!e->value.IsSequence()) {
      parser_.Error(e->line, path,
                    absl::StrCat("must be a list of ", form, ", got ", spec::Describe(e->value)));
      return out;
    }
    for (size_t i = 0; i < e->value.size(); ++i) {
      // Kept here: an item's reader refers to its Entry.
      items_.push_back(Entry{absl::StrCat(key, "[", i, "]"), e->key_node, e->value[i],
                             ItemLine(*e, i), e->aliased});
      out.push_back(std::make_unique<OwnedSectionReader>(
          parser_, items_.back(), absl::StrCat(path, "[", i, "]"), role_names_));
    }
    return out;
  }

  std::vector<std::string> RoleNames() const override { return role_names_; }

 private:
  JobFileParser& parser_;
  const Entry& section_;
  std::string path_;
  const std::vector<std::string>& role_names_;
  std::vector<Entry> entries_;  // the map's pairs, once ExpectMap found a map
  std::deque<Entry> items_;     // list items handed out by Items (stable addresses)
};

void JobFileParser::ParseOwnedSection(const Entry& e, const JobSection& section, JobSpec& spec) {
  std::vector<std::string> role_names;
  for (const Role& role : spec.roles) role_names.push_back(role.name);
  OwnedSectionReader reader(*this, e, e.key, role_names);
  if (std::shared_ptr<const SectionValue> value = section.parse(reader)) {
    spec.sections[section.name] = std::move(value);
  }
}

}  // namespace shoal::spec
