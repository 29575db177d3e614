#include "backends/kubernetes/kubernetes_backend.h"

#include <cctype>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "backends/kubernetes/admission_lease.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/pod_status.h"
#include "common/files.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace shoal::backends {
namespace {

using Ms = std::chrono::milliseconds;

std::string Escape(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

}  // namespace

KubernetesBackend::KubernetesBackend(KubernetesBackendOptions options)
    : options_(std::move(options)) {
  auto client = KubeClient::Create(options_.kube);
  if (client.ok()) {
    client_ = std::move(*client);
  } else {
    client_status_ = client.status();
  }
}

KubernetesBackend::~KubernetesBackend() { Release(); }

std::vector<NodeGrant> KubernetesBackend::Places(const spec::JobSpec& job) {
  std::vector<NodeGrant> places;
  for (const auto& role : job.roles) {
    for (uint32_t i = 0; i < role.instances; ++i) {
      NodeGrant g;
      g.name = absl::StrCat(role.name, ".", i);
      g.for_task = absl::StrCat(role.name, ":", i);
      g.cpus = role.resources.cpus;
      g.memory_bytes = role.resources.memory_bytes;
      // The device plugin names the pod's GPUs in its container (CUDA_VISIBLE_DEVICES or
      // NVIDIA_VISIBLE_DEVICES); the agent reports what it sees there.
      g.gpus_from_agent = role.resources.gpus > 0;
      g.gpu_count = role.resources.gpus;
      places.push_back(std::move(g));
    }
  }
  return places;
}

std::vector<NodeGrant> KubernetesBackend::Init(const std::string& job_id) {
  job_ = options_.job;
  job_id_ = job_id;
  context_.job_id = job_id;
  context_.ns = options_.ns;
  context_.job_object = JobObjectName(job_id);
  context_.task_image = options_.task_image;
  context_.image_pull_policy = options_.image_pull_policy;
  context_.agent_image = options_.agent_image;
  context_.agent_image_pull_policy = options_.agent_image_pull_policy;
  context_.agent_host_path = options_.agent_host_path;
  absl::MutexLock lock(&mu_);
  for (const auto& role : job_.roles) {
    for (uint32_t i = 0; i < role.instances; ++i) {
      Place place{role.name, i};
      place.optional = role.min_instances > 0 && i >= role.min_instances;
      places_[absl::StrCat(role.name, ".", i)] = std::move(place);
    }
  }
  return Places(job_);
}

absl::StatusOr<std::vector<NodeGrant>> KubernetesBackend::Acquire(const spec::JobSpec& job,
                                                                  const std::string& job_id) {
  if (client_ == nullptr) return client_status_;
  options_.job = job;
  // Whether the cluster can hold the gang is the scheduler's to say once the pods exist
  // (StartAgents): a wait for room, or a refusal, arrives as an allocation event.
  return Init(job_id);
}

void KubernetesBackend::SetAgentArgs(const AgentStartOptions& options) {
  agent_args_.master_address = options.master_address;
  for (const auto& [node, n] : options.ports_per_node) {
    agent_args_.ports = std::max(agent_args_.ports, n);
  }
  agent_args_.master_grace_ms = options.master_grace_ms;
  agent_args_.heartbeat_interval_ms = options.heartbeat_interval_ms;
  agent_args_.watchdog_ms = WatchdogMs(options);
  if (const char* range = std::getenv("SHOAL_TASK_PORTS"); range != nullptr && *range != '\0') {
    agent_args_.task_ports = range;
  }
}

void KubernetesBackend::StartThreads() {
  watcher_ = std::thread([this] { Watch(); });
  event_watcher_ = std::thread([this] { WatchMountFailures(); });
  commander_ = std::thread([this] { RunCommands(); });
}

std::string KubernetesBackend::PodsPath() const {
  return absl::StrCat("/api/v1/namespaces/", options_.ns, "/pods");
}

std::string KubernetesBackend::LabelSelector() const {
  return Escape(absl::StrCat(kJobLabel, "=", context_.job_object));
}

absl::Status KubernetesBackend::CreateOwnerAndSecret(const std::string& token) {
  const KubernetesConfig& config = KubernetesConfigOf(job_);
  std::string configmaps = absl::StrCat("/api/v1/namespaces/", options_.ns, "/configmaps");
  auto owner = client_->Create(configmaps, OwnerConfigMap(config, context_));
  if (!owner.ok() && owner.status().code() == absl::StatusCode::kAlreadyExists) {
    owner = client_->Get(absl::StrCat(configmaps, "/", context_.job_object));
  }
  if (!owner.ok()) return owner.status();
  context_.owner_uid = (*owner)["metadata"].value("uid", "");
  auto secret = client_->Create(absl::StrCat("/api/v1/namespaces/", options_.ns, "/secrets"),
                                TokenSecret(config, context_, token));
  if (!secret.ok() && secret.status().code() != absl::StatusCode::kAlreadyExists) {
    return secret.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> KubernetesBackend::PodManifest(const std::string& place,
                                                              uint32_t attempt) {
  std::string role;
  uint32_t index = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = places_.find(place);
    if (it == places_.end()) return absl::NotFoundError(absl::StrCat("no place ", place));
    role = it->second.role;
    index = it->second.index;
  }
  const spec::Role* spec_role = nullptr;
  for (const auto& r : job_.roles) {
    if (r.name == role) spec_role = &r;
  }
  if (spec_role == nullptr) return absl::NotFoundError(absl::StrCat("no role ", role));
  return TaskPod(*spec_role, index, attempt, KubernetesConfigOf(job_), context_, agent_args_);
}

absl::Status KubernetesBackend::CreatePod(const std::string& place, uint32_t attempt,
                                          bool gated) {
  absl::StatusOr<nlohmann::json> pod = PodManifest(place, attempt);
  if (!pod.ok()) return pod.status();
  if (gated) {
    // The scheduler ignores a gated pod: it holds nothing and blocks no one until admitted.
    (*pod)["spec"]["schedulingGates"] = nlohmann::json::array({{{"name", kGangGate}}});
  }
  auto created = client_->Create(PodsPath(), *pod);
  if (!created.ok() && created.status().code() != absl::StatusCode::kAlreadyExists) {
    return created.status();
  }
  absl::MutexLock lock(&mu_);
  if (!gated) {
    places_[place].admitted = true;
    return absl::OkStatus();
  }
  places_[place].admitted = false;
  // The object as created holds what admission plugins filled in (spec.priority).
  manifests_[place] = created.ok() ? std::move(*created) : std::move(*pod);
  waiting_admission_.push_back(place);
  return absl::OkStatus();
}

absl::Status KubernetesBackend::StartAgents(const AgentStartOptions& options) {
  if (client_ == nullptr) return client_status_;
  SetAgentArgs(options);
  if (absl::Status st = CreateOwnerAndSecret(options.token); !st.ok()) {
    // Nothing of the job may stay behind: the owner's deletion takes whatever was made.
    Release();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the job's objects in namespace ", options_.ns, ": ", st.message()));
  }
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, place] : places_) names.push_back(name);
  }
  // When no other admission runs and the gang fits now, its pods are created admitted, without
  // the gate: a patch per pod and a pass through the scheduler's gated pods less on the way to
  // running. The lease is held until the scheduler has bound them, as for any admission.
  std::vector<std::string> admitted;
  if (options_.gang_admission) admitted = AdmitBeforeCreating();
  size_t admitted_at_creation = 0;
  for (const std::string& place : names) {
    bool gated = options_.gang_admission &&
                 std::find(admitted.begin(), admitted.end(), place) == admitted.end();
    if (absl::Status st = CreatePod(place, 0, gated); !st.ok()) {
      Release();
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the pod of ", place, " in namespace ", options_.ns, ": ",
                       st.message()));
    }
  }
  spdlog::info("created {} pods for job {} in namespace {} (owner configmap {})", names.size(),
               job_id_, options_.ns, context_.job_object);
  {
    absl::MutexLock lock(&mu_);
    next_admission_ = std::chrono::steady_clock::now();
    if (!options_.gang_admission) gang_admitted_ = true;
    admitted_at_creation = admitted.size();
    bind_wait_ = std::move(admitted);
  }
  // Until every pod runs, the job is queued: admission, then images and the agent's install.
  if (!options_.gang_admission) {
    Queue("waiting for the pods to be scheduled and started");
  } else if (admitted_at_creation == 0) {
    Queue("waiting for the gang's admission");
  }
  if (!options_.state_dir.empty() && MakeDirs(options_.state_dir).ok()) {
    nlohmann::json record = {{"namespace", options_.ns},
                             {"owner", context_.job_object},
                             {"label_selector", absl::StrCat(kJobLabel, "=", context_.job_object)},
                             {"server", options_.kube.server}};
    (void)ReplaceFile(options_.state_dir + "/objects.json", record.dump(2));
  }
  StartThreads();
  return absl::OkStatus();
}

