#include "backends/yarn/yarn_backend.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/webhdfs.h"
#include "common/files.h"
#include "common/http_client.h"
#include "common/local_address.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace shoal::backends {
namespace {

using Ms = std::chrono::milliseconds;

using common::HttpReply;
using common::WebHdfs;

// One HTTP request to `base` (http://host:port). Unavailable when nothing answered. Only from
// threads that may block: never the master's loop.
absl::StatusOr<HttpReply> Http(const std::string& base, const std::string& method,
                               const std::string& path, const std::string& body = "",
                               const std::string& bearer = "", Ms timeout = Ms(10000)) {
  common::HttpRequest request;
  request.method = method;
  request.base = base;
  request.target = path;
  request.body = body;
  request.headers = {{"Accept", "application/json"}};
  if (!bearer.empty()) request.headers.emplace_back("Authorization", "Bearer " + bearer);
  request.connect_timeout = Ms(5000);
  request.timeout = timeout;
  return common::SendHttp(request);
}

absl::StatusOr<nlohmann::json> HttpJson(const std::string& base, const std::string& method,
                                        const std::string& path, const std::string& body = "",
                                        const std::string& bearer = "", Ms timeout = Ms(10000)) {
  auto reply = Http(base, method, path, body, bearer, timeout);
  if (!reply.ok()) return reply.status();
  auto json = nlohmann::json::parse(reply->body, nullptr, false);
  if (reply->status < 200 || reply->status >= 300) {
    // YARN's REST errors: {"RemoteException": {"message": ...}}.
    std::string message = reply->body;
    if (json.is_object() && json.contains("RemoteException")) {
      message = json["RemoteException"].value("message", message);
    } else if (json.is_object() && json.contains("error")) {
      message = json.value("error", message);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        method, " ", path, ": HTTP ", reply->status, ": ", absl::StripAsciiWhitespace(message)));
  }
  if (json.is_discarded()) {
    return absl::InternalError(absl::StrCat(method, " ", path, ": not JSON: ",
                                            reply->body.substr(0, 200)));
  }
  return json;
}

std::string RandomKey() {
  unsigned char bytes[24] = {};
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!::read(fd, bytes, sizeof bytes);
    ::close(fd);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

bool IsFinal(const std::string& state) {
  return state == "FINISHED" || state == "FAILED" || state == "KILLED";
}

// The names the staged files have in every container's working directory.
constexpr char kAmJarName[] = "shoal-yarn-am.jar";
constexpr char kShoalBinaryName[] = "shoal";

std::string HostOf(const std::string& rm_web) {
  absl::string_view rest = rm_web;
  absl::ConsumePrefix(&rest, "http://");
  return std::string(rest.substr(0, rest.rfind(':')));
}

}  // namespace

YarnBackend::YarnBackend(YarnBackendOptions options) : options_(std::move(options)) {}

YarnBackend::~YarnBackend() { Release(); }

std::string YarnBackend::ApplicationId() const { return app_id_; }

absl::StatusOr<std::vector<NodeGrant>> YarnBackend::Acquire(const spec::JobSpec& job,
                                                            const std::string& job_id) {
  job_ = job;
  job_id_ = job_id;
  places_ = YarnPlaces(job);
  // Whether YARN can hold the gang is YARN's to say once the application asks for it
  // (StartAgents): a refusal, or a wait for room, arrives as an allocation event.
  return places_;
}

