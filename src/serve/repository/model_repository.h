#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::serve {

inline constexpr char kModelFileName[] = "model.pt";
// An empty file a publisher puts in a version directory before renaming the directory into
// place (shoal.publish_model does): it says the directory appeared whole, in one rename, so
// the watcher loads it without waiting for the settle time.
inline constexpr char kVersionCompleteMarker[] = ".shoal-complete";

// A version directory DIR/<model>/<version>/ that holds a model.pt.
struct VersionEntry {
  int64_t version = 0;
  std::string model_path;  // DIR/<model>/<version>/model.pt
  // Every file under the version directory with its size and modification time: a copy in
  // progress changes it, so the watcher loads a version only once it has stayed the same for
  // the settle time (version_settle_filter.h).
  std::string fingerprint;
  bool marked_complete = false;  // holds kVersionCompleteMarker
};

// A model directory DIR/<model>/ as found on disk; nothing is loaded or parsed yet.
struct ModelEntry {
  std::string name;
  std::string dir;
  std::optional<std::string> config_path;  // DIR/<model>/config.yaml when present
  std::vector<VersionEntry> versions;      // ascending
  // Version directories that cannot be served, each "DIR/m/3: <why>", for the log.
  std::vector<std::string> skipped_versions;
};

struct RepositoryScan {
  std::vector<ModelEntry> models;  // by name
  // Entries that are not models, each "DIR/x: <why>", for the log. Hidden entries (".git")
  // and plain files at the top are left out silently.
  std::vector<std::string> ignored;
};

// Lists the models of the repository at `dir`: every subdirectory whose name can appear in a
// URL ([A-Za-z0-9_.-], not starting with '.'), with its version subdirectories (names that are
// integers >= 1) that hold a model.pt. A model directory without any is still listed, with no
// versions: the caller refuses it with a reason. NotFound or FailedPrecondition when `dir` is
// missing, not a directory or unreadable.
absl::StatusOr<RepositoryScan> ScanModelRepository(const std::string& dir);

}  // namespace shoal::serve
