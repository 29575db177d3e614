#pragma once

// Where a job file's text goes wrong before, or instead of, yaml-cpp's own words: nesting too
// deep for its recursion, tabs in indentation, more than one document. Internal to spec/.

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace shoal::spec {

// Maps and lists nested deeper than this are refused before yaml-cpp reads the file: it
// recurses once per level and past about 500 levels (0.7) gives up with a bare "bad file",
// while a job file needs about six.
inline constexpr int kMaxNesting = 100;

struct TextSpot {
  int line = 0;    // 1-based
  int column = 0;  // 1-based
};

struct DocumentCount {
  int count = 0;        // non-empty documents: 0, 1 or 2 (meaning two or more)
  int second_line = 0;  // where the second one starts
  // Set when the parser got stuck (see CountDocuments): where, and what it found there.
  std::optional<YAML::Mark> stuck_at;
  std::string stuck_on;
};

// Where `text` first nests maps and lists more than kMaxNesting deep. An estimate made before
// any YAML parsing, so that yaml-cpp never recurses that far: flow brackets outside quotes and
// comments, plus block levels from indentation and from "- " items opened on one line.
std::optional<TextSpot> FindDeepNesting(absl::string_view text);

// The first tab in the indentation of a line at or before `last_line` (1-based) that holds
// more than whitespace and a comment: YAML forbids tabs there, and yaml-cpp then reports only
// a consequence such as "illegal map value".
std::optional<TextSpot> FindIndentTab(absl::string_view text, int last_line);

// Counts the non-empty documents of `text`, stopping at two. Not YAML::LoadAll: yaml-cpp 0.7
// gets stuck on a stray ',' outside brackets and LoadAll then adds a null document per turn
// until memory runs out (jbeder/yaml-cpp#1040, fixed upstream after 0.7). A document that
// starts where the previous one did is that stuck state, reported as the syntax error it is.
// Throws YAML::ParserException on other syntax errors.
DocumentCount CountDocuments(const std::string& text);

}  // namespace shoal::spec