void KubernetesBackend::SetPlaceLostCallback(PlaceLostCallback callback) {
  absl::MutexLock lock(&mu_);
  on_lost_ = std::move(callback);
}

void KubernetesBackend::SetAllocationEventCallback(AllocationEventCallback callback) {
  absl::MutexLock lock(&mu_);
  on_event_ = std::move(callback);
}

void KubernetesBackend::ListAndWatch(const std::string& path, const ObjectHandler& on_object,
                                     const FailureHandler& on_failure,
                                     const std::function<void()>& on_recovered) {
  auto stop = [this] {
    absl::MutexLock lock(&mu_);
    return stopping_;
  };
  int failures = 0;
  // False: the caller gave up. Otherwise a pause of 0.5 s to 8 s, growing with the failures.
  auto failed = [&](const absl::Status& st, const char* what) {
    if (!on_failure(st, what, failures)) return false;
    auto until = std::chrono::steady_clock::now() + Ms(500) * (1 << std::min(failures++, 4));
    while (!stop() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(Ms(100));
    }
    return true;
  };
  std::string resource_version;
  while (!stop()) {
    if (resource_version.empty()) {
      auto list = client_->Get(path);
      if (!list.ok()) {
        if (!failed(list.status(), "cannot list")) return;
        continue;
      }
      if (failures > 0) on_recovered();
      failures = 0;
      for (const nlohmann::json& object : (*list)["items"]) on_object(object, false);
      resource_version = (*list)["metadata"].value("resourceVersion", "");
    }
    auto next = client_->Watch(
        path, resource_version,
        [&](absl::string_view type, const nlohmann::json& object) {
          on_object(object, type == "DELETED");
        },
        stop);
    if (next.ok()) {
      resource_version = *next;
      continue;
    }
    // Too old: the list again catches up on whatever happened in between.
    if (!IsResourceVersionTooOld(next.status()) && !failed(next.status(), "cannot watch")) {
      return;
    }
    resource_version.clear();
  }
}

