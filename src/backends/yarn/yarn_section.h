#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "spec/job_section.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// Where the job runs on YARN (`yarn:` in the job file); flags of `shoal run` override each.
struct YarnConfig : spec::SectionValue {
  std::string queue;       // empty: the cluster's default queue
  std::string node_label;  // node label expression every container must match; empty: none
};

// The `yarn:` section of the job file, for the parser (spec::JobSections).
spec::JobSection YarnJobSection();

// The job file's `yarn:` section, or the defaults when it has none.
const YarnConfig& YarnConfigOf(const spec::JobSpec& job);

// The rules the section and the flags share: YARN's queue paths (root.ml.team) and label
// expressions (gpu, a&&b); anything else would only fail later, inside the ResourceManager,
// with a less helpful message.
inline constexpr char kYarnQueueForm[] = "a YARN queue name (letters, digits, -_.), e.g. root.ml";
inline constexpr char kYarnNodeLabelForm[] =
    "a YARN node label expression (letters, digits, -_. and &|!()), e.g. gpu";
bool IsYarnQueue(absl::string_view text);
bool IsYarnNodeLabel(absl::string_view text);

}  // namespace shoal::backends
