// JobFileParser: the roles, their commands, environment and resources, and how they depend
// on one another.
#include <unistd.h>

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "common/byte_size.h"
#include "spec/job_file_parser.h"
#include "spec/task_variables.h"

namespace shoal::spec {
namespace {

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

}  // namespace

Role JobFileParser::ParseRole(const Entry& r, RoleSite& site) {
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

void JobFileParser::ParseInstancesRange(const Entry& e, const std::string& key, Role& role) {
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

bool JobFileParser::CheckArgument(int line, const std::string& key, const std::string& text) {
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

void JobFileParser::ParseCommand(const Entry& e, const std::string& key, Role& role) {
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

void JobFileParser::CheckExecSize(const Entry* env, const Entry* command, const std::string& path,
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

void JobFileParser::ParseEnv(const Entry& e, const std::string& key, Role& role) {
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

void JobFileParser::ParseResources(const Entry& e, const std::string& path, Role& role) {
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

void JobFileParser::CheckDependencies(const JobSpec& spec, const std::vector<RoleSite>& sites) {
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

void JobFileParser::ReportCycle(const JobSpec& spec, const std::vector<RoleSite>& sites,
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

}  // namespace shoal::spec