void KubernetesBackend::Watch() {
  // An API server that is down is said once, then every minute or so; its return once too.
  ListAndWatch(
      absl::StrCat(PodsPath(), "?labelSelector=", LabelSelector()),
      [this](const nlohmann::json& pod, bool deleted) { Observe(ObservePod(pod, deleted)); },
      [this](const absl::Status& st, const char* what, int failures) {
        if (failures % 10 == 0) {
          spdlog::warn("{} the pods of job {}: {}{}", what, job_id_, st.ToString(),
                       failures == 0 ? "; retrying" : "; still retrying");
        }
        return true;
      },
      [this] { spdlog::info("the API server answers again for job {}", job_id_); });
}

void KubernetesBackend::WatchMountFailures() {
  ListAndWatch(
      absl::StrCat("/api/v1/namespaces/", options_.ns, "/events?fieldSelector=",
                   Escape("reason=FailedMount")),
      [this](const nlohmann::json& event, bool deleted) {
        if (!deleted) OnMountFailure(event);
      },
      // The pods' watch says when the API server is down.
      [this](const absl::Status& st, const char*, int) {
        if (st.code() != absl::StatusCode::kPermissionDenied) return true;
        spdlog::warn("may not read events in namespace {} ({}): a pod that cannot mount its "
                     "volumes will show only as starting", options_.ns,
                     std::string(st.message()));
        return false;
      },
      [] {});
}

void KubernetesBackend::OnMountFailure(const nlohmann::json& event) {
  std::optional<MountFailure> failure = ObserveMountFailure(event);
  if (!failure) return;
  PodObservation pod;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, place] : places_) {
      if (PodName(context_.job_object, place.role, place.index, place.attempt) == failure->pod) {
        pod.name = failure->pod;
        pod.place = name;
        pod.attempt = place.attempt;
      }
    }
  }
  if (pod.place.empty()) return;  // another job's pod, or an attempt already replaced
  pod.state = PodObservation::State::kCannotStart;
  pod.reason = failure->reason;
  Observe(pod);
}