absl::Status YarnBackend::StartAgents(const AgentStartOptions& options) {
  if (!app_id_.empty()) return absl::FailedPreconditionError("the YARN application is started");
  uint32_t ports = 0;
  for (const auto& [node, n] : options.ports_per_node) ports = std::max(ports, n);
  std::vector<YarnAmPlace> am_places;
  for (const auto& role : job_.roles) {
    for (uint32_t i = 0; i < role.instances; ++i) {
      YarnAmPlace p;
      p.name = absl::StrCat(role.name, ".", i);
      p.memory_mb = YarnContainerMemoryMb(role.resources);
      p.vcores = YarnContainerVcores(role.resources);
      p.gpus = role.resources.gpus;
      p.node_label = options_.request.node_label;
      // The token is not here: the AM's command line is stored by the ResourceManager and
      // shown by its REST API. The AM receives it over its own API and hands it to the
      // NodeManagers only, in each agent's environment. The binary is this master's, staged
      // on HDFS and localized by the NodeManager into the container's working directory:
      // nothing needs installing on the cluster's nodes.
      p.command = YarnShellCommand(
          {absl::StrCat("{{PWD}}/", kShoalBinaryName), "agent", "--master",
           options.master_address, "--node", p.name, "--work-dir", "{{PWD}}/shoal-agent",
           "--ports", std::to_string(ports),
           "--master-grace-ms", std::to_string(options.master_grace_ms),
           "--heartbeat-interval-ms", std::to_string(options.heartbeat_interval_ms),
           "--watchdog-ms", std::to_string(WatchdogMs(options))});
      // YARN's GPU plugin isolates the granted devices and names them in the container's
      // CUDA_VISIBLE_DEVICES; the agent must offer those, not whatever the machine has.
      if (p.gpus > 0) p.command += " --gpus-from-env";
      // A NodeManager gives a container none of this environment: the range goes as a flag.
      if (const char* range = std::getenv("SHOAL_TASK_PORTS"); range != nullptr && *range != '\0') {
        p.command += " " + YarnShellCommand({"--task-ports", range});
      }
      am_places.push_back(std::move(p));
    }
  }
  auto created = HttpJson(options_.rm_web, "POST", "/ws/v1/cluster/apps/new-application");
  if (!created.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot create a YARN application at ",
                                               options_.rm_web, ": ",
                                               created.status().message()));
  }
  std::string app_id = created->value("application-id", "");
  if (app_id.empty()) return absl::InternalError("the ResourceManager gave no application-id");
  staging_dir_ = absl::StrCat("/user/", options_.hdfs_user, "/.shoal/staging/", app_id);
  auto staged = Stage(options.shoal_binary);
  if (!staged.ok()) {
    RemoveStagingDir();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot stage the application master's jar and the shoal binary in ", options_.hdfs,
        staging_dir_, " (WebHDFS ", options_.webhdfs, "): ", staged.status().message()));
  }
  std::vector<YarnLocalResource> am_resources, agent_resources;
  for (const auto& r : *staged) {
    (r.name == kAmJarName ? am_resources : agent_resources).push_back(r);
  }
  std::string config =
      YarnAmConfigJson(am_places, static_cast<uint64_t>(options_.am_idle_timeout.count()),
                       agent_resources, staging_dir_);
  // Small and quick: the AM only shuttles messages (serial GC, C1 only, 128 MB of heap). Its
  // classpath is CLASSPATH in its environment, where the NodeManager's launch script expands
  // the cluster's $VARs (yarn.application.classpath is written with them).
  std::string am_command = absl::StrCat(
      "exec ", YarnShellCommand({options_.am_java, "-Xmx128m", "-XX:+UseSerialGC",
                        "-XX:TieredStopAtLevel=1", "shoal.yarn.ShoalAppMaster",
                        absl::Base64Escape(config)}),
      " 1><LOG_DIR>/am.stdout 2><LOG_DIR>/am.stderr");
  std::string classpath = absl::StrCat("{{PWD}}/", kAmJarName);
  if (!options_.am_classpath.empty()) classpath += ":" + options_.am_classpath;
  am_key_ = RandomKey();
  token_ = options.token;
  YarnSubmission submission;
  submission.application_id = app_id;
  submission.name = ApplicationName();
  submission.queue = options_.request.queue;
  submission.node_label = options_.request.node_label;
  submission.am_command = am_command;
  submission.am_key = am_key_;
  submission.am_memory_mb = options_.am_memory_mb;
  submission.am_classpath = classpath;
  submission.local_resources = am_resources;
  auto submitted = Http(options_.rm_web, "POST", "/ws/v1/cluster/apps",
                        YarnSubmissionJson(submission));
  if (!submitted.ok()) {
    RemoveStagingDir();
    return submitted.status();
  }
  if (submitted->status != 202 && submitted->status != 200) {
    RemoveStagingDir();
    auto json = nlohmann::json::parse(submitted->body, nullptr, false);
    std::string message = submitted->body;
    if (json.is_object() && json.contains("RemoteException")) {
      message = json["RemoteException"].value("message", message);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "YARN refused the application: ", absl::StripAsciiWhitespace(message)));
  }
  app_id_ = app_id;
  spdlog::info("submitted YARN application {} ({}) to {}", app_id_, ApplicationName(),
               options_.rm_web);
  if (!options_.state_dir.empty()) {
    if (auto st = MakeDirs(options_.state_dir); st.ok()) {
      nlohmann::json record = {{"application_id", app_id_},
                               {"application_name", ApplicationName()},
                               {"resourcemanager", options_.rm_web},
                               {"staging_dir", options_.hdfs + staging_dir_}};
      (void)ReplaceFile(options_.state_dir + "/application.json", record.dump(2));
    }
  }
  last_rm_poll_ = std::chrono::steady_clock::time_point{};
  watcher_ = std::thread([this] { Watch(); });
  return absl::OkStatus();
}

