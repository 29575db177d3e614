// JobFileParser: failure handling (on_failure, restart, max_restarts, progress_timeout at the
// job and role levels, backoff, heartbeat) and which roles decide success.
#include <algorithm>

#include "common/duration.h"
#include "spec/job_file_parser.h"

namespace shoal::spec {

void JobFileParser::ParseFailureKeys(const std::vector<Entry>& entries, absl::string_view path,
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

void JobFileParser::ParseBackoff(const Entry& e, Backoff& out) {
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

void JobFileParser::ParseHeartbeat(const Entry& e, HeartbeatConfig& out) {
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

void JobFileParser::ResolveFailureHandling(const FailureKeys& job,
                                           const std::vector<RoleSite>& sites, JobSpec& spec) {
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

void JobFileParser::CheckRestart(RestartMode restart, int line, const std::string& key,
                                 OnFailure on_failure, absl::string_view origin) {
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

bool JobFileParser::DecidesSuccess(const JobSpec& spec, const std::string& role) {
  return std::find(spec.success_roles.begin(), spec.success_roles.end(), role) !=
         spec.success_roles.end();
}

void JobFileParser::ParseSuccess(const Entry* success, const Entry* roles_entry, JobSpec& spec) {
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

void JobFileParser::ParseSuccessRoles(const Entry& e, JobSpec& spec,
                                      const std::vector<std::string>& tracked) {
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

}  // namespace shoal::spec
