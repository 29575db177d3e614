#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shoal::spec {

// A top-level section of the job file that spec/ reads for someone else: a backend's `slurm:`
// or `yarn:`. spec/ knows neither its keys nor its type; the owner (the backend's folder) says
// both through a JobSection, and finds the typed value again in JobSpec::sections.
class SectionValue {
 public:
  virtual ~SectionValue() = default;
};

// One section as written in the job file, for its owner's parse function: the section's own
// keys, read with the job file's rules (plain keys, merge keys, a key given twice), and errors
// reported like every other problem of the file, as `file:line: <section>.<key>: message`,
// sorted in with the rest. Lives for one call of the parse function.
class SectionReader {
 public:
  virtual ~SectionReader() = default;

  // The section's name, e.g. "slurm".
  virtual const std::string& name() const = 0;
  // True when the section's value is a map. Otherwise reports, at the section's line,
  // "<section>: must be a map with <form>, got <what was written>" and returns false; the parse
  // function then returns its defaults.
  virtual bool ExpectMap(absl::string_view form) = 0;
  // The calls below read the map's keys. REQUIRES: ExpectMap returned true (before it, the
  // section has no keys: Has is false, Text and Duration nullopt).
  //
  // Reports every key of the map outside `accepted`, with a "did you mean" hint and the list.
  virtual void AcceptKeys(absl::Span<const absl::string_view> accepted) = 0;
  virtual bool Has(absl::string_view key) const = 0;
  // The key's value as text, or nullopt: absent, or (reported) not a scalar, in which case the
  // message is "must be <expected>, got ...".
  virtual std::optional<std::string> Text(absl::string_view key, absl::string_view expected) = 0;
  // The key's value as a duration (common/duration.h), or nullopt: absent, or reported.
  virtual std::optional<std::chrono::milliseconds> Duration(absl::string_view key) = 0;
  // How the key's value reads in "got ..." messages: numbers as written, text quoted.
  virtual std::string Describe(absl::string_view key) const = 0;
  // Reports `message` about `key` at the key's line: "file:line: <section>.<key>: <message>".
  virtual void Error(absl::string_view key, absl::string_view message) = 0;

  // Nested values (a backend's per-role settings, labels, a list of volumes), read with the
  // same rules; their messages name the whole path, e.g. `kubernetes.volumes[1].mount_path`.
  // A reader returned here lives no longer than the reader that returned it.
  //
  // The map's keys as written, in order (after merges); empty before ExpectMap.
  virtual std::vector<std::string> Keys() const = 0;
  // A reader for `key`'s value (call ExpectMap on it), or nullptr when the key is absent.
  virtual std::unique_ptr<SectionReader> Nested(absl::string_view key) = 0;
  // Readers for the items of the list under `key` (call ExpectMap on each), named `key[i]`;
  // empty when the key is absent, or (reported) not a list: "must be a list of <form>, got ...".
  virtual std::vector<std::unique_ptr<SectionReader>> Items(absl::string_view key,
                                                            absl::string_view form) = 0;
  // The roles the job file defines, in written order: a section's per-role settings may
  // only name those.
  virtual std::vector<std::string> RoleNames() const = 0;
};

// How one section is read: its top-level key and a function that builds the typed value from
// it. The value is stored in JobSpec::sections[name] whenever the key is written, also when
// the parse function reported problems (the job file is then refused as a whole).
struct JobSection {
  std::string name;
  std::function<std::shared_ptr<const SectionValue>(SectionReader&)> parse;
};
// In the order their keys are listed in messages: after `dataset`, before `tensorboard`.
using JobSections = std::vector<JobSection>;

// How a value that did not come from the job file (a command-line flag) reads in "got ..."
// messages: quoted and cut short, like a quoted string of the job file.
std::string DescribeText(absl::string_view text);

}  // namespace shoal::spec
