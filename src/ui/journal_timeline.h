#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace shoal::ui {

// The job's history for the timeline (docs/design/0014-web-ui.md, "timeline"), read from its
// journal (events.jsonl): phases, each task's generations as bars, failures with their cause,
// restarts, checkpoints, the elastic world's size over time. A partly written last line is
// skipped ("truncated": true). NotFound when the job has no journal (or its directory went).
absl::StatusOr<nlohmann::json> JobTimeline(const std::string& job_dir, int64_t now_unix_ms);

// The same from the journal's text, for tests.
nlohmann::json TimelineFromJournal(std::string_view journal, int64_t now_unix_ms);

}  // namespace shoal::ui
