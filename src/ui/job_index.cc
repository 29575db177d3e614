#include "ui/job_index.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>

#include <simdjson.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/job_directory.h"
#include "common/files.h"
#include "ui/json_fields.h"
#include "nlohmann/json.hpp"

namespace shoal::ui {
namespace {

const std::set<std::string>& KnownStates() {
  static const std::set<std::string> states = {"queued",    "starting", "running", "stopping",
                                               "succeeded", "failed",   "killed",  "lost",
                                               "unknown"};
  return states;
}

const std::vector<std::string>& SortKeys() {
  static const std::vector<std::string> keys = {"created", "name", "state", "duration",
                                                "restarts"};
  return keys;
}

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

bool DefaultMasterAlive(const std::string& job_dir) {
  auto info = client::ReadMasterInfo(job_dir);
  return info && info->alive;
}

int64_t DurationMs(const JobSummary& job, int64_t now_ms) {
  if (job.created_unix_ms == 0) return 0;
  int64_t end = job.finished_unix_ms != 0 ? job.finished_unix_ms : now_ms;
  return std::max<int64_t>(0, end - job.created_unix_ms);
}

}  // namespace

absl::Status ValidateJobQuery(const JobQuery& query) {
  for (const auto& state : query.states) {
    if (!KnownStates().count(state)) {
      std::vector<std::string> known(KnownStates().begin(), KnownStates().end());
      return absl::InvalidArgumentError(absl::StrCat("state: unknown state '", state,
                                                     "'; one of ", absl::StrJoin(known, ", ")));
    }
  }
  std::string key = query.sort;
  if (!key.empty() && key[0] == '-') key.erase(0, 1);
  if (std::find(SortKeys().begin(), SortKeys().end(), key) == SortKeys().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sort: unknown key '", query.sort, "'; one of ",
                     absl::StrJoin(SortKeys(), ", "), ", each optionally prefixed with '-'"));
  }
  if (query.page < 1) return absl::InvalidArgumentError("page: must be 1 or more");
  if (query.per_page < 1 || query.per_page > 500) {
    return absl::InvalidArgumentError("per_page: must be between 1 and 500");
  }
  return absl::OkStatus();
}

JobIndex::JobIndex(std::string jobs_root, std::function<int64_t()> now_unix_ms,
                   std::function<bool(const std::string&)> master_alive)
    : root_(std::move(jobs_root)),
      now_unix_ms_(std::move(now_unix_ms)),
      master_alive_(master_alive ? std::move(master_alive) : DefaultMasterAlive) {}

bool JobIndex::Load(const std::string& dir, Entry& entry, simdjson::dom::parser& parser) {
  JobSummary& job = entry.summary;
  job.dir = dir;
  const std::string fallback_id = dir.substr(dir.rfind('/') + 1);
  simdjson::dom::element status;
  simdjson::error_code error = parser.load(dir + "/status.json").get(status);
  if (error == simdjson::IO_ERROR) {
    struct stat st {};
    if (::stat((dir + "/spec.yaml").c_str(), &st) != 0) return false;
    job.job_id = fallback_id;
    job.state = "unknown";
    job.reason = "no status written yet";
    job.created_unix_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
    return true;
  }
  if (error || !status.is_object()) {
    // Written atomically, so this is a foreign or damaged file: show it rather than hide it.
    job.job_id = fallback_id;
    job.state = "unknown";
    job.reason = "status.json is not valid JSON";
    return true;
  }
  // A field of the wrong type reads as absent (json_fields.h's rule).
  auto text = [&](const char* key, std::string fallback) {
    std::string_view value;
    return status[key].get(value) ? fallback : std::string(value);
  };
  auto number = [&](simdjson::dom::element object, const char* key) -> int64_t {
    int64_t value = 0;
    if (!object[key].get(value)) return value;
    double real = 0;
    return object[key].get(real) ? 0 : static_cast<int64_t>(real);
  };
  job.job_id = text("job_id", fallback_id);
  job.name = text("name", "");
  job.state = text("state", "unknown");
  job.reason = text("reason", "");
  job.created_unix_ms = number(status, "created_unix_ms");
  job.finished_unix_ms = number(status, "finished_unix_ms");
  job.restarts = static_cast<int>(number(status, "group_restarts"));
  job.tasks = 0;
  simdjson::dom::array tasks;
  if (!status["tasks"].get(tasks)) {
    for (simdjson::dom::element task : tasks) {
      ++job.tasks;
      if (task.is_object()) job.restarts += static_cast<int>(number(task, "restarts"));
    }
  }
  return true;
}

