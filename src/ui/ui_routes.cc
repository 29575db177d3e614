#include "ui/ui_routes.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/job_directory.h"
#include "client/master_client.h"
#include "common/files.h"
#include "common/http_client.h"
#include "nlohmann/json.hpp"
#include "ui/embedded_assets.h"
#include "ui/job_metrics.h"
#include "ui/journal_timeline.h"
#include "ui/log_pages.h"

extern char** environ;

namespace shoal::ui {
namespace {

using nlohmann::json;

UiReply Json(const json& body, int status = 200) {
  UiReply reply;
  reply.status = status;
  reply.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return reply;
}

std::string Query(const UiRequest& request, const std::string& key) {
  auto it = request.query.find(key);
  return it == request.query.end() ? "" : it->second;
}

// An integer parameter; InvalidArgument names it.
absl::StatusOr<std::optional<int64_t>> IntParam(const UiRequest& request, const std::string& key) {
  auto it = request.query.find(key);
  if (it == request.query.end() || it->second.empty()) return std::optional<int64_t>();
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", it->second, "' is not an integer"));
  }
  return std::optional<int64_t>(value);
}

// "worker-0" (a task directory) -> "worker:0".
std::string TaskOfDirectory(const std::string& name) {
  size_t dash = name.rfind('-');
  if (dash == std::string::npos) return name;
  return absl::StrCat(name.substr(0, dash), ":", name.substr(dash + 1));
}

// The last lines of a small file, parsed; lines that are not JSON objects (a partly written
// last line) are skipped.
std::vector<json> JsonLines(const std::string& path) {
  std::vector<json> out;
  auto text = ReadFile(path);
  if (!text.ok()) return out;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (line.empty()) continue;
    json j = json::parse(line.begin(), line.end(), nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// The job's task directories: task name -> directory.
std::map<std::string, std::string> TaskDirectories(const std::string& job_dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(job_dir + "/tasks", ec)) {
    if (e.is_directory(ec)) out[TaskOfDirectory(e.path().filename().string())] = e.path().string();
  }
  return out;
}

bool IsJobOver(const std::string& job_dir) {
  auto status = client::ReadStatusFile(job_dir);
  std::string state = status ? status->value("state", "") : "";
  if (client::IsTerminalState(state)) return true;
  auto master = client::ReadMasterInfo(job_dir);
  return !(master && master->alive) && status.has_value();
}

// What a child of `shoal ui` must not inherit: its blocked SIGINT/SIGTERM (taken by sigwait)
// and its ignored SIGPIPE. `new_group`: the child leads a process group of its own.
void CleanSpawnAttributes(posix_spawnattr_t* attr, bool new_group) {
  posix_spawnattr_init(attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &defaults);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (new_group) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(attr, 0);
  }
  posix_spawnattr_setflags(attr, flags);
}

// Runs argv to its end (at most `timeout`), returning its stdout and exit code; stderr goes to
// `stderr_path`.
struct ChildResult {
  int exit_code = -1;
  std::string out;
};
absl::StatusOr<ChildResult> RunChild(const std::vector<std::string>& argv, const std::string& cwd,
                                     const std::string& stderr_path,
                                     std::chrono::milliseconds timeout) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  posix_spawnattr_t attr;
  CleanSpawnAttributes(&attr, /*new_group=*/false);
  int rc = ::posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    return ErrnoStatus(absl::StrCat("start ", argv[0]), rc);
  }
  ChildResult result;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
  for (;;) {
    ssize_t n = ::read(pipe_fds[0], buf, sizeof(buf));
    if (n > 0) {
      result.out.append(buf, static_cast<size_t>(n));
      continue;
    }
    int status = 0;
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) result.out.append(buf, static_cast<size_t>(n));
      result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(pipe_fds[0]);
      return absl::DeadlineExceededError(absl::StrCat(argv[0], " did not finish in time"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::close(pipe_fds[0]);
  return result;
}

// Prometheus text: value of every sample of `name` by its `model` label, summed over the rest.
std::map<std::string, double> SumByModel(const std::string& text, const std::string& name) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
    char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    std::string model;
    if (size_t at = line.find("model=\""); at != absl::string_view::npos) {
      size_t end = line.find('"', at + 7);
      model = std::string(line.substr(at + 7, end - at - 7));
    }
    size_t space = line.rfind(' ');
    double value = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &value)) out[model] += value;
  }
  return out;
}

