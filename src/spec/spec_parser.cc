#include "spec/spec_parser.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/byte_size.h"
#include "common/duration.h"
#include "spec/task_variables.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/parser.h"
#include "yaml-cpp/yaml.h"

namespace shoal::spec {
namespace {

constexpr absl::string_view kTopKeys[] = {
    "name",         "framework",        "success", "roles",     "on_failure", "restart",
    "max_restarts", "progress_timeout", "backoff", "heartbeat", "checkpoint", "dataset",
    "slurm", "yarn", "tensorboard", "mpi"};
constexpr absl::string_view kRoleKeys[] = {
    "instances",  "command",    "env",     "working_dir",  "resources",       "untracked",
    "depends_on", "on_failure", "restart", "max_restarts", "progress_timeout"};
constexpr absl::string_view kResourceKeys[] = {"cpus", "memory", "gpus"};
constexpr absl::string_view kSuccessKeys[] = {"roles"};
constexpr absl::string_view kInstancesKeys[] = {"min", "max"};
constexpr absl::string_view kBackoffKeys[] = {"initial", "max"};
constexpr absl::string_view kHeartbeatKeys[] = {"interval", "misses"};
constexpr absl::string_view kCheckpointKeys[] = {"dir", "keep"};
constexpr absl::string_view kTensorBoardKeys[] = {"logdir", "command"};
constexpr absl::string_view kSlurmKeys[] = {"partition", "account", "time_limit", "constraint"};
constexpr absl::string_view kYarnKeys[] = {"queue", "node_label"};
constexpr absl::string_view kDatasetKeys[] = {"shards", "samples", "shard_size", "epochs",
                                              "lease_timeout"};
// In the order the messages list them; the names come from job_spec.cc.
constexpr OnFailure kOnFailureValues[] = {OnFailure::kFailJob, OnFailure::kRestartTask,
                                          OnFailure::kRestartGroup, OnFailure::kElastic};
constexpr RestartMode kRestartValues[] = {RestartMode::kNever, RestartMode::kOnFailure,
                                          RestartMode::kAlways};
constexpr absl::string_view kFrameworks[] = {"none",  "pytorch", "tensorflow", "jax",
                                             "paddle", "horovod", "mpi"};
constexpr absl::string_view kMpiKeys[] = {"slots_per_worker"};
// framework: mpi gives these role names their meaning (Kubeflow MPIJob's names).
constexpr char kMpiLauncher[] = "launcher";
constexpr char kMpiWorker[] = "worker";

// Bounds that keep totals far from integer overflow; no real job comes near them.
constexpr int64_t kMaxInstances = 100000;
constexpr int64_t kMaxGpusPerTask = 1024;
// max_restarts, heartbeat.misses, checkpoint.keep, dataset.epochs.
constexpr int64_t kMaxCount = 1000000;
constexpr int64_t kMaxSamples = std::numeric_limits<int64_t>::max();
// Agents cannot usefully report more often than this.
constexpr std::chrono::milliseconds kMinHeartbeatInterval{10};

// Maps and lists nested deeper than this are refused before yaml-cpp reads the file: it
// recurses once per level and past about 500 levels (0.7) gives up with a bare "bad file",
// while a job file needs about six.
constexpr int kMaxNesting = 100;
// Merge keys resolved inside one another, and in all: bounds on anchors that merge themselves
// or chains of lists of aliases built to multiply the work.
constexpr int kMaxMergeDepth = 32;
constexpr int kMaxMerges = 10000;
// Kept free of a role's own env and command under the kernel's ARG_MAX: the variables Shoal
// adds (docs/environment.md; a few KiB even for a large job) and the environment the task
// inherits from where Shoal was started.
constexpr size_t kShoalEnvAllowance = 64 * 1024;

// The kernel refuses exec (E2BIG) for one argument or environment string ("NAME=value" with
// its NUL) longer than MAX_ARG_STRLEN, 32 pages.
size_t MaxArgStrlen() {
  long page = ::sysconf(_SC_PAGESIZE);
  return 32 * static_cast<size_t>(page > 0 ? page : 4096);
}

// What exec takes in all (strings, their NULs and pointers) for arguments and environment:
// a quarter of the stack limit, which the kernel caps at 6 MiB whatever the limit says.
size_t ArgMax() {
  constexpr size_t kKernelCap = 6 * 1024 * 1024;
  long n = ::sysconf(_SC_ARG_MAX);
  if (n <= 0) return 2 * 1024 * 1024;
  return std::min(static_cast<size_t>(n), kKernelCap);
}

// Bytes one string takes of ARG_MAX: its text, its NUL and its pointer in argv or envp.
size_t ExecBytes(size_t length) { return length + 1 + sizeof(char*); }

constexpr char kDurationForm[] = "a duration such as 500ms, 30s or 2m";
constexpr char kCheckpointDirForm[] =
    "a directory path, absolute or relative to the job file, or a URI such as hdfs://nn/ckpt";

constexpr char kCommandForm[] =
    "a non-empty list of strings (argv), e.g. [python3, train.py], or a non-empty string run "
    "by /bin/sh -c";

// User text as messages print it: control bytes (a NUL, a tab, an escape sequence) written as
// \x00, \t and so on, so that each problem stays one line of plain text whatever the file or
// its name holds.
std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

// "file:line" or just "file" when the line is unknown (0), as in hand-built specs.
std::string Where(absl::string_view source, int line) {
  std::string name = source.empty() ? std::string("job") : Printable(source);
  return line > 0 ? absl::StrCat(name, ":", line) : name;
}

std::string JoinKey(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// The YAML 1.2 core schema's booleans; YAML 1.1's yes/no/on/off are refused so that a country
// code or a stray "no" never turns into a bool by accident.
std::optional<bool> ParseBool(absl::string_view text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

std::optional<int64_t> ParseInt(absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

// A finite decimal number ("1", "0.5", "+2", "1e3"); not inf, nan or hex.
std::optional<double> ParseNumber(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value,
                                   std::chars_format::general);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest of `choices` within edit distance 2, for "did you mean" hints.
std::optional<absl::string_view> Closest(absl::string_view word,
                                        absl::Span<const absl::string_view> choices) {
  std::optional<absl::string_view> best;
  size_t best_distance = 3;
  std::string lower = absl::AsciiStrToLower(word);
  for (absl::string_view choice : choices) {
    size_t d = EditDistance(lower, choice);
    if (d < best_distance) {
      best_distance = d;
      best = choice;
    }
  }
  return best;
}

bool IsValidJobName(absl::string_view s) {
  if (s.empty() || s.size() > 63 || !absl::ascii_isalnum(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool IsValidRoleName(absl::string_view s) {
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

bool IsValidEnvName(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "?"; }

// A NUL ends a C string: a path, argument or variable holding one would be cut short at exec.
bool HasNul(absl::string_view text) { return text.find('\0') != absl::string_view::npos; }

constexpr char kNulMessage[] =
    "must not contain a NUL byte (\\x00): paths, arguments and environment variables end at "
    "the first one";

// How a value reads in "got ..." messages: numbers as written, other text quoted and cut short.
std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  std::string text = node.Scalar();
  if (IsPlainScalar(node) && ParseNumber(text)) return text;
  if (text.size() > 60) text = absl::StrCat(text.substr(0, 57), "...");
  return absl::StrCat("'", text, "'");
}

std::string FormatCount(double n) { return absl::StrFormat("%.6g", n); }

// Resolves `dir` against `base` and drops "." and ".." parts and any trailing '/'.
std::string ResolveDir(const std::string& base, const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.is_relative()) p = std::filesystem::path(base) / p;
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// "hdfs://nn/ckpt", "s3://bucket/x": a scheme of letters, digits, '+', '-' and '.' that starts
// with a letter, then "://".
bool HasUriScheme(absl::string_view s) {
  size_t colon = s.find("://");
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::all_of(s.begin(), s.begin() + colon, [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
  });
}

std::string AbsoluteBaseDir(const std::string& base_dir) {
  std::error_code ec;
  std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (ec) cwd = "/";
  if (base_dir.empty()) return ResolveDir(cwd.string(), ".");
  return ResolveDir(cwd.string(), base_dir);
}

struct TextSpot {
  int line = 0;    // 1-based
  int column = 0;  // 1-based
};

// Where `text` first nests maps and lists more than kMaxNesting deep. An estimate made before
// any YAML parsing, so that yaml-cpp never recurses that far: flow brackets outside quotes and
// comments, plus block levels from indentation and from "- " items opened on one line.
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

// The first tab in the indentation of a line at or before `last_line` (1-based) that holds
// more than whitespace and a comment: YAML forbids tabs there, and yaml-cpp then reports only
// a consequence such as "illegal map value".
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

struct DocumentCount {
  int count = 0;        // non-empty documents: 0, 1 or 2 (meaning two or more)
  int second_line = 0;  // where the second one starts
  // Set when the parser got stuck (see CountDocuments): where, and what it found there.
  std::optional<YAML::Mark> stuck_at;
  std::string stuck_on;
};

// Counts the non-empty documents of `text`, stopping at two. Not YAML::LoadAll: yaml-cpp 0.7
// gets stuck on a stray ',' outside brackets and LoadAll then adds a null document per turn
// until memory runs out (jbeder/yaml-cpp#1040, fixed upstream after 0.7). A document that
// starts where the previous one did is that stuck state, reported as the syntax error it is.
// Throws YAML::ParserException on other syntax errors.
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

// One `key: value` pair of a map, with the 1-based line of the key.
struct Entry {
  std::string key;
  YAML::Node key_node;
  YAML::Node value;
  int line = 0;
  // The value is, or lies inside, a value written elsewhere (an alias `*name`, or a map merged
  // with `<<`). yaml-cpp shares the anchored node, whose marks point at the anchor; messages
  // about anything inside must point at the use instead, which is `line`.
  bool aliased = false;
};

// A key that may be written at the job level, on a role, or both.
template <typename T>
struct Written {
  std::optional<T> value;  // set when written and valid
  int line = 0;            // 0: not written
  bool invalid() const { return line > 0 && !value.has_value(); }
};

// The failure-handling keys a role inherits from the job unless it writes its own.
struct FailureKeys {
  Written<OnFailure> on_failure;
  Written<RestartMode> restart;
  Written<uint32_t> max_restarts;
  Written<std::chrono::milliseconds> progress_timeout;
};

// Where cross-role checks point, kept beside each parsed role.
struct RoleSite {
  int depends_on_line = 0;
  std::vector<int> depends_on_item_lines;  // parallel to Role::depends_on
  FailureKeys failure;
  int instances_line = 0;
  bool instances_range = false;  // `instances` was written as {min, max}
};

// Parses one document into a JobSpec, collecting every problem instead of stopping at the first.
// Lives for one parse.
class Parser {
 public:
  Parser(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  absl::StatusOr<JobSpec> Parse(const std::string& text) {
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

 private:
  struct Problem {
    int line;
    std::string text;
  };

  void Error(int line, absl::string_view key, absl::string_view message) {
    std::string text = key.empty() ? absl::StrCat(Where(source_, line), ": ", message)
                                   : absl::StrCat(Where(source_, line), ": ", key, ": ", message);
    problems_.push_back({line, Printable(text)});
  }

  absl::Status Refuse(const std::string& only) {
    return absl::InvalidArgumentError(Printable(only));
  }

  absl::Status Refuse() {
    // Problems are found pass by pass (keys, then cross-role checks); the reader wants file order.
    std::stable_sort(problems_.begin(), problems_.end(),
                     [](const Problem& a, const Problem& b) { return a.line < b.line; });
    std::vector<std::string> lines;
    for (const auto& p : problems_) lines.push_back(p.text);
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }

  // A node's 1-based line; `fallback` for nulls, whose mark points past the key to the next
  // token, and for nodes without a mark.
  static int LineOf(const YAML::Node& node, int fallback) {
    if (!node.IsDefined() || node.IsNull()) return fallback;
    YAML::Mark mark = node.Mark();
    return mark.is_null() ? fallback : mark.line + 1;
  }

  // Whether `value` is an alias of a node anchored earlier in the file: yaml-cpp hands out the
  // anchored node itself, so its mark lies before the key that uses it, which never happens to
  // a value written in place.
  static bool IsAliasUse(const YAML::Node& value, const YAML::Node& user) {
    if (!value.IsDefined() || !user.IsDefined()) return false;
    YAML::Mark v = value.Mark(), u = user.Mark();
    return !v.is_null() && !u.is_null() && v.pos < u.pos;
  }

  // The line for messages about `holder`'s value itself (rather than its key): the use when the
  // value is aliased, else where the value is written.
  static int ValueLine(const Entry& holder) {
    return holder.aliased ? holder.line : LineOf(holder.value, holder.line);
  }

  // The line for messages about item `i` of the list `holder.value`: an aliased item (or any
  // item of an aliased list) is reported where the list is used.
  static int ItemLine(const Entry& holder, size_t i) {
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

  // YAML 1.1's merge key: a plain `<<` (not a quoted "<<", which is an ordinary key).
  static bool IsMergeKey(const YAML::Node& key) {
    return key.IsScalar() && key.Scalar() == "<<" &&
           (key.Tag() == "?" || key.Tag() == "tag:yaml.org,2002:merge");
  }

  // The pairs of the map `holder.value` in file order, with YAML 1.1 merge keys resolved: the
  // pairs of the map(s) named by `<<` take its place, except for keys the map writes itself
  // (those win wherever they stand) and, with a list `<<: [*a, *b]`, keys an earlier map of the
  // list gave already. Reports keys that are not plain text and keys given more than once
  // (yaml-cpp keeps both pairs); only the first of a repeated key is returned.
  std::vector<Entry> Entries(const Entry& holder, absl::string_view path, bool are_roles) {
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

  // The pairs a merge key `<<` brings in, in precedence order, each reported at the `<<` line.
  std::vector<Entry> Merged(const Entry& merge, absl::string_view path, bool are_roles) {
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

  // Reports keys outside `accepted`, with a hint when one is a likely misspelling.
  void CheckKnownKeys(const std::vector<Entry>& entries, absl::string_view path,
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

  static const Entry* Find(const std::vector<Entry>& entries, absl::string_view key) {
    for (const auto& e : entries) {
      if (e.key == key) return &e;
    }
    return nullptr;
  }

  // The scalar text of `e.value`, or nullopt after reporting that it must be `expected`.
  std::optional<std::string> Scalar(const Entry& e, absl::string_view key,
                                    absl::string_view expected) {
    if (e.value.IsScalar()) return e.value.Scalar();
    Error(e.line, key, absl::StrCat("must be ", expected, ", got ", Describe(e.value)));
    return std::nullopt;
  }

  // An integer in [min, max] from `e.value`, or nullopt after reporting what was expected.
  std::optional<int64_t> Integer(const Entry& e, const std::string& key, int64_t min,
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

  // A duration (common/duration.h) from `e.value`, or nullopt after reporting.
  std::optional<std::chrono::milliseconds> Duration(const Entry& e, const std::string& key) {
    std::optional<std::chrono::milliseconds> d =
        e.value.IsScalar() ? ParseDuration(e.value.Scalar()) : std::nullopt;
    if (!d) {
      Error(e.line, key, absl::StrCat("must be ", kDurationForm, ", got ", Describe(e.value)));
    }
    return d;
  }

  // One of `values`, written as its name, or nullopt after reporting the accepted names.
  template <typename Enum, size_t N>
  std::optional<Enum> Choice(const Entry& e, const std::string& key, const Enum (&values)[N],
                             const char* (*name)(Enum)) {
    std::vector<absl::string_view> names;
    for (Enum v : values) names.push_back(name(v));
    std::string accepted = absl::StrJoin(names, ", ");
    if (!e.value.IsScalar()) {
      Error(e.line, key, absl::StrCat("must be one of ", accepted, ", got ", Describe(e.value)));
      return std::nullopt;
    }
    for (size_t i = 0; i < N; ++i) {
      if (e.value.Scalar() == names[i]) return values[i];
    }
    std::string hint;
    if (auto closest = Closest(e.value.Scalar(), names)) {
      hint = absl::StrCat(" did you mean '", *closest, "'?");
    }
    Error(e.line, key,
          absl::StrCat("unknown value ", Describe(e.value), ";", hint, " accepted values: ",
                       accepted));
    return std::nullopt;
  }

  // on_failure, restart, max_restarts and progress_timeout of the map at `path` ("" for the
  // job itself, "roles.<name>" for a role).
  void ParseFailureKeys(const std::vector<Entry>& entries, absl::string_view path,
                        FailureKeys& out) {
    if (const Entry* e = Find(entries, "on_failure")) {
      out.on_failure.line = e->line;
      out.on_failure.value =
          Choice(*e, JoinKey(path, "on_failure"), kOnFailureValues, OnFailureName);
    }
    if (const Entry* e = Find(entries, "restart")) {
      out.restart.line = e->line;
      out.restart.value = Choice(*e, JoinKey(path, "restart"), kRestartValues, RestartModeName);
    }
    if (const Entry* e = Find(entries, "max_restarts")) {
      out.max_restarts.line = e->line;
      if (auto n = Integer(*e, JoinKey(path, "max_restarts"), 0, kMaxCount)) {
        out.max_restarts.value = static_cast<uint32_t>(*n);
      }
    }
    if (const Entry* e = Find(entries, "progress_timeout")) {
      out.progress_timeout.line = e->line;
      out.progress_timeout.value = Duration(*e, JoinKey(path, "progress_timeout"));
    }
  }

  void ParseTop(const YAML::Node& root, JobSpec& spec) {
    std::vector<Entry> entries = Entries(Entry{"", root, root, 1}, "", false);
    CheckKnownKeys(entries, "", kTopKeys);

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
    if (const Entry* e = Find(entries, "slurm")) ParseSlurm(*e, spec.slurm);
    if (const Entry* e = Find(entries, "yarn")) ParseYarn(*e, spec.yarn);
    if (const Entry* e = Find(entries, "tensorboard")) ParseTensorBoard(*e, spec.tensorboard);
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

    bool mpi = spec.framework == Framework::kMpi && roles_entry != nullptr;
    if (mpi) CheckMpiRoles(*roles_entry, sites, spec);
    CheckDependencies(spec, sites);
    ParseSuccess(Find(entries, "success"), roles_entry, spec);
    ResolveFailureHandling(job_failure, sites, spec);
    if (mpi) CheckMpiNotElastic(spec);
  }

  Role ParseRole(const Entry& r, RoleSite& site) {
    Role role;
    role.name = r.key;
    role.line = r.line;
    const std::string path = JoinKey("roles", r.key);
    if (!IsValidRoleName(r.key)) {
      Error(r.line, path,
            "role names must start with a letter and hold only letters, digits, '_' and '-'");
    }
    if (!r.value.IsMap()) {
      Error(r.line, path,
            absl::StrCat("must be a map with at least 'command', e.g. {command: [python3, "
                         "train.py]}, got ",
                         Describe(r.value)));
      return role;
    }
    std::vector<Entry> entries = Entries(r, path, false);
    CheckKnownKeys(entries, path, kRoleKeys);

    if (const Entry* e = Find(entries, "instances")) {
      std::string key = JoinKey(path, "instances");
      site.instances_line = e->line;
      role.instances_line = e->line;
      if (e->value.IsMap()) {
        site.instances_range = true;
        ParseInstancesRange(*e, key, role);
      } else if (!e->value.IsScalar()) {
        Error(e->line, key,
              absl::StrCat("must be an integer >= 1, or {min: 2, max: 4} for an elastic role, "
                           "got ",
                           Describe(e->value)));
      } else if (auto n = Integer(*e, key, 1, kMaxInstances)) {
        role.instances = static_cast<uint32_t>(*n);
      }
    }

    bool mpi_worker = framework_ == Framework::kMpi && r.key == kMpiWorker;
    if (const Entry* e = Find(entries, "command")) {
      if (mpi_worker) {
        Error(e->line, JoinKey(path, "command"),
              "framework: mpi runs Shoal's MPI host in the worker tasks, which mpirun starts the "
              "ranks in; remove this command and put the MPI program in the launcher's command");
      } else {
        ParseCommand(*e, JoinKey(path, "command"), role);
      }
    } else if (!mpi_worker) {
      Error(r.line, JoinKey(path, "command"), absl::StrCat("required; expected ", kCommandForm));
    }

    const Entry* env = Find(entries, "env");
    if (env != nullptr) ParseEnv(*env, JoinKey(path, "env"), role);
    CheckExecSize(env, Find(entries, "command"), path, role);

    role.working_dir = base_dir_;
    if (const Entry* e = Find(entries, "working_dir")) {
      std::string key = JoinKey(path, "working_dir");
      constexpr char kForm[] = "a directory path, absolute or relative to the job file";
      if (auto text = Scalar(*e, key, kForm)) {
        if (text->empty()) {
          Error(e->line, key, absl::StrCat("must be ", kForm, ", got ''"));
        } else if ((*text)[0] == '~') {
          Error(e->line, key,
                absl::StrCat("'~' is not expanded; must be ", kForm, ", got ", Describe(e->value)));
        } else if (HasNul(*text)) {
          Error(e->line, key, kNulMessage);
        } else {
          role.working_dir = ResolveDir(base_dir_, *text);
        }
      }
    }

    if (const Entry* e = Find(entries, "resources")) {
      ParseResources(*e, JoinKey(path, "resources"), role);
    }

    if (const Entry* e = Find(entries, "untracked")) {
      std::string key = JoinKey(path, "untracked");
      std::optional<bool> b = e->value.IsScalar() ? ParseBool(e->value.Scalar()) : std::nullopt;
      if (b) {
        role.untracked = *b;
      } else {
        Error(e->line, key, absl::StrCat("must be true or false, got ", Describe(e->value)));
      }
    }

    if (const Entry* e = Find(entries, "depends_on")) {
      std::string key = JoinKey(path, "depends_on");
      site.depends_on_line = e->line;
      if (e->value.IsSequence()) {
        for (size_t i = 0; i < e->value.size(); ++i) {
          YAML::Node item = e->value[i];
          int line = ItemLine(*e, i);
          if (!item.IsScalar()) {
            Error(line, absl::StrCat(key, "[", i, "]"),
                  absl::StrCat("must be a role name, got ", Describe(item)));
            continue;
          }
          // Naming a role twice changes nothing; keep the first.
          if (std::find(role.depends_on.begin(), role.depends_on.end(), item.Scalar()) !=
              role.depends_on.end()) {
            continue;
          }
          role.depends_on.push_back(item.Scalar());
          site.depends_on_item_lines.push_back(line);
        }
      } else if (!e->value.IsNull()) {
        Error(e->line, key,
              absl::StrCat("must be a list of role names, e.g. [ps], got ", Describe(e->value)));
      }
    }

    ParseFailureKeys(entries, path, site.failure);
    return role;
  }

  // `instances: {min: 2, max: 4}`; whether the role may be elastic is checked once on_failure
  // is resolved (ResolveFailureHandling).
  void ParseInstancesRange(const Entry& e, const std::string& key, Role& role) {
    std::vector<Entry> entries = Entries(e, key, false);
    CheckKnownKeys(entries, key, kInstancesKeys);
    std::optional<int64_t> bounds[2];
    const Entry* written[2] = {Find(entries, "min"), Find(entries, "max")};
    for (int i = 0; i < 2; ++i) {
      std::string bound_key = JoinKey(key, kInstancesKeys[i]);
      if (written[i] == nullptr) {
        Error(e.line, bound_key, "required; expected an integer >= 1, e.g. {min: 2, max: 4}");
      } else {
        bounds[i] = Integer(*written[i], bound_key, 1, kMaxInstances);
      }
    }
    if (!bounds[0] || !bounds[1]) return;
    if (*bounds[0] > *bounds[1]) {
      Error(written[0]->line, JoinKey(key, "min"),
            absl::StrCat("must not be more than max (", *bounds[1], "), got ", *bounds[0]));
      return;
    }
    role.min_instances = static_cast<uint32_t>(*bounds[0]);
    role.max_instances = static_cast<uint32_t>(*bounds[1]);
    role.instances = role.max_instances;
  }

  void ParseBackoff(const Entry& e, Backoff& out) {
    const std::string path = "backoff";
    if (e.value.IsNull()) return;
    if (!e.value.IsMap()) {
      Error(e.line, path,
            absl::StrCat("must be a map with initial and/or max, e.g. {initial: 1s, max: 30s}, "
                         "got ",
                         Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e, path, false);
    CheckKnownKeys(entries, path, kBackoffKeys);
    const Entry* initial = Find(entries, "initial");
    const Entry* max = Find(entries, "max");
    bool ok = true;
    if (initial != nullptr) {
      auto d = Duration(*initial, JoinKey(path, "initial"));
      if (d) out.initial = *d;
      ok = ok && d.has_value();
    }
    if (max != nullptr) {
      auto d = Duration(*max, JoinKey(path, "max"));
      if (d) out.max = *d;
      ok = ok && d.has_value();
    }
    if (!ok || out.max >= out.initial) return;
    // Point at the key that was written; when both were, at max.
    if (max != nullptr) {
      Error(max->line, JoinKey(path, "max"),
            absl::StrCat("must be at least initial (", FormatDuration(out.initial),
                         initial == nullptr ? ", the default" : "", "), got ",
                         FormatDuration(out.max)));
    } else {
      Error(initial->line, JoinKey(path, "initial"),
            absl::StrCat("must be at most max (", FormatDuration(out.max), ", the default), got ",
                         FormatDuration(out.initial)));
    }
  }

  void ParseHeartbeat(const Entry& e, HeartbeatConfig& out) {
    const std::string path = "heartbeat";
    if (e.value.IsNull()) return;
    if (!e.value.IsMap()) {
      Error(e.line, path,
            absl::StrCat("must be a map with interval and/or misses, e.g. {interval: 1s, misses: "
                         "3}, got ",
                         Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e, path, false);
    CheckKnownKeys(entries, path, kHeartbeatKeys);
    if (const Entry* i = Find(entries, "interval")) {
      std::string key = JoinKey(path, "interval");
      if (auto d = Duration(*i, key)) {
        if (*d < kMinHeartbeatInterval) {
          Error(i->line, key,
                absl::StrCat("must be at least ", FormatDuration(kMinHeartbeatInterval), ", got ",
                             FormatDuration(*d)));
        } else {
          out.interval = *d;
        }
      }
    }
    if (const Entry* m = Find(entries, "misses")) {
      if (auto n = Integer(*m, JoinKey(path, "misses"), 1, kMaxCount)) {
        out.misses = static_cast<uint32_t>(*n);
      }
    }
  }

  void ParseCheckpoint(const Entry& e, CheckpointConfig& out) {
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

  void ParseMpi(const Entry& e, JobSpec& spec) {
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

  // The shape of Kubeflow's MPIJob: one `launcher` that runs mpirun, and `worker` tasks that
  // only host ranks. The workers never end by themselves (untracked); the launcher starts once
  // they all run; an MPI world cannot change size, so neither role is elastic.
  void CheckMpiRoles(const Entry& roles_entry, std::vector<RoleSite>& sites, JobSpec& spec) {
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

  void CheckMpiNotElastic(const JobSpec& spec) {
    for (const Role& r : spec.roles) {
      if ((r.name == kMpiLauncher || r.name == kMpiWorker) &&
          (r.on_failure == OnFailure::kElastic || r.min_instances != 0)) {
        Error(r.line, JoinKey("roles", r.name),
              "an MPI world cannot change size while it runs, so framework: mpi roles cannot be "
              "elastic; use on_failure: restart-group to restart the whole world");
      }
    }
  }

  void ParseTensorBoard(const Entry& e, TensorBoardConfig& out) {
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

  void ParseSlurm(const Entry& e, SlurmConfig& out) {
    const std::string path = "slurm";
    if (!e.value.IsMap()) {
      Error(e.line, path,
            absl::StrCat("must be a map with partition, account, time_limit and/or constraint, "
                         "e.g. {partition: gpu, time_limit: 2h}, got ",
                         Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e, path, false);
    CheckKnownKeys(entries, path, kSlurmKeys);
    // Slurm names: letters, digits and -_.,:= (a constraint also takes &|[]*()!); anything else
    // would reach srun's argument parser and fail there with a less helpful message.
    auto name = [&](const char* key, std::string& into, absl::string_view extra) {
      const Entry* v = Find(entries, key);
      if (v == nullptr) return;
      std::string full = JoinKey(path, key);
      auto text = Scalar(*v, full, "a Slurm name, e.g. gpu");
      if (!text) return;
      bool ok = !text->empty();
      for (char c : *text) {
        if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
            std::string_view("-_.,:=").find(c) == std::string_view::npos &&
            extra.find(c) == absl::string_view::npos) {
          ok = false;
        }
      }
      if (!ok) {
        Error(v->line, full, absl::StrCat("must be a Slurm name (letters, digits, -_.,:=), got ",
                                          Describe(v->value)));
        return;
      }
      into = *text;
    };
    name("partition", out.partition, "");
    name("account", out.account, "");
    name("constraint", out.constraint, "&|[]*()!");
    if (const Entry* t = Find(entries, "time_limit")) {
      if (auto d = Duration(*t, JoinKey(path, "time_limit"))) {
        if (d->count() < 60000) {
          Error(t->line, JoinKey(path, "time_limit"),
                absl::StrCat("must be at least 1m (Slurm counts whole minutes), got ",
                             Describe(t->value)));
        } else {
          out.time_limit = *d;
        }
      }
    }
  }

  void ParseYarn(const Entry& e, YarnConfig& out) {
    const std::string path = "yarn";
    if (!e.value.IsMap()) {
      Error(e.line, path,
            absl::StrCat("must be a map with queue and/or node_label, e.g. {queue: ml, "
                         "node_label: gpu}, got ",
                         Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e, path, false);
    CheckKnownKeys(entries, path, kYarnKeys);
    // YARN's queue paths (root.ml.team) and label expressions (gpu, a&&b): anything else would
    // only fail later, inside the ResourceManager, with a less helpful message.
    auto name = [&](const char* key, std::string& into, absl::string_view extra,
                    const char* form) {
      const Entry* v = Find(entries, key);
      if (v == nullptr) return;
      std::string full = JoinKey(path, key);
      auto text = Scalar(*v, full, form);
      if (!text) return;
      bool ok = !text->empty();
      for (char c : *text) {
        if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
            std::string_view("-_.").find(c) == std::string_view::npos &&
            extra.find(c) == absl::string_view::npos) {
          ok = false;
        }
      }
      if (!ok) {
        Error(v->line, full, absl::StrCat("must be ", form, ", got ", Describe(v->value)));
        return;
      }
      into = *text;
    };
    name("queue", out.queue, "", "a YARN queue name (letters, digits, -_.), e.g. root.ml");
    name("node_label", out.node_label, "&|!() ",
         "a YARN node label expression (letters, digits, -_. and &|!()), e.g. gpu");
  }

  void ParseDataset(const Entry& e, DatasetConfig& out) {
    const std::string path = "dataset";
    out.configured = true;
    constexpr char kForms[] =
        "either shards (a list of files, e.g. [a.npz, b.npz]) or samples and shard_size (e.g. "
        "samples: 1797, shard_size: 64)";
    if (!e.value.IsMap()) {
      Error(e.line, path, absl::StrCat("must be a map with ", kForms, ", got ", Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e, path, false);
    CheckKnownKeys(entries, path, kDatasetKeys);
    const Entry* shards = Find(entries, "shards");
    const Entry* samples = Find(entries, "samples");
    const Entry* shard_size = Find(entries, "shard_size");

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

    if (shards != nullptr && samples != nullptr) {
      // Reported at whichever of the two comes second.
      const Entry* later = shards->line > samples->line ? shards : samples;
      const Entry* earlier = later == shards ? samples : shards;
      Error(later->line, JoinKey(path, later->key),
            absl::StrCat("cannot be given together with ", JoinKey(path, earlier->key),
                         " (line ", earlier->line, "); a dataset is ", kForms));
    } else if (shards != nullptr && shard_size != nullptr) {
      Error(shard_size->line, JoinKey(path, "shard_size"),
            "only goes with samples; with shards each file is one shard, so drop it");
    } else if (shards == nullptr && samples == nullptr) {
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

  void ParseShards(const Entry& e, const std::string& key, DatasetConfig& out) {
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

  // Fills each role's failure handling from its own keys, else the job's, else the defaults, and
  // refuses combinations that cannot work. REQUIRES: ParseSuccess has run, since restart: always
  // depends on which roles decide success.
  void ResolveFailureHandling(const FailureKeys& job, const std::vector<RoleSite>& sites,
                              JobSpec& spec) {
    spec.on_failure = job.on_failure.value.value_or(OnFailure::kFailJob);
    // A pair written at the job level is checked once here, not again for each role using it.
    if (job.restart.value && !job.on_failure.invalid()) {
      CheckRestart(*job.restart.value, job.restart.line, "restart", spec.on_failure,
                   job.on_failure.line > 0 ? "" : " (the default)");
    }

    for (size_t i = 0; i < spec.roles.size(); ++i) {
      Role& role = spec.roles[i];
      const FailureKeys& own = sites[i].failure;
      const std::string path = JoinKey("roles", role.name);

      const bool own_on_failure = own.on_failure.line > 0;
      const Written<OnFailure>& on_failure = own_on_failure ? own.on_failure : job.on_failure;
      const bool on_failure_known = !on_failure.invalid();  // a bad value is reported already
      role.on_failure = on_failure.value.value_or(OnFailure::kFailJob);
      // Where the role's on_failure comes from, for messages about another key.
      std::string origin = " (the default)";
      if (own_on_failure) {
        origin = absl::StrCat(" (", path, ".on_failure, line ", on_failure.line, ")");
      } else if (on_failure.line > 0) {
        origin = absl::StrCat(" (set on the job, line ", on_failure.line, ")");
      }

      const bool own_restart = own.restart.line > 0;
      const Written<RestartMode>& restart = own_restart ? own.restart : job.restart;
      role.restart = restart.value.value_or(role.on_failure == OnFailure::kFailJob
                                                ? RestartMode::kNever
                                                : RestartMode::kOnFailure);
      if (restart.value && on_failure_known) {
        const std::string restart_key = own_restart ? JoinKey(path, "restart") : "restart";
        if (own_restart || own_on_failure) {
          CheckRestart(*restart.value, restart.line, restart_key, role.on_failure,
                       own_restart && own_on_failure ? "" : origin);
        }
        if (*restart.value == RestartMode::kAlways &&
            role.on_failure == OnFailure::kRestartTask && DecidesSuccess(spec, role.name)) {
          Error(restart.line, restart_key,
                absl::StrCat("restart: always cannot apply to role ", role.name,
                             ", which decides whether the job succeeded (success roles: ",
                             absl::StrJoin(spec.success_roles, ", "),
                             "): a task that always restarts never finishes, so it could not "
                             "decide success; use restart: on-failure for it"));
        }
      }

      role.max_restarts =
          (own.max_restarts.line > 0 ? own.max_restarts : job.max_restarts)
              .value.value_or(role.max_restarts);
      role.progress_timeout =
          (own.progress_timeout.line > 0 ? own.progress_timeout : job.progress_timeout)
              .value.value_or(role.progress_timeout);

      if (sites[i].instances_range) {
        if (on_failure_known && role.on_failure != OnFailure::kElastic) {
          Error(sites[i].instances_line, JoinKey(path, "instances"),
                absl::StrCat("{min, max} is only allowed with on_failure: elastic, got "
                             "on_failure: ",
                             OnFailureName(role.on_failure), origin,
                             "; write a plain integer, or set on_failure: elastic"));
        }
      } else if (role.on_failure == OnFailure::kElastic) {
        role.min_instances = role.instances;
        role.max_instances = role.instances;
      }
    }
  }

  // Refuses `restart` values that `on_failure` cannot honour. `origin` says where on_failure
  // was set when that is not beside the restart key, e.g. " (set on the job, line 2)".
  void CheckRestart(RestartMode restart, int line, const std::string& key, OnFailure on_failure,
                    absl::string_view origin) {
    if (restart == RestartMode::kNever && on_failure != OnFailure::kFailJob) {
      Error(line, key,
            absl::StrCat("restart: never contradicts on_failure: ", OnFailureName(on_failure),
                         origin, "; drop one of them"));
    } else if (restart == RestartMode::kAlways && on_failure != OnFailure::kRestartTask) {
      Error(line, key,
            absl::StrCat("restart: always needs on_failure: restart-task, got on_failure: ",
                         OnFailureName(on_failure), origin,
                         "; only a task restarted on its own may start again after exiting 0 (a "
                         "service such as an evaluator loop); use restart: on-failure"));
    }
  }

  static bool DecidesSuccess(const JobSpec& spec, const std::string& role) {
    return std::find(spec.success_roles.begin(), spec.success_roles.end(), role) !=
           spec.success_roles.end();
  }

  // One argument of a task's command: no NUL, and within the kernel's limit for one string.
  bool CheckArgument(int line, const std::string& key, const std::string& text) {
    if (HasNul(text)) {
      Error(line, key, kNulMessage);
      return false;
    }
    if (text.size() + 1 > MaxArgStrlen()) {
      Error(line, key,
            absl::StrCat("is ", text.size(), " bytes; the kernel refuses to start a program with "
                         "an argument of more than ",
                         MaxArgStrlen() - 1,
                         " bytes (MAX_ARG_STRLEN); pass large data in a file instead"));
      return false;
    }
    return true;
  }

  void ParseCommand(const Entry& e, const std::string& key, Role& role) {
    if (e.value.IsSequence()) {
      if (e.value.size() == 0) {
        Error(e.line, key, absl::StrCat("must not be empty; expected ", kCommandForm));
        return;
      }
      std::vector<std::string> argv;
      bool ok = true;
      for (size_t i = 0; i < e.value.size(); ++i) {
        YAML::Node item = e.value[i];
        if (!item.IsScalar()) {
          Error(ItemLine(e, i), absl::StrCat(key, "[", i, "]"),
                absl::StrCat("must be a string, got ", Describe(item)));
          ok = false;
          continue;
        }
        if (!CheckArgument(ItemLine(e, i), absl::StrCat(key, "[", i, "]"), item.Scalar())) {
          ok = false;
          continue;
        }
        argv.push_back(item.Scalar());
      }
      if (ok && absl::StripAsciiWhitespace(argv[0]).empty()) {
        Error(ItemLine(e, 0), absl::StrCat(key, "[0]"),
              absl::StrCat("the program must not be empty or blank, e.g. python3, got ",
                           Describe(e.value[0])));
        ok = false;
      }
      if (ok) role.argv = std::move(argv);
      return;
    }
    // A bare number is a slip (a value meant for another key), not a program to run.
    if (e.value.IsScalar() && !(IsPlainScalar(e.value) && ParseNumber(e.value.Scalar()))) {
      if (absl::StripAsciiWhitespace(e.value.Scalar()).empty()) {
        Error(e.line, key, absl::StrCat("must not be empty; expected ", kCommandForm));
      } else if (CheckArgument(e.line, key, e.value.Scalar())) {
        role.shell = e.value.Scalar();
      }
      return;
    }
    Error(e.line, key, absl::StrCat("must be ", kCommandForm, ", got ", Describe(e.value)));
  }

  // Refuses a role whose env and command together would not fit what exec takes (ARG_MAX),
  // leaving kShoalEnvAllowance for what Shoal adds; reported at env, or at command without one.
  void CheckExecSize(const Entry* env, const Entry* command, const std::string& path,
                     const Role& role) {
    if (env == nullptr && command == nullptr) return;
    size_t bytes = 0;
    for (const auto& [name, value] : role.env) bytes += ExecBytes(name.size() + 1 + value.size());
    for (const std::string& arg : role.argv) bytes += ExecBytes(arg.size());
    if (!role.shell.empty()) bytes += ExecBytes(7) + ExecBytes(2) + ExecBytes(role.shell.size());
    size_t limit = ArgMax();
    if (bytes + kShoalEnvAllowance <= limit) return;
    const Entry* at = env != nullptr ? env : command;
    Error(at->line, JoinKey(path, at->key),
          absl::StrCat("the role's env and command take ", bytes, " bytes; with the ",
                       kShoalEnvAllowance / 1024,
                       "KiB kept for the variables Shoal adds that is over this machine's limit "
                       "of ",
                       limit,
                       " bytes for a program's arguments and environment (ARG_MAX); pass large "
                       "data in a file instead"));
  }

  void ParseEnv(const Entry& e, const std::string& key, Role& role) {
    if (e.value.IsNull()) return;
    if (!e.value.IsMap()) {
      Error(e.line, key,
            absl::StrCat("must be a map of NAME: value, e.g. {OMP_NUM_THREADS: \"1\"}, got ",
                         Describe(e.value)));
      return;
    }
    for (const Entry& v : Entries(e, key, false)) {
      std::string var_key = JoinKey(key, v.key);
      if (!IsValidEnvName(v.key)) {
        Error(v.line, var_key,
              "variable names must hold only letters, digits and '_' and not start with a digit");
        continue;
      }
      // Refused rather than overridden in silence: the task would run with Shoal's value.
      if (std::optional<std::string> why = WhyReserved(v.key)) {
        Error(v.line, var_key, *why);
        continue;
      }
      if (v.value.IsScalar() && HasNul(v.value.Scalar())) {
        Error(v.line, var_key, kNulMessage);
        continue;
      }
      // "NAME=value" and its NUL, as the kernel counts it.
      if (v.value.IsScalar() && v.key.size() + v.value.Scalar().size() + 2 > MaxArgStrlen()) {
        Error(v.line, var_key,
              absl::StrCat("NAME=value is ", v.key.size() + v.value.Scalar().size() + 1,
                           " bytes; the kernel refuses to start a program with an environment "
                           "variable of more than ",
                           MaxArgStrlen() - 1,
                           " bytes (MAX_ARG_STRLEN); pass large data in a file instead"));
        continue;
      }
      if (!v.value.IsScalar()) {
        Error(ValueLine(v), var_key,
              absl::StrCat("must be a string, number or bool (write \"\" for an empty value), "
                           "got ",
                           Describe(v.value)));
        continue;
      }
      // Numbers and bools keep the text as written: 1.50 stays "1.50", not "1.5".
      role.env[v.key] = v.value.Scalar();
    }
  }

  void ParseResources(const Entry& e, const std::string& path, Role& role) {
    if (e.value.IsNull()) return;
    if (!e.value.IsMap()) {
      Error(e.line, path,
            absl::StrCat("must be a map with cpus, memory and/or gpus, e.g. {cpus: 2, memory: "
                         "4GiB}, got ",
                         Describe(e.value)));
      return;
    }
    std::vector<Entry> entries = Entries(e, path, false);
    CheckKnownKeys(entries, path, kResourceKeys);

    if (const Entry* c = Find(entries, "cpus")) {
      role.resource_lines.cpus = c->line;
      std::optional<double> n = c->value.IsScalar() ? ParseNumber(c->value.Scalar()) : std::nullopt;
      if (n && *n > 0) {
        role.resources.cpus = *n;
      } else {
        Error(c->line, JoinKey(path, "cpus"),
              absl::StrCat("must be a number > 0 (fractions allowed, e.g. 0.5 or 4), got ",
                           Describe(c->value)));
      }
    }

    if (const Entry* m = Find(entries, "memory")) {
      role.resource_lines.memory = m->line;
      std::string key = JoinKey(path, "memory");
      if (!m->value.IsScalar()) {
        Error(m->line, key,
              absl::StrCat("must be a size, e.g. 512MiB, 2GiB, 1.5G, 4GB, got ",
                           Describe(m->value)));
      } else {
        absl::StatusOr<uint64_t> bytes = ParseByteSize(m->value.Scalar());
        if (bytes.ok() && *bytes == 0) {
          Error(m->line, key,
                absl::StrCat("must be more than 0, got ", Describe(m->value),
                             "; leave the key out for no memory limit"));
        } else if (bytes.ok()) {
          role.resources.memory_bytes = *bytes;
        } else {
          Error(m->line, key, bytes.status().message());
        }
      }
    }

    if (const Entry* g = Find(entries, "gpus")) {
      role.resource_lines.gpus = g->line;
      std::string key = JoinKey(path, "gpus");
      std::optional<int64_t> n = g->value.IsScalar() ? ParseInt(g->value.Scalar()) : std::nullopt;
      if (!n || *n < 0) {
        Error(g->line, key, absl::StrCat("must be an integer >= 0, got ", Describe(g->value)));
      } else if (*n > kMaxGpusPerTask) {
        Error(g->line, key, absl::StrCat("must be at most ", kMaxGpusPerTask, ", got ", *n));
      } else {
        role.resources.gpus = static_cast<uint32_t>(*n);
      }
    }
  }

  // Unknown names, self-dependencies and cycles among depends_on lists.
  void CheckDependencies(const JobSpec& spec, const std::vector<RoleSite>& sites) {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < spec.roles.size(); ++i) index.emplace(spec.roles[i].name, i);
    std::vector<std::string> names;
    for (const auto& r : spec.roles) names.push_back(r.name);

    // Edges that name a known other role; only those can form cycles.
    std::vector<std::vector<size_t>> edges(spec.roles.size());
    for (size_t i = 0; i < spec.roles.size(); ++i) {
      const Role& role = spec.roles[i];
      std::string key = JoinKey(JoinKey("roles", role.name), "depends_on");
      for (size_t j = 0; j < role.depends_on.size(); ++j) {
        const std::string& dep = role.depends_on[j];
        int line = sites[i].depends_on_item_lines[j];
        auto it = index.find(dep);
        if (dep == role.name) {
          Error(line, key, absl::StrCat("role '", dep, "' cannot depend on itself"));
        } else if (it == index.end()) {
          Error(line, key,
                absl::StrCat("'", dep, "' is not a role of this job; roles are: ",
                             absl::StrJoin(names, ", ")));
        } else {
          edges[i].push_back(it->second);
        }
      }
    }

    // Iterative depth-first search: a long chain of roles must not exhaust the stack.
    enum Color { kWhite, kGrey, kBlack };
    std::vector<Color> color(spec.roles.size(), kWhite);
    std::set<std::set<size_t>> reported;
    for (size_t start = 0; start < spec.roles.size(); ++start) {
      if (color[start] != kWhite) continue;
      std::vector<std::pair<size_t, size_t>> stack = {{start, 0}};  // node, next edge
      color[start] = kGrey;
      while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next == edges[node].size()) {
          color[node] = kBlack;
          stack.pop_back();
          continue;
        }
        size_t to = edges[node][next++];
        if (color[to] == kWhite) {
          color[to] = kGrey;
          stack.push_back({to, 0});
        } else if (color[to] == kGrey) {
          std::vector<size_t> cycle;
          auto from = std::find_if(stack.begin(), stack.end(),
                                   [to](const auto& frame) { return frame.first == to; });
          for (auto f = from; f != stack.end(); ++f) cycle.push_back(f->first);
          ReportCycle(spec, sites, cycle, reported);
        }
      }
    }
  }

  void ReportCycle(const JobSpec& spec, const std::vector<RoleSite>& sites,
                   std::vector<size_t> cycle, std::set<std::set<size_t>>& reported) {
    if (!reported.insert(std::set<size_t>(cycle.begin(), cycle.end())).second) return;
    // Start the cycle at the role written first, and report it there.
    std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
    std::vector<std::string> names;
    for (size_t i : cycle) names.push_back(spec.roles[i].name);
    names.push_back(spec.roles[cycle[0]].name);
    const Role& first = spec.roles[cycle[0]];
    Error(sites[cycle[0]].depends_on_line, JoinKey(JoinKey("roles", first.name), "depends_on"),
          absl::StrCat("roles depend on each other in a cycle (", absl::StrJoin(names, " -> "),
                       "), so none of them could ever start"));
  }

  void ParseSuccess(const Entry* success, const Entry* roles_entry, JobSpec& spec) {
    std::vector<std::string> tracked;
    for (const auto& r : spec.roles) {
      if (!r.untracked) tracked.push_back(r.name);
    }
    if (!spec.roles.empty() && tracked.empty()) {
      Error(roles_entry->line, "roles",
            "every role is untracked, so nothing could decide whether the job succeeded; leave "
            "at least one role tracked (untracked: false)");
    }

    bool given = false;
    if (success != nullptr && !success->value.IsNull()) {
      if (!success->value.IsMap()) {
        Error(success->line, "success",
              absl::StrCat("must be a map, e.g. {roles: [worker]}, got ",
                           Describe(success->value)));
        return;
      }
      std::vector<Entry> entries = Entries(*success, "success", false);
      CheckKnownKeys(entries, "success", kSuccessKeys);
      if (const Entry* e = Find(entries, "roles"); e != nullptr && !e->value.IsNull()) {
        given = true;
        ParseSuccessRoles(*e, spec, tracked);
      }
    }
    if (given) return;
    // The default: a chief speaks for the job; without one, every tracked role must succeed.
    const Role* chief = spec.FindRole("chief");
    if (chief != nullptr && !chief->untracked) {
      spec.success_roles = {"chief"};
    } else {
      spec.success_roles = tracked;
    }
  }

  void ParseSuccessRoles(const Entry& e, JobSpec& spec, const std::vector<std::string>& tracked) {
    const std::string key = "success.roles";
    if (!e.value.IsSequence()) {
      Error(e.line, key,
            absl::StrCat("must be a list of role names, e.g. [worker], got ", Describe(e.value)));
      return;
    }
    if (e.value.size() == 0) {
      Error(e.line, key, "must name at least one role, e.g. [worker]; omit it for the default");
      return;
    }
    for (size_t i = 0; i < e.value.size(); ++i) {
      YAML::Node item = e.value[i];
      int line = ItemLine(e, i);
      if (!item.IsScalar()) {
        Error(line, absl::StrCat(key, "[", i, "]"),
              absl::StrCat("must be a role name, got ", Describe(item)));
        continue;
      }
      const std::string& name = item.Scalar();
      const Role* role = spec.FindRole(name);
      if (role == nullptr) {
        std::vector<std::string> names;
        for (const auto& r : spec.roles) names.push_back(r.name);
        Error(line, key,
              absl::StrCat("'", name, "' is not a role of this job; roles are: ",
                           absl::StrJoin(names, ", ")));
      } else if (role->untracked) {
        Error(line, key,
              absl::StrCat("'", name,
                           "' is untracked, so it cannot decide success; tracked roles are: ",
                           absl::StrJoin(tracked, ", ")));
      } else if (std::find(spec.success_roles.begin(), spec.success_roles.end(), name) ==
                 spec.success_roles.end()) {
        spec.success_roles.push_back(name);
      }
    }
  }

  const std::string source_;
  const std::string base_dir_;  // absolute
  Framework framework_ = Framework::kNone;  // known before the roles are parsed
  std::vector<Problem> problems_;
  int merge_depth_ = 0;   // merge keys being resolved inside one another, now
  int merges_ = 0;        // merge keys resolved so far
  bool merge_refused_ = false;
};

// Reads the whole file, once: a pipe (`shoal run <(generate-job)`) has nothing left to read a
// second time. The error names the path and the reason.
absl::StatusOr<std::string> ReadJobFileText(const std::string& path) {
  auto refuse = [&path](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the job file: ", why));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return refuse(std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode))) {
    ::close(fd);
    return refuse("not a regular file or a pipe");
  }
  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return refuse(std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

struct Demand {
  double total = 0;
  std::vector<std::string> parts;  // "32 x worker at 2"
  const Role* first = nullptr;     // the first role asking for any, where the total is reported
  bool task_too_big = false;
};

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source_name,
                                     const std::string& base_dir) {
  try {
    return Parser(source_name, AbsoluteBaseDir(base_dir)).Parse(yaml_text);
  } catch (const std::exception& e) {
    // Only allocation failures are left to land here; they must not cross the module boundary.
    return absl::InternalError(absl::StrCat(source_name, ": reading the job file: ", e.what()));
  }
}

absl::StatusOr<JobFile> ReadJobFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadJobFileText(path);
  if (!text.ok()) return text.status();
  // The file's own directory, so that working_dir means the same wherever shoal is run from.
  std::string dir = std::filesystem::path(AbsoluteBaseDir(path)).parent_path().string();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(*text, path, dir);
  if (!spec.ok()) return spec.status();
  return JobFile{*std::move(text), *std::move(spec)};
}

absl::StatusOr<JobSpec> ParseJobSpecFile(const std::string& path) {
  absl::StatusOr<JobFile> file = ReadJobFile(path);
  if (!file.ok()) return file.status();
  return std::move(file->spec);
}

absl::Status CheckFitsMachine(const JobSpec& spec, const machine::MachineInventory& machine) {
  std::vector<std::pair<int, std::string>> problems;
  auto report = [&](const Role& role, int key_line, absl::string_view key, std::string message) {
    int line = key_line > 0 ? key_line : role.line;
    problems.emplace_back(line, absl::StrCat(Where(spec.source_path, line), ": roles.", role.name,
                                             ".resources.", key, ": ", std::move(message)));
  };

  // One resource: what each task of a role asks for, and how amounts read in messages.
  struct Kind {
    absl::string_view key;
    double have;
    double (*per_task)(const Role&);
    int (*line)(const Role&);
    std::string (*figure)(double);  // "2", "2GiB"
    std::string (*amount)(double);  // "2 CPUs", "2GiB of memory"
  };
  const Kind kinds[] = {
      {"cpus", machine.cpus, [](const Role& r) { return r.resources.cpus; },
       [](const Role& r) { return r.resource_lines.cpus; }, FormatCount,
       [](double n) { return absl::StrCat(FormatCount(n), n == 1 ? " CPU" : " CPUs"); }},
      {"memory", static_cast<double>(machine.memory_bytes),
       [](const Role& r) { return static_cast<double>(r.resources.memory_bytes); },
       [](const Role& r) { return r.resource_lines.memory; },
       [](double n) { return FormatByteSize(static_cast<uint64_t>(n)); },
       [](double n) { return absl::StrCat(FormatByteSize(static_cast<uint64_t>(n)), " of memory"); }},
      {"gpus", static_cast<double>(machine.gpus.size()),
       [](const Role& r) { return static_cast<double>(r.resources.gpus); },
       [](const Role& r) { return r.resource_lines.gpus; }, FormatCount,
       [](double n) { return absl::StrCat(FormatCount(n), n == 1 ? " GPU" : " GPUs"); }},
  };
  // Sums of fractional CPUs (0.1 x 10) must not fail on rounding.
  constexpr double kSlack = 1e-9;

  for (const Kind& kind : kinds) {
    Demand demand;
    for (const Role& role : spec.roles) {
      double each = kind.per_task(role);
      if (each <= 0 || role.instances == 0) continue;
      if (demand.first == nullptr) demand.first = &role;
      demand.total += each * role.instances;
      demand.parts.push_back(
          absl::StrCat(role.instances, " x ", role.name, " at ", kind.figure(each)));
      if (each > kind.have + kSlack) {
        demand.task_too_big = true;
        report(role, kind.line(role), kind.key,
               absl::StrCat("one ", role.name, " task needs ", kind.amount(each),
                            ", this machine has ", kind.figure(kind.have)));
      }
    }
    if (demand.first != nullptr && !demand.task_too_big && demand.total > kind.have + kSlack) {
      report(*demand.first, kind.line(*demand.first), kind.key,
             absl::StrCat("the job needs ", kind.amount(demand.total), " in total (",
                          absl::StrJoin(demand.parts, " + "), "), this machine has ",
                          kind.figure(kind.have)));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  std::stable_sort(problems.begin(), problems.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> lines;
  for (auto& p : problems) lines.push_back(std::move(p.second));
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

absl::Status CheckPortsFit(const JobSpec& spec, uint64_t available, const std::string& ranges) {
  uint64_t needed = spec.TotalTasks();
  if (needed <= available || spec.roles.empty()) return absl::OkStatus();
  const Role* biggest = &spec.roles.front();
  for (const Role& role : spec.roles) {
    if (role.instances > biggest->instances) biggest = &role;
  }
  int line = biggest->instances_line > 0 ? biggest->instances_line : biggest->line;
  return absl::InvalidArgumentError(Printable(absl::StrCat(
      Where(spec.source_path, line), ": roles.", biggest->name, ".instances: the job's ", needed,
      " tasks need one port each on this machine, and its agent can hand out at most ", available,
      " (ports ", ranges, "); run fewer tasks, or widen the range with SHOAL_TASK_PORTS")));
}

}  // namespace shoal::spec