void JobIndex::LoadBackend(Entry& entry) {
  if (entry.backend_loaded) return;
  entry.backend_loaded = true;
  // submit.json never changes once written; read only for the rows shown.
  if (auto text = ReadFile(entry.summary.dir + "/submit.json"); text.ok()) {
    auto submit = nlohmann::json::parse(*text, nullptr, false);
    entry.summary.backend = StrField(submit, "backend");
  }
}

void JobIndex::Refresh() {
  std::map<std::string, Entry> fresh;
  {
    absl::MutexLock lock(&mu_);
    fresh.swap(entries_);
  }
  std::map<std::string, Entry> next;
  simdjson::dom::parser parser;
  if (DIR* d = ::opendir(root_.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
      std::string name = e->d_name;
      std::string dir = absl::StrCat(root_, "/", name);
      struct stat st {};
      bool has_status = ::stat((dir + "/status.json").c_str(), &st) == 0;
      Entry entry;
      if (auto it = fresh.find(name); it != fresh.end()) entry = std::move(it->second);
      bool unchanged = has_status && entry.status_size == st.st_size &&
                       SameTime(entry.status_mtime, st.st_mtim);
      if (!unchanged) {
        if (!Load(dir, entry, parser)) continue;  // not a job (yet), or deleted while we looked
        entry.status_mtime = has_status ? st.st_mtim : timespec{};
        entry.status_size = has_status ? st.st_size : -1;
      }
      next.emplace(std::move(name), std::move(entry));
    }
    ::closedir(d);
  }
  // A job whose status says it is not over is over if its master is gone: the same reading as
  // `shoal list` (client::CurrentStatus).
  for (auto& [name, entry] : next) {
    JobSummary& job = entry.summary;
    if (client::IsTerminalState(job.state) || job.state == "lost") continue;
    if (job.state == "unknown" && job.reason != "no status written yet") continue;
    if (!master_alive_(job.dir)) {
      if (job.state == "unknown") continue;
      job.state = "lost";
      job.reason = "its master is no longer running (see master.log)";
      entry.status_size = -1;  // read it again next time, in case the master comes back
    }
  }
  absl::MutexLock lock(&mu_);
  entries_.swap(next);
  refreshed_at_ms_ = now_unix_ms_();
}

JobPage JobIndex::Query(const JobQuery& query, int64_t max_age_ms) {
  bool stale;
  {
    absl::MutexLock lock(&mu_);
    stale = refreshed_at_ms_ < 0 || now_unix_ms_() - refreshed_at_ms_ >= max_age_ms;
  }
  if (stale) Refresh();
  const int64_t now = now_unix_ms_();
  std::string needle = absl::AsciiStrToLower(query.text);
  std::set<std::string> wanted(query.states.begin(), query.states.end());
  JobPage page;
  std::vector<Entry*> rows;
  absl::MutexLock lock(&mu_);
  rows.reserve(entries_.size());
  for (auto& [name, entry] : entries_) {
    const JobSummary& job = entry.summary;
    if (!needle.empty() && !absl::StrContains(absl::AsciiStrToLower(job.job_id), needle) &&
        !absl::StrContains(absl::AsciiStrToLower(job.name), needle) &&
        !absl::StrContains(absl::AsciiStrToLower(job.reason), needle)) {
      continue;
    }
    ++page.states[job.state];
    if (!wanted.empty() && !wanted.count(job.state)) continue;
    rows.push_back(&entry);
  }
  page.total = static_cast<int>(rows.size());
  bool descending = absl::StartsWith(query.sort, "-");
  std::string key = descending ? query.sort.substr(1) : query.sort;
  // Ties break on the id, so that pages are stable between requests.
  auto less = [&](const Entry* x, const Entry* y) {
    const JobSummary* a = &x->summary;
    const JobSummary* b = &y->summary;
    auto by = [&](auto x, auto y) {
      if (x != y) return descending ? y < x : x < y;
      return descending ? b->job_id < a->job_id : a->job_id < b->job_id;
    };
    if (key == "name") return by(a->name, b->name);
    if (key == "state") return by(a->state, b->state);
    if (key == "duration") return by(DurationMs(*a, now), DurationMs(*b, now));
    if (key == "restarts") return by(a->restarts, b->restarts);
    return by(a->created_unix_ms, b->created_unix_ms);
  };
  size_t first = static_cast<size_t>(query.page - 1) * query.per_page;
  if (first < rows.size()) {
    size_t last = std::min(rows.size(), first + query.per_page);
    std::partial_sort(rows.begin(), rows.begin() + last, rows.end(), less);
    for (size_t i = first; i < last; ++i) {
      LoadBackend(*rows[i]);
      page.jobs.push_back(rows[i]->summary);
    }
  }
  return page;
}

}  // namespace shoal::ui