// Latency percentiles of one model from the request-duration histogram's cumulative buckets.
json Percentiles(const std::string& text, const std::string& model) {
  std::map<double, double> buckets;  // le -> cumulative count, summed over versions
  const std::string prefix = "shoal_inference_request_duration_seconds_bucket{";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    if (!absl::StrContains(line, absl::StrCat("model=\"", model, "\""))) continue;
    size_t at = line.find("le=\"");
    if (at == absl::string_view::npos) continue;
    size_t end = line.find('"', at + 4);
    absl::string_view le_text = line.substr(at + 4, end - at - 4);
    double le = le_text == "+Inf" ? INFINITY : 0;
    if (le_text != "+Inf" && !absl::SimpleAtod(le_text, &le)) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) buckets[le] += value;
  }
  json out = json::object();
  if (buckets.empty() || buckets.rbegin()->second <= 0) return out;
  double total = buckets.rbegin()->second;
  for (auto [name, q] : {std::pair{"p50", 0.5}, std::pair{"p90", 0.9}, std::pair{"p99", 0.99}}) {
    double prev_le = 0, prev_count = 0;
    for (auto [le, count] : buckets) {
      if (count >= q * total) {
        double bound = std::isinf(le) ? prev_le : le;
        // Linear inside the bucket, as Prometheus's histogram_quantile.
        double frac = count > prev_count ? (q * total - prev_count) / (count - prev_count) : 1;
        out[name] = 1000 * (std::isinf(le) ? bound : prev_le + (bound - prev_le) * frac);
        break;
      }
      prev_le = le;
      prev_count = count;
    }
  }
  return out;
}

}  // namespace

UiReply UiRoutes::Error(int status, absl::string_view message) {
  return Json({{"error", std::string(message)}}, status);
}

UiRoutes::UiRoutes(Options options)
    : options_(std::move(options)), index_(options_.jobs_root, options_.now_unix_ms) {}

UiRoutes::~UiRoutes() { StopChildren(); }