void KubernetesBackend::Observe(const PodObservation& pod) {
  if (pod.place.empty()) return;
  AllocationEventCallback on_event;
  PlaceLostCallback on_lost;
  std::optional<AllocationEvent> event;
  std::string lost_why;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    auto it = places_.find(pod.place);
    // A pod of an earlier attempt (still terminating after its place was replaced) says
    // nothing about the place now.
    if (it == places_.end() || it->second.attempt != pod.attempt || it->second.lost) return;
    Place& place = it->second;
    on_event = on_event_;
    on_lost = on_lost_;
    switch (pod.state) {
      case PodObservation::State::kWaiting: {
        // A gated pod waits for Shoal's admission, which says why itself.
        if (gang_ || refused_ || pod.reason.empty()) break;
        int waiting = 0;
        int admitted = 0;
        for (const auto& [name, p] : places_) {
          admitted += p.admitted ? 1 : 0;
          waiting += p.admitted && !p.scheduled ? 1 : 0;
        }
        std::string reason = absl::StrCat(waiting, " of ", admitted,
                                          " pods wait for the Kubernetes scheduler");
        if (!pod.reason.empty()) absl::StrAppend(&reason, ": ", pod.reason);
        if (reason != last_queued_reason_) {
          last_queued_reason_ = reason;
          event = AllocationEvent{AllocationEvent::kQueued, reason};
        }
        break;
      }
      case PodObservation::State::kScheduled: {
        place.scheduled = true;
        if (place.running || !pod.running) break;
        place.running = true;
        if (gang_ || !gang_admitted_) break;
        // The job is allocated once every admitted pod's containers run: pulling a large image
        // can take minutes, which the master's registration deadline must not count. Optional
        // places not admitted yet are deferred: the job starts without them.
        size_t running = 0;
        size_t admitted = 0;
        std::vector<std::string> deferred;
        for (const auto& [name, p] : places_) {
          if (!p.admitted) {
            deferred.push_back(name);
            continue;
          }
          ++admitted;
          running += p.running ? 1 : 0;
        }
        if (running == admitted) {
          gang_ = true;
          event = AllocationEvent{AllocationEvent::kAllocated, "", std::move(deferred)};
        }
        break;
      }
      case PodObservation::State::kCannotStart:
        if (!gang_) {
          // The gang cannot form: say why once, the master ends the job.
          if (!refused_) {
            refused_ = true;
            event = AllocationEvent{AllocationEvent::kRefused, pod.reason};
          }
        } else {
          place.lost = true;
          lost_why = pod.reason;
        }
        break;
      case PodObservation::State::kEnding:
        if (!place.ending) {
          place.ending = true;
          spdlog::info("{}; its agent is stopping", pod.reason);
        }
        break;
      case PodObservation::State::kEnded:
        place.lost = true;
        lost_why = pod.reason;
        if (!gang_ && !refused_) {
          // Before the gang formed there is no agent to lose: the pod was taken away or
          // failed while waiting. Give the place a new pod, still waiting for room.
          place.lost = false;
          place.scheduled = false;
          place.running = false;
          place.attempt += 1;
          creations_.push_back(pod.place);
          lost_why.clear();
          spdlog::warn("{} before the job started; a new pod takes its place", pod.reason);
        }
        break;
    }
  }
  if (event && on_event) {
    if (event->kind == AllocationEvent::kQueued) {
      spdlog::info("job {} is queued: {}", job_id_, event->reason);
    }
    on_event(*event);
  }
  if (!lost_why.empty()) {
    // An agent that ended by itself said why on its way out (a master it cannot reach, a
    // refused token): that line is worth more than its exit code.
    if (pod.agent_exited) {
      if (std::string tail = LogTail(pod.name); !tail.empty()) {
        absl::StrAppend(&lost_why, "; its last output: ", tail);
      }
    }
    spdlog::warn("place {} lost: {}", pod.place, lost_why);
    if (on_lost) on_lost(pod.place, lost_why);
  }
}

