#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::ui {

// A page of a job's logs.txt, whose lines are "<role>:<index> | <text>". Read in bounded
// pieces from the file, never whole: a 1 GB log costs what a page costs.
struct LogLine {
  int64_t offset = 0;  // of the line's first byte in the file
  std::string task;    // "worker:0"; empty for a line without the prefix
  std::string text;
};

struct LogPageRequest {
  std::string task;                  // only this task's lines; empty: all
  std::optional<int64_t> before;     // the lines ending before this byte
  std::optional<int64_t> after;      // the lines starting at or after this byte
  int limit = 200;
  int64_t max_scan_bytes = 4 << 20;  // a filtered scan stops after this much, saying where
};

struct LogPage {
  std::vector<LogLine> lines;   // in file order
  int64_t start_offset = 0;     // where the next page before this one ends
  int64_t end_offset = 0;       // where the next page after this one starts
  int64_t file_size = 0;
  bool more_before = false;
};

// Without before/after: the last lines. Only complete lines (ending in '\n') are returned: one
// still being written waits for the next page. NotFound when there is no log yet;
// InvalidArgument for an offset past the end or both before and after.
absl::StatusOr<LogPage> ReadLogPage(const std::string& path, const LogPageRequest& request);

// Splits "worker:0 | text" into task and text; a line without the prefix keeps it all as text.
void SplitLogLine(std::string_view line, LogLine& out);

}  // namespace shoal::ui