void UiRoutes::StopChildren() {
  absl::MutexLock lock(&children_mu_);
  for (auto& [job, child] : tensorboards_) ::kill(-child.first, SIGTERM);
  // TensorBoard stops within a second of SIGTERM; one that does not is killed.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& [job, child] : tensorboards_) {
    while (::waitpid(child.first, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-child.first, SIGKILL);
        ::waitpid(child.first, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  tensorboards_.clear();
}

bool UiRoutes::IsFollow(const UiRequest& request) {
  return request.method == "GET" && absl::StartsWith(request.path, "/api/jobs/") &&
         absl::EndsWith(request.path, "/logs/follow");
}

UiReply UiRoutes::Handle(const UiRequest& request) {
  const std::string& path = request.path;
  if (path == "/metrics") {
    if (request.method != "GET") return Error(405, "/metrics: only GET");
    return Metrics();
  }
  if (absl::StartsWith(path, "/api/")) {
    std::vector<std::string> parts = absl::StrSplit(path.substr(5), '/', absl::SkipEmpty());
    if (parts.size() == 1 && parts[0] == "jobs") {
      if (request.method != "GET") return Error(405, "/api/jobs: only GET");
      return ListJobs(request);
    }
    if (parts.size() == 1 && parts[0] == "models") {
      if (request.method != "GET") return Error(405, "/api/models: only GET");
      return Models();
    }
    if (parts.size() >= 2 && parts[0] == "jobs") {
      const std::string& id = parts[1];
      if (id == "." || id == ".." || id.find('/') != std::string::npos) {
        return Error(400, absl::StrCat("'", id, "' is not a job id"));
      }
      std::string dir = absl::StrCat(options_.jobs_root, "/", id);
      struct stat st {};
      if (::stat((dir + "/spec.yaml").c_str(), &st) != 0) {
        return Error(404, absl::StrCat("no job '", id, "' under ", options_.jobs_root));
      }
      std::string what = parts.size() >= 3 ? parts[2] : "";
      bool post = request.method == "POST";
      if (parts.size() == 2) {
        if (post) return Error(405, "a job: only GET");
        return JobDetail(dir);
      }
      if (parts.size() == 3 && what == "timeline" && !post) {
        auto timeline = JobTimeline(dir, options_.now_unix_ms());
        if (!timeline.ok()) return Error(404, timeline.status().message());
        return Json(*timeline);
      }
      if (parts.size() == 3 && what == "logs" && !post) return Logs(dir, request);
      if (parts.size() == 3 && what == "resources" && !post) return Resources(dir);
      if (parts.size() == 3 && post && what == "kill") return Kill(dir);
      if (parts.size() == 3 && post && what == "rerun") return Rerun(dir);
      if (parts.size() == 3 && post && what == "tensorboard") return TensorBoard(dir, id);
      if (parts.size() == 3 && (what == "kill" || what == "rerun" || what == "tensorboard")) {
        return Error(405, absl::StrCat(what, ": only POST"));
      }
    }
    return Error(404, absl::StrCat("no API ", request.method, " ", path));
  }
  if (request.method != "GET" && request.method != "HEAD") {
    return Error(405, absl::StrCat(path, ": only GET"));
  }
  return Asset(path);
}

UiReply UiRoutes::Asset(const std::string& path) {
  std::string_view wanted = path;
  // The app's own routes are client-side: every page is index.html.
  if (path == "/" || path == "/models" || absl::StartsWith(path, "/jobs/") || path == "/jobs") {
    wanted = "/index.html";
  }
  for (const auto& asset : EmbeddedAssets()) {
    if (asset.path != wanted) continue;
    UiReply reply;
    reply.content_type = std::string(asset.content_type);
    reply.body = std::string(asset.body);
    reply.headers.emplace_back("ETag", std::string(asset.etag));
    reply.headers.emplace_back("Cache-Control", wanted == "/index.html" ? "no-cache" : "max-age=3600");
    return reply;
  }
  UiReply reply = Error(404, absl::StrCat("no page ", path));
  return reply;
}

UiReply UiRoutes::ListJobs(const UiRequest& request) {
  JobQuery query;
  for (absl::string_view state : absl::StrSplit(Query(request, "state"), ',', absl::SkipEmpty())) {
    query.states.emplace_back(state);
  }
  query.text = Query(request, "q");
  if (auto sort = Query(request, "sort"); !sort.empty()) query.sort = sort;
  auto page = IntParam(request, "page");
  if (!page.ok()) return Error(400, page.status().message());
  auto per_page = IntParam(request, "per_page");
  if (!per_page.ok()) return Error(400, per_page.status().message());
  if (*page) query.page = static_cast<int>(std::clamp<int64_t>(**page, -1, 1 << 30));
  if (*per_page) query.per_page = static_cast<int>(std::clamp<int64_t>(**per_page, -1, 1 << 30));
  if (auto valid = ValidateJobQuery(query); !valid.ok()) return Error(400, valid.message());
  JobPage result = index_.Query(query);
  const int64_t now = options_.now_unix_ms();
  json jobs = json::array();
  for (const auto& job : result.jobs) {
    int64_t end = job.finished_unix_ms ? job.finished_unix_ms : now;
    jobs.push_back({{"job_id", job.job_id}, {"name", job.name}, {"state", job.state},
                    {"backend", job.backend}, {"tasks", job.tasks}, {"restarts", job.restarts},
                    {"created_unix_ms", job.created_unix_ms},
                    {"finished_unix_ms", job.finished_unix_ms},
                    {"duration_ms", job.created_unix_ms ? std::max<int64_t>(0, end - job.created_unix_ms) : 0},
                    {"reason", job.reason}});
  }
  return Json({{"total", result.total}, {"page", query.page}, {"per_page", query.per_page},
               {"states", result.states}, {"jobs", std::move(jobs)}});
}

UiReply UiRoutes::JobDetail(const std::string& dir) {
  json status = *client::CurrentStatus(dir);
  auto submit_text = ReadFile(dir + "/submit.json");
  json submit = submit_text.ok() ? json::parse(*submit_text, nullptr, false) : json();
  if (!submit.is_object()) submit = json::object();
  status["backend"] = submit.value("backend", "");
  status["source_path"] = submit.value("source_path", "");
  auto spec = ReadFile(dir + "/spec.yaml");
  status["spec_yaml"] = spec.ok() ? *spec : "";
  // Checkpoints: what the checkpoint directory holds, newest first.
  json checkpoints = json::array();
  std::vector<std::tuple<int64_t, std::string, int64_t>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/checkpoints", ec)) {
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0) continue;
    int64_t bytes = S_ISREG(st.st_mode) ? st.st_size : 0;
    if (S_ISDIR(st.st_mode)) {
      for (const auto& f : std::filesystem::recursive_directory_iterator(e.path(), ec)) {
        if (f.is_regular_file(ec)) bytes += static_cast<int64_t>(f.file_size(ec));
      }
    }
    found.emplace_back(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000,
                       e.path().filename().string(), bytes);
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [mtime, name, bytes] : found) {
    checkpoints.push_back({{"name", name}, {"bytes", bytes}, {"mtime_unix_ms", mtime}});
  }
  status["checkpoints"] = std::move(checkpoints);
  {
    absl::MutexLock lock(&children_mu_);
    auto it = tensorboards_.find(std::filesystem::path(dir).filename().string());
    status["tensorboard"] = it == tensorboards_.end() ? json() : json{{"url", it->second.second}};
  }
  // Steps per second from the last two resource samples of the task's current attempt.
  auto task_dirs = TaskDirectories(dir);
  if (auto tasks = status.find("tasks"); tasks != status.end() && tasks->is_array()) {
    for (auto& task : *tasks) {
      task["steps_per_second"] = nullptr;
      auto it = task_dirs.find(task.value("task", ""));
      if (it == task_dirs.end()) continue;
      auto samples = JsonLines(it->second + "/resources.jsonl");
      if (samples.size() < 2) continue;
      const json& a = samples[samples.size() - 2];
      const json& b = samples.back();
      double dt = (b.value("ts_ms", int64_t{0}) - a.value("ts_ms", int64_t{0})) / 1000.0;
      if (dt > 0 && a.value("attempt", 0) == b.value("attempt", 0)) {
        task["steps_per_second"] =
            static_cast<double>(b.value("step", int64_t{0}) - a.value("step", int64_t{0})) / dt;
      }
    }
  }
  return Json(status);
}