void KubernetesBackend::RunCommands() {
  for (;;) {
    std::optional<std::pair<std::string, std::string>> deletion;
    std::optional<std::string> creation;
    std::vector<std::string> bind_wait;
    bool admit = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !deletions_.empty() || !creations_.empty() || !bind_wait_.empty() ||
               (!waiting_admission_.empty() &&
                std::chrono::steady_clock::now() >= next_admission_);
      };
      // Woken by commands; an admission that is due is noticed within 100 ms.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stopping_) return;
      if (!bind_wait_.empty()) {
        bind_wait.swap(bind_wait_);
      } else if (!deletions_.empty()) {
        deletion = deletions_.front();
        deletions_.pop_front();
      } else if (!creations_.empty()) {
        creation = creations_.front();
        creations_.pop_front();
      } else {
        admit = ready();
      }
    }
    if (!bind_wait.empty()) AwaitBound(bind_wait, /*first=*/true);
    if (deletion) DeletePod(deletion->second);
    if (creation) {
      uint32_t attempt = 0;
      {
        absl::MutexLock lock(&mu_);
        attempt = places_[*creation].attempt;
      }
      if (absl::Status st = CreatePod(*creation, attempt, options_.gang_admission); !st.ok()) {
        spdlog::warn("cannot create a new pod for {}: {}", *creation, st.ToString());
        PlaceLostCallback on_lost;
        {
          absl::MutexLock lock(&mu_);
          on_lost = on_lost_;
          places_[*creation].lost = true;
        }
        if (on_lost) on_lost(*creation, absl::StrCat("cannot create its pod: ", st.message()));
      }
    }
    if (admit) TryAdmit();
  }
}

void KubernetesBackend::DeletePod(const std::string& pod) {
  auto deleted = client_->Delete(absl::StrCat(PodsPath(), "/", pod),
                                 nlohmann::json{{"gracePeriodSeconds", 0}});
  if (!deleted.ok() && deleted.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn("cannot delete pod {}: {}", pod, deleted.status().ToString());
  }
}

bool KubernetesBackend::IsCurrentAgent(const std::string& node,
                                       const std::string& hostname) const {
  absl::MutexLock lock(&mu_);
  auto it = places_.find(node);
  if (it == places_.end()) return false;
  const Place& place = it->second;
  std::string pod = PodName(context_.job_object, place.role, place.index, place.attempt);
  // The kubelet makes a pod's hostname of its name cut to 63 characters, less a trailing '-'
  // or '.' (a long name may then hide the attempt: such agents cannot be told apart).
  if (pod.size() > 63) {
    pod.resize(63);
    while (!pod.empty() && (pod.back() == '-' || pod.back() == '.')) pod.pop_back();
  }
  return hostname == pod;
}

void KubernetesBackend::TerminatePlace(const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto it = places_.find(node);
  if (it == places_.end()) return;
  const Place& place = it->second;
  deletions_.emplace_back(node, PodName(context_.job_object, place.role, place.index,
                                        place.attempt));
}

absl::Status KubernetesBackend::ReplacePlace(const std::string& node,
                                             const AgentStartOptions& options) {
  absl::MutexLock lock(&mu_);
  auto it = places_.find(node);
  if (it == places_.end()) return absl::NotFoundError(absl::StrCat("no place ", node));
  Place& place = it->second;
  // The old pod goes (it may still be terminating); a new one, under a new name, takes over.
  deletions_.emplace_back(node, PodName(context_.job_object, place.role, place.index,
                                        place.attempt));
  place.attempt += 1;
  place.lost = false;
  place.ending = false;
  place.scheduled = false;
  place.running = false;
  creations_.push_back(node);
  return absl::OkStatus();
}