absl::StatusOr<std::vector<YarnLocalResource>> YarnBackend::Stage(
    const std::string& shoal_binary) {
  WebHdfs hdfs(options_.webhdfs, options_.hdfs_user);
  if (auto st = hdfs.MakeDirs(staging_dir_); !st.ok()) return st;
  std::vector<YarnLocalResource> resources;
  for (const auto& [name, local] :
       {std::pair<std::string, std::string>{kAmJarName, options_.am_jar},
        std::pair<std::string, std::string>{kShoalBinaryName, shoal_binary}}) {
    std::string path = absl::StrCat(staging_dir_, "/", name);
    if (auto st = hdfs.Upload(local, path); !st.ok()) return st;
    auto status = hdfs.Status(path);
    if (!status.ok()) return status.status();
    resources.push_back({name, options_.hdfs + path, status->length,
                         status->modification_time_ms});
  }
  spdlog::info("staged {} and {} in {}{}", options_.am_jar, shoal_binary, options_.hdfs,
               staging_dir_);
  return resources;
}

void YarnBackend::RemoveStagingDir() {
  if (staging_dir_.empty()) return;
  // The AM removes it too when it ends; this covers an AM that was killed or never ran.
  if (auto st = WebHdfs(options_.webhdfs, options_.hdfs_user).DeleteRecursively(staging_dir_);
      !st.ok()) {
    spdlog::warn("cannot remove the staging directory {}{}: {}", options_.hdfs, staging_dir_,
                 st.ToString());
    return;
  }
  staging_dir_.clear();
}

void YarnBackend::Watch() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_watching_) return;
    }
    std::string am;
    {
      absl::MutexLock lock(&mu_);
      am = am_address_;
    }
    auto now = std::chrono::steady_clock::now();
    if (am.empty() || now - last_rm_poll_ >= options_.rm_poll_interval) {
      last_rm_poll_ = now;
      if (!PollResourceManager()) return;
      absl::MutexLock lock(&mu_);
      am = am_address_;
    }
    if (am.empty()) {
      // The AM is not up yet: YARN's own pace (a NodeManager heartbeat, a JVM start).
      std::this_thread::sleep_for(Ms(100));
      continue;
    }
    PollApplicationMaster();
  }
}

