#include "spec/yaml_text.h"

#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/parser.h"

namespace shoal::spec {

std::optional<TextSpot> FindDeepNesting(absl::string_view text) {
  std::vector<size_t> indents;  // indentation of the block levels open at this line
  int flow = 0;
  int line = 1;
  for (size_t pos = 0; pos <= text.size(); ++line) {
    size_t end = std::min(text.find('\n', pos), text.size());
    absl::string_view l = text.substr(pos, end - pos);
    pos = end + 1;
    size_t i = 0;
    while (i < l.size() && l[i] == ' ') ++i;
    bool blank = i == l.size() || l[i] == '#' || l[i] == '\r';
    if (!blank && flow == 0) {
      while (!indents.empty() && indents.back() >= i) indents.pop_back();
      indents.push_back(i);
      size_t depth = indents.size();
      if (depth > static_cast<size_t>(kMaxNesting)) return TextSpot{line, static_cast<int>(i) + 1};
      while (i + 1 < l.size() && l[i] == '-' && (l[i + 1] == ' ' || l[i + 1] == '\t')) {
        if (++depth > static_cast<size_t>(kMaxNesting)) {
          return TextSpot{line, static_cast<int>(i) + 1};
        }
        i += 2;
        while (i < l.size() && l[i] == ' ') ++i;
      }
    }
    char quote = 0;
    for (; i < l.size(); ++i) {
      char c = l[i];
      if (quote != 0) {
        if (quote == '"' && c == '\\') {
          ++i;
        } else if (c == quote) {
          quote = 0;
        }
        continue;
      }
      if (c == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) break;
      if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '[' || c == '{') {
        if (static_cast<size_t>(++flow) + indents.size() > static_cast<size_t>(kMaxNesting)) {
          return TextSpot{line, static_cast<int>(i) + 1};
        }
      } else if ((c == ']' || c == '}') && flow > 0) {
        --flow;
      }
    }
  }
  return std::nullopt;
}

std::optional<TextSpot> FindIndentTab(absl::string_view text, int last_line) {
  int line = 1;
  for (size_t pos = 0; pos <= text.size() && line <= last_line; ++line) {
    size_t end = std::min(text.find('\n', pos), text.size());
    absl::string_view l = text.substr(pos, end - pos);
    pos = end + 1;
    size_t i = 0;
    std::optional<size_t> tab;
    for (; i < l.size() && (l[i] == ' ' || l[i] == '\t'); ++i) {
      if (l[i] == '\t' && !tab) tab = i;
    }
    if (tab && i < l.size() && l[i] != '#' && l[i] != '\r') {
      return TextSpot{line, static_cast<int>(*tab) + 1};
    }
  }
  return std::nullopt;
}

namespace {

// Sees one document's events, to tell whether its root is a bare null and where it starts.
class DocumentProbe : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    start_ = mark;
    depth_ = 0;
    root_is_null_ = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {
    if (depth_ == 0) root_is_null_ = true;
  }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    ++depth_;
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    ++depth_;
  }
  void OnMapEnd() override { --depth_; }

  bool root_is_null() const { return root_is_null_; }
  const YAML::Mark& start() const { return start_; }

 private:
  int depth_ = 0;
  bool root_is_null_ = false;
  YAML::Mark start_ = YAML::Mark::null_mark();
};

}  // namespace


DocumentCount CountDocuments(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentProbe probe;
  DocumentCount result;
  int previous_pos = -1;
  while (result.count < 2 && parser.HandleNextDocument(probe)) {
    const YAML::Mark& start = probe.start();
    if (start.pos <= previous_pos) {
      result.stuck_at = start;
      result.stuck_on = "unexpected text";
      if (start.pos >= 0 && static_cast<size_t>(start.pos) < text.size() &&
          absl::ascii_isgraph(static_cast<unsigned char>(text[start.pos]))) {
        result.stuck_on = absl::StrCat("unexpected '", std::string(1, text[start.pos]), "'");
      }
      break;
    }
    previous_pos = start.pos;
    if (probe.root_is_null()) continue;
    if (++result.count == 2) result.second_line = start.line + 1;
  }
  return result;
}

}  // namespace shoal::spec