UiReply UiRoutes::Logs(const std::string& dir, const UiRequest& request) {
  LogPageRequest page_request;
  page_request.task = Query(request, "task");
  for (const auto* key : {"before", "after", "limit"}) {
    auto value = IntParam(request, key);
    if (!value.ok()) return Error(400, value.status().message());
    if (!*value) continue;
    if (**value < 0) return Error(400, absl::StrCat(key, ": must be 0 or more"));
    if (std::string(key) == "before") page_request.before = **value;
    if (std::string(key) == "after") page_request.after = **value;
    if (std::string(key) == "limit") page_request.limit = static_cast<int>(std::clamp<int64_t>(**value, -1, 1 << 20));
  }
  auto page = ReadLogPage(dir + "/logs.txt", page_request);
  if (!page.ok()) {
    if (absl::IsNotFound(page.status())) {
      return Json({{"lines", json::array()}, {"start_offset", 0}, {"end_offset", 0},
                   {"file_size", 0}, {"more_before", false}});
    }
    return Error(absl::IsInvalidArgument(page.status()) ? 400 : 500, page.status().message());
  }
  json lines = json::array();
  for (const auto& line : page->lines) {
    lines.push_back({{"offset", line.offset}, {"task", line.task}, {"text", line.text}});
  }
  return Json({{"lines", std::move(lines)}, {"start_offset", page->start_offset},
               {"end_offset", page->end_offset}, {"file_size", page->file_size},
               {"more_before", page->more_before}});
}