bool YarnBackend::PollResourceManager() {
  auto app = HttpJson(options_.rm_web, "GET", "/ws/v1/cluster/apps/" + app_id_);
  if (!app.ok()) {
    spdlog::warn("cannot ask the ResourceManager about {}: {}", app_id_,
                 app.status().ToString());
    std::this_thread::sleep_for(Ms(200));
    return true;
  }
  const nlohmann::json a = app->value("app", nlohmann::json::object());
  std::string state = a.value("state", "");
  std::string diagnostics(absl::StripAsciiWhitespace(a.value("diagnostics", "")));
  if (IsFinal(state)) {
    PlaceLostCallback on_lost;
    AllocationEventCallback on_event;
    bool gang, refused;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      if (releasing_) return false;
      on_lost = on_lost_;
      on_event = on_event_;
      gang = gang_;
      refused = refused_;
    }
    std::string final_status = a.value("finalStatus", "");
    if (state == "KILLED") {
      std::string why = absl::StrCat("the YARN application ", app_id_,
                                     " was killed outside Shoal (e.g. yarn application -kill)");
      if (!diagnostics.empty()) why += ": " + diagnostics;
      spdlog::warn("{}", why);
      if (on_event) on_event({AllocationEvent::kCancelled, why});
      return false;
    }
    std::string why = absl::StrCat("the YARN application ", app_id_, " ended (", state, ", ",
                                   final_status, ")");
    if (!diagnostics.empty()) why += ": " + diagnostics;
    if (refused) return false;  // the AM already said why, in YARN's words
    if (!gang) {
      // An AM that cannot load Hadoop's classes is a setting to fix, not a Java trace to read.
      if (auto missing = AmMissingClass(diagnostics)) {
        why = AmClasspathFailureMessage(*missing, options_.am_classpath,
                                        options_.am_classpath_source);
      }
      if (on_event) on_event({AllocationEvent::kRefused, why});
      return false;
    }
    if (on_lost) {
      for (const auto& p : places_) on_lost(p.name, why);
    }
    return false;
  }
  if (state == "RUNNING") {
    std::string am = a.value("amRPCAddress", "");
    if (!am.empty() && am != "N/A" && am.find(':') != std::string::npos &&
        !absl::EndsWith(am, ":-1") && !absl::EndsWith(am, ":0")) {
      absl::MutexLock lock(&mu_);
      am_address_ = am;
    }
    return true;
  }
  // NEW, NEW_SAVING, SUBMITTED, ACCEPTED: the scheduler has not started the AM yet.
  std::string reason = absl::StrCat("YARN has not started application ", app_id_, " yet (",
                                    state, ")");
  if (!diagnostics.empty()) reason += ": " + diagnostics;
  Queued(reason);
  return true;
}

void YarnBackend::PollApplicationMaster() {
  std::string am;
  bool launch_sent;
  int64_t after;
  std::deque<Command> commands;
  {
    absl::MutexLock lock(&mu_);
    am = am_address_;
    launch_sent = launch_sent_;
    after = events_seen_;
    commands.swap(commands_);
  }
  std::string base = "http://" + am;
  if (!launch_sent) {
    auto sent = HttpJson(base, "POST", "/launch", nlohmann::json{{"token", token_}}.dump(),
                         am_key_);
    if (!sent.ok()) {
      spdlog::debug("the application master at {} is not answering yet: {}", am,
                    sent.status().ToString());
      std::this_thread::sleep_for(Ms(100));
      return;
    }
    absl::MutexLock lock(&mu_);
    launch_sent_ = true;
  }
  for (const auto& c : commands) {
    auto done = HttpJson(base, "POST", absl::StrCat(c.path, "?place=", c.place), "{}", am_key_);
    if (!done.ok()) spdlog::warn("{} {}: {}", c.path, c.place, done.status().ToString());
  }
  // A long poll: an event reaches the master as soon as the AM has it; the wait is short
  // enough that commands (stop, replace) and the ResourceManager's news are not held up.
  auto reply = HttpJson(base, "GET", absl::StrCat("/events?after=", after, "&wait_ms=300"), "",
                        am_key_, Ms(5000));
  if (!reply.ok()) {
    // The AM is gone (the application was killed, or its container died): the
    // ResourceManager says what happened.
    spdlog::debug("polling the application master: {}", reply.status().ToString());
    last_rm_poll_ = std::chrono::steady_clock::time_point{};
    std::this_thread::sleep_for(Ms(100));
    return;
  }
  for (const auto& e : reply->value("events", nlohmann::json::array())) {
    HandleAmEvent(e.value("kind", ""), e.value("place", ""), e.value("container", ""),
                  e.value("node", ""), e.value("exit_status", 0), e.value("diagnostics", ""),
                  e.value("allocated", 0), e.value("wanted", 0));
  }
  absl::MutexLock lock(&mu_);
  events_seen_ = std::max(events_seen_, reply->value("next", after));
}