absl::Status KubernetesBackend::Reattach(const std::string& job_id,
                                         const std::vector<NodeGrant>& grants,
                                         const AgentStartOptions& options) {
  if (client_ == nullptr) return client_status_;
  Init(job_id);
  SetAgentArgs(options);
  auto owner = client_->Get(absl::StrCat("/api/v1/namespaces/", options_.ns, "/configmaps/",
                                         context_.job_object));
  if (!owner.ok()) {
    return absl::NotFoundError(absl::StrCat("the job's owner configmap ", context_.job_object,
                                            " in namespace ", options_.ns, ": ",
                                            owner.status().message()));
  }
  context_.owner_uid = (*owner)["metadata"].value("uid", "");
  auto list = client_->Get(absl::StrCat(PodsPath(), "?labelSelector=", LabelSelector()));
  if (!list.ok()) return list.status();
  // Each place's pod now: the newest attempt that is not ending.
  std::map<std::string, PodObservation> live;
  for (const nlohmann::json& pod : (*list)["items"]) {
    PodObservation seen = ObservePod(pod);
    if (seen.place.empty() || seen.state != PodObservation::State::kScheduled) continue;
    auto it = live.find(seen.place);
    if (it == live.end() || it->second.attempt < seen.attempt) live[seen.place] = seen;
  }
  std::vector<std::string> gone;
  PlaceLostCallback on_lost;
  {
    absl::MutexLock lock(&mu_);
    for (const NodeGrant& grant : grants) {
      auto place = places_.find(grant.name);
      if (place == places_.end()) continue;
      auto pod = live.find(grant.name);
      if (pod == live.end()) {
        // Preempted, deleted or never admitted (an optional place) while no master watched:
        // lost, which the master answers with a new pod if it still needs the place.
        place->second.lost = true;
        gone.push_back(grant.name);
        continue;
      }
      place->second.attempt = pod->second.attempt;
      place->second.scheduled = true;
      place->second.running = true;
      place->second.admitted = true;
    }
    gang_ = true;
    gang_admitted_ = true;
    on_lost = on_lost_;
  }
  spdlog::info("re-attached to {} of {} pods of job {} in namespace {}",
               grants.size() - gone.size(), grants.size(), job_id, options_.ns);
  StartThreads();
  for (const std::string& place : gone) {
    if (on_lost) {
      on_lost(place, absl::StrCat("its pod was gone when the new master looked in namespace ",
                                  options_.ns));
    }
  }
  return absl::OkStatus();
}

std::string KubernetesBackend::LogTail(const std::string& pod) {
  auto log = client_->Get(absl::StrCat(PodsPath(), "/", pod, "/log?container=task&tailLines=3"));
  if (!log.ok() || !log->is_string()) return "";
  std::string text(absl::StripAsciiWhitespace(log->get<std::string>()));
  absl::StrReplaceAll({{"\n", " | "}}, &text);
  if (text.size() > 400) text = "..." + text.substr(text.size() - 400);
  return text;
}

void KubernetesBackend::WaitForPodsGone(std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto list = client_->Get(absl::StrCat(PodsPath(), "?labelSelector=", LabelSelector()));
    if (!list.ok() || (*list)["items"].empty()) return;
    std::this_thread::sleep_for(Ms(250));
  }
  spdlog::warn("pods of job {} still exist after {} s", job_id_,
               std::chrono::duration_cast<std::chrono::seconds>(limit).count());
}

void KubernetesBackend::Release() {
  {
    absl::MutexLock lock(&mu_);
    if (released_) return;
    released_ = true;
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  if (event_watcher_.joinable()) event_watcher_.join();
  if (commander_.joinable()) commander_.join();
  if (lease_ != nullptr && !lease_unavailable_) lease_->Release();
  if (client_ == nullptr || context_.job_object.empty()) return;
  // The pods first, with their grace period: each agent stops its task on SIGTERM. Then the
  // owner, whose deletion takes the Secret and anything else left with it.
  auto pods = client_->Delete(absl::StrCat(PodsPath(), "?labelSelector=", LabelSelector()));
  if (!pods.ok() && pods.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn("cannot delete the pods of job {}: {}", job_id_, pods.status().ToString());
  }
  WaitForPodsGone(options_.release_wait);
  auto secret = client_->Delete(absl::StrCat("/api/v1/namespaces/", options_.ns, "/secrets/",
                                             context_.job_object, "-token"));
  if (!secret.ok() && secret.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn("cannot delete the job's secret: {}", secret.status().ToString());
  }
  auto owner = client_->Delete(
      absl::StrCat("/api/v1/namespaces/", options_.ns, "/configmaps/", context_.job_object),
      nlohmann::json{{"propagationPolicy", "Background"}});
  if (!owner.ok() && owner.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn("cannot delete the job's owner configmap: {}", owner.status().ToString());
  }
  // What the job cost the API server, for bench/kubernetes_scale.py (its requests per pod).
  size_t pods_made = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, place] : places_) pods_made += place.attempt + 1;
  }
  spdlog::info("job {}: {} API requests to the API server for {} pods", job_id_,
               client_->requests(), pods_made);
}

}  // namespace shoal::backends