std::optional<UiReply> UiRoutes::Follow(const UiRequest& request, const EventSink& sink,
                                        const std::function<bool()>& stopping) {
  std::vector<std::string> parts = absl::StrSplit(request.path.substr(5), '/', absl::SkipEmpty());
  const std::string& id = parts[1];
  std::string dir = absl::StrCat(options_.jobs_root, "/", id);
  struct stat st {};
  if (id == "." || id == ".." || ::stat((dir + "/spec.yaml").c_str(), &st) != 0) {
    return Error(404, absl::StrCat("no job '", id, "' under ", options_.jobs_root));
  }
  std::string task = Query(request, "task");
  auto from = IntParam(request, "from");
  if (!from.ok()) return Error(400, from.status().message());
  const std::string log = dir + "/logs.txt";
  int64_t pos = 0;
  if (*from) {
    pos = **from;
    if (pos < 0) return Error(400, "from: must be 0 or more");
  } else if (::stat(log.c_str(), &st) == 0) {
    // From the end of the last complete line.
    LogPageRequest last;
    last.limit = 1;
    if (auto page = ReadLogPage(log, last); page.ok()) pos = page->end_offset;
  }
  if (!sink("start", json({{"end_offset", pos}}).dump())) return std::nullopt;
  auto last_sent = std::chrono::steady_clock::now();
  for (;;) {
    if (stopping()) return std::nullopt;
    bool over = IsJobOver(dir);  // before reading: the last lines are in the file by then
    int64_t size = ::stat(log.c_str(), &st) == 0 ? st.st_size : 0;
    bool drained = true;
    if (size > pos) {
      LogPageRequest next;
      next.after = pos;
      next.task = task;
      next.limit = 2000;
      auto page = ReadLogPage(log, next);
      if (page.ok() && page->end_offset > pos) {
        pos = page->end_offset;
        if (!page->lines.empty()) {
          json lines = json::array();
          for (const auto& line : page->lines) {
            lines.push_back({{"offset", line.offset}, {"task", line.task}, {"text", line.text}});
          }
          if (!sink("lines", json({{"lines", std::move(lines)}, {"end_offset", pos}})
                                 .dump(-1, ' ', false, json::error_handler_t::replace))) {
            return std::nullopt;
          }
          last_sent = std::chrono::steady_clock::now();
        }
        drained = pos >= size;
      }
    }
    if (drained && over) {
      sink("end", json({{"end_offset", pos}}).dump());
      return std::nullopt;
    }
    if (!drained) continue;
    if (std::chrono::steady_clock::now() - last_sent > std::chrono::seconds(15)) {
      // A comment keeps proxies from closing an idle stream and finds a gone client.
      if (!sink("", "")) return std::nullopt;
      last_sent = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

UiReply UiRoutes::Resources(const std::string& dir) {
  json tasks = json::object();
  for (const auto& [task, task_dir] : TaskDirectories(dir)) {
    auto samples = JsonLines(task_dir + "/resources.jsonl");
    if (samples.empty()) continue;
    tasks[task] = samples;
  }
  return Json({{"tasks", std::move(tasks)}});
}

UiReply UiRoutes::Kill(const std::string& dir) {
  auto master = client::ReadMasterInfo(dir);
  if (!master || !master->alive) {
    json status = *client::CurrentStatus(dir);
    return Error(409, absl::StrCat("job ", status.value("job_id", ""), " has already ended (",
                                   status.value("state", ""), ")"));
  }
  auto connection = client::MasterClient::Connect(dir);
  absl::Status killed = connection.ok() ? (*connection)->Kill("killed from shoal ui")
                                        : connection.status();
  if (!killed.ok()) {
    if (absl::IsUnavailable(killed)) return Error(409, "the job's master has just ended");
    return Error(502, absl::StrCat("the job's master refused the kill: ", killed.message()));
  }
  return Json({{"killing", true}}, 202);
}

UiReply UiRoutes::Rerun(const std::string& dir) {
  auto submit_text = ReadFile(dir + "/submit.json");
  json submit = submit_text.ok() ? json::parse(*submit_text, nullptr, false) : json();
  auto spec = ReadFile(dir + "/spec.yaml");
  if (!submit.is_object() || !spec.ok()) {
    return Error(409, "the job directory has no submit.json or spec.yaml to run again");
  }
  // The job file's relative paths are relative to its folder, so the job runs again from its
  // original file, provided that it is still the file this job ran.
  std::string source = submit.value("source_path", "");
  auto current = ReadFile(source);
  if (!current.ok()) {
    return Error(409, absl::StrCat("the job file ", source, " is gone; run it with shoal run"));
  }
  if (*current != *spec) {
    return Error(409, absl::StrCat("the job file ", source,
                                   " changed since this job ran; run it with shoal run"));
  }
  std::vector<std::string> argv = {options_.shoal_binary, "--jobs-dir", options_.jobs_root,
                                   "run", "--detach", "--backend", submit.value("backend", "local"),
                                   source};
  // One file per request: two reruns at once must not read each other's errors.
  static std::atomic<uint64_t> reruns{0};
  std::string err_path =
      absl::StrCat(options_.jobs_root, "/.ui-rerun-", ::getpid(), "-", ++reruns, ".log");
  auto result = RunChild(argv, submit.value("base_dir", ""), err_path, std::chrono::seconds(120));
  std::string err = ReadFile(err_path).value_or("");
  ::unlink(err_path.c_str());
  if (!result.ok()) return Error(500, result.status().message());
  if (result->exit_code != 0) {
    return Error(result->exit_code == 2 ? 409 : 500,
                 absl::StrCat("shoal run failed (exit ", result->exit_code, "): ",
                              absl::StripAsciiWhitespace(err)));
  }
  return Json({{"job_id", std::string(absl::StripAsciiWhitespace(result->out))}}, 202);
}

UiReply UiRoutes::TensorBoard(const std::string& dir, const std::string& job_id) {
  {
    absl::MutexLock lock(&children_mu_);
    if (auto it = tensorboards_.find(job_id); it != tensorboards_.end()) {
      if (::waitpid(it->second.first, nullptr, WNOHANG) == 0) {
        return Json({{"url", it->second.second}});
      }
      tensorboards_.erase(it);
    }
  }
  std::string log_path = dir + "/ui-tensorboard.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attr;
  CleanSpawnAttributes(&attr, /*new_group=*/true);
  std::vector<std::string> argv = {options_.shoal_binary, "--jobs-dir", options_.jobs_root,
                                   "tensorboard", job_id};
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Error(500, absl::StrCat("could not start shoal tensorboard: ", strerror(rc)));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::string out = ReadFile(log_path).value_or("");
    if (size_t at = out.find("http://"); at != std::string::npos) {
      size_t end = out.find_first_of(" \n", at);
      std::string url = out.substr(at, end == std::string::npos ? std::string::npos : end - at);
      absl::MutexLock lock(&children_mu_);
      tensorboards_[job_id] = {pid, url};
      return Json({{"url", url}});
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      std::string why = std::string(absl::StripAsciiWhitespace(out));
      if (size_t nl = why.rfind('\n'); nl != std::string::npos) why = why.substr(nl + 1);
      return Error(409, absl::StrCat("shoal tensorboard ended: ", why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(-pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  return Error(504, "TensorBoard did not print its address within 60 s");
}

UiReply UiRoutes::Models() {
  json servers = json::array();
  const int64_t now = options_.now_unix_ms();
  for (const auto& url : options_.serve_urls) {
    json server = {{"url", url}, {"ready", false}, {"error", nullptr}, {"models", json::array()}};
    common::HttpRequest ready_request;
    ready_request.base = url;
    ready_request.target = "/v2/health/ready";
    ready_request.timeout = std::chrono::milliseconds(3000);
    auto ready = common::SendHttp(ready_request);
    if (!ready.ok()) {
      server["error"] = std::string(ready.status().message());
      servers.push_back(std::move(server));
      continue;
    }
    server["ready"] = ready->status == 200;
    common::HttpRequest index_request = ready_request;
    index_request.method = "POST";
    index_request.target = "/v2/repository/index";
    index_request.body = "{}";
    auto index = common::SendHttp(index_request);
    common::HttpRequest metrics_request = ready_request;
    metrics_request.target = "/metrics";
    auto metrics = common::SendHttp(metrics_request);
    std::string text = metrics.ok() && metrics->status == 200 ? metrics->body : "";
    auto success = SumByModel(text, "shoal_inference_request_success_total");
    auto failure = SumByModel(text, "shoal_inference_request_failure_total");
    auto inferences = SumByModel(text, "shoal_inference_count_total");
    auto executions = SumByModel(text, "shoal_inference_exec_count_total");
    std::map<std::string, double> previous;
    int64_t previous_ms = 0;
    {
      absl::MutexLock lock(&models_mu_);
      if (auto it = last_scrape_.find(url); it != last_scrape_.end()) {
        previous_ms = it->second.first;
        previous = it->second.second;
      }
      std::map<std::string, double> counts;
      for (const auto& [model, n] : success) counts[model] += n;
      for (const auto& [model, n] : failure) counts[model] += n;
      last_scrape_[url] = {now, counts};
    }
    std::map<std::string, json> models;
    json index_body = index.ok() ? json::parse(index->body, nullptr, false) : json();
    if (index_body.is_array()) {
      for (const auto& entry : index_body) {
        std::string name = entry.value("name", "");
        json& model = models[name];
        if (!model.is_object()) model = {{"name", name}, {"versions", json::array()}};
        model["versions"].push_back({{"version", entry.value("version", "")},
                                     {"state", entry.value("state", "")},
                                     {"reason", entry.value("reason", "")}});
      }
    } else {
      server["error"] = index.ok() ? absl::StrCat("repository index: HTTP ", index->status)
                                   : std::string(index.status().message());
    }
    for (auto& [name, model] : models) {
      double requests = success[name] + failure[name];
      model["requests_total"] = requests;
      model["errors"] = failure[name];
      model["requests_per_second"] = nullptr;
      if (previous_ms > 0 && now > previous_ms && previous.count(name)) {
        model["requests_per_second"] =
            std::max(0.0, (requests - previous[name]) * 1000.0 / static_cast<double>(now - previous_ms));
      }
      model["latency_ms"] = Percentiles(text, name);
      model["mean_batch_size"] =
          executions[name] > 0 ? json(inferences[name] / executions[name]) : json();
      server["models"].push_back(model);
    }
    servers.push_back(std::move(server));
  }
  return Json({{"servers", std::move(servers)}});
}

UiReply UiRoutes::Metrics() {
  const int64_t now = options_.now_unix_ms();
  std::vector<JobMetricFacts> jobs =
      metrics_cache_.Read(client::ListJobDirs(options_.jobs_root), now);
  UiReply reply;
  reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
  reply.body = RenderJobMetrics(jobs, {.now_unix_ms = now});
  return reply;
}

}  // namespace shoal::ui