void YarnBackend::HandleAmEvent(const std::string& kind, const std::string& place,
                                const std::string& container, const std::string& node,
                                int exit_status, const std::string& diagnostics, int allocated,
                                int wanted) {
  AllocationEventCallback on_event;
  {
    absl::MutexLock lock(&mu_);
    if (releasing_) return;
    on_event = on_event_;
  }
  if (kind == "allocated") {
    spdlog::info("YARN allocated {} on {} for {}", container, node, place);
    bool gang;
    {
      absl::MutexLock lock(&mu_);
      gang = gang_;
    }
    if (!gang && allocated < wanted) {
      Queued(absl::StrCat("YARN has allocated ", allocated, " of the ", wanted,
                          " containers; the gang starts when it has them all"));
    }
  } else if (kind == "gang") {
    {
      absl::MutexLock lock(&mu_);
      gang_ = true;
    }
    std::string why = absl::StrCat("YARN allocated all ", places_.size(),
                                   " containers of application ", app_id_);
    spdlog::info("{}", why);
    if (on_event) on_event({AllocationEvent::kAllocated, why});
  } else if (kind == "launched") {
    spdlog::info("started the agent for {} in {} on {}", place, container, node);
  } else if (kind == "completed") {
    std::string why = absl::StrCat("its YARN container ", container, " exited with status ",
                                   exit_status);
    if (!diagnostics.empty()) why += ": " + diagnostics;
    Lose(place, why);
  } else if (kind == "refused") {
    {
      absl::MutexLock lock(&mu_);
      if (refused_) return;
      refused_ = true;
    }
    std::string why = absl::StrCat("YARN refused the containers: ", diagnostics);
    spdlog::warn("{}", why);
    if (on_event) on_event({AllocationEvent::kRefused, why});
  } else if (kind == "finishing") {
    spdlog::info("the application master is ending the application: {}", diagnostics);
  }
}

void YarnBackend::Queued(const std::string& reason) {
  AllocationEventCallback on_event;
  {
    absl::MutexLock lock(&mu_);
    if (releasing_ || gang_ || reason == last_queued_reason_) return;
    last_queued_reason_ = reason;
    on_event = on_event_;
  }
  spdlog::info("{}", reason);
  if (on_event) on_event({AllocationEvent::kQueued, reason});
}

void YarnBackend::Lose(const std::string& place, const std::string& why) {
  PlaceLostCallback on_lost;
  {
    absl::MutexLock lock(&mu_);
    if (releasing_) return;
    on_lost = on_lost_;
  }
  spdlog::warn("place {} lost: {}", place, why);
  if (on_lost) on_lost(place, why);
}

void YarnBackend::SetPlaceLostCallback(PlaceLostCallback callback) {
  absl::MutexLock lock(&mu_);
  on_lost_ = std::move(callback);
}

void YarnBackend::SetAllocationEventCallback(AllocationEventCallback callback) {
  absl::MutexLock lock(&mu_);
  on_event_ = std::move(callback);
}

void YarnBackend::TerminatePlace(const std::string& node) {
  absl::MutexLock lock(&mu_);
  commands_.push_back({"/stop", node});
}

absl::Status YarnBackend::ReplacePlace(const std::string& node, const AgentStartOptions&) {
  absl::MutexLock lock(&mu_);
  if (am_address_.empty() || ended_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the YARN application ", app_id_, " has no application master running"));
  }
  // The AM asks YARN for a new container of the same size and starts the place's agent in it
  // with the same command line, which registers like the first one did.
  commands_.push_back({"/replace", node});
  return absl::OkStatus();
}

void YarnBackend::SetOutcome(Outcome outcome, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  outcome_ = outcome;
  outcome_reason_ = reason;
}

bool YarnBackend::WaitForEnd(Ms limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto app = HttpJson(options_.rm_web, "GET", "/ws/v1/cluster/apps/" + app_id_);
    if (app.ok() && IsFinal(app->value("app", nlohmann::json::object()).value("state", ""))) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(Ms(100));
  }
}

void YarnBackend::KillApplication() {
  auto killed = HttpJson(options_.rm_web, "PUT", "/ws/v1/cluster/apps/" + app_id_ + "/state",
                         nlohmann::json{{"state", "KILLED"}}.dump());
  if (!killed.ok()) spdlog::warn("cannot kill {}: {}", app_id_, killed.status().ToString());
}

void YarnBackend::Release() {
  Outcome outcome;
  std::string reason, am;
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    if (released_) return;
    released_ = true;
    releasing_ = true;
    stop_watching_ = true;
    outcome = outcome_;
    reason = outcome_reason_;
  }
  if (watcher_.joinable()) watcher_.join();
  if (app_id_.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    ended = ended_;
    am = am_address_;
  }
  if (ended) {
    RemoveStagingDir();
    return;
  }
  // A job killed through Shoal ends KILLED in YARN too; otherwise the AM stops the containers
  // and unregisters with the job's outcome. Should it not answer, the ResourceManager kills it.
  bool asked = false;
  if (outcome != Outcome::kKilled && !am.empty()) {
    std::string status = outcome == Outcome::kSucceeded ? "SUCCEEDED" : "FAILED";
    asked = HttpJson("http://" + am, "POST", "/finish",
                     nlohmann::json{{"status", status}, {"diagnostics", reason}}.dump(), am_key_,
                     Ms(3000))
                .ok();
  }
  if (asked && WaitForEnd(Ms(15000))) {
    RemoveStagingDir();
    return;
  }
  KillApplication();
  if (!WaitForEnd(Ms(20000))) {
    spdlog::warn("the YARN application {} has not ended 20s after it was killed", app_id_);
  }
  RemoveStagingDir();
}

absl::Status YarnBackend::CheckResourceManager(const std::string& rm_web) {
  auto info = HttpJson(rm_web, "GET", "/ws/v1/cluster/info", "", "", Ms(10000));
  if (!info.ok()) return info.status();
  if (!info->contains("clusterInfo")) {
    return absl::FailedPreconditionError(
        absl::StrCat(rm_web, "/ws/v1/cluster/info does not answer as a ResourceManager"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> YarnBackend::ClusterConfiguration(
    const std::string& rm_web) {
  // Hadoop's ConfServlet answers JSON to this Accept header:
  // {"properties": [{"key": ..., "value": ..., "isFinal": ..., "resource": ...}, ...]}.
  auto conf = HttpJson(rm_web, "GET", "/conf", "", "", Ms(10000));
  if (!conf.ok()) return conf.status();
  std::map<std::string, std::string> properties;
  for (const auto& p : conf->value("properties", nlohmann::json::array())) {
    if (p.is_object() && p.contains("key") && p["value"].is_string()) {
      properties[p.value("key", "")] = p.value("value", "");
    }
  }
  return properties;
}

absl::StatusOr<std::vector<std::string>> YarnBackend::UnfinishedApplications(
    const std::string& rm_web, const std::string& name) {
  auto apps = HttpJson(rm_web, "GET",
                       "/ws/v1/cluster/apps?states=NEW,NEW_SAVING,SUBMITTED,ACCEPTED,RUNNING");
  if (!apps.ok()) return apps.status();
  std::vector<std::string> ids;
  const auto& list = (*apps)["apps"];
  if (!list.is_object()) return ids;  // {"apps": null} when there are none
  for (const auto& a : list.value("app", nlohmann::json::array())) {
    if (a.value("name", "") == name) ids.push_back(a.value("id", ""));
  }
  return ids;
}

absl::StatusOr<std::string> YarnBackend::AddressTowardsResourceManager(const std::string& rm_web) {
  std::string host = HostOf(rm_web);
  return common::LocalAddressTowards(host, "8088", "the ResourceManager");
}

}  // namespace shoal::backends
