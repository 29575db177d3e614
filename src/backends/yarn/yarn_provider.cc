#include "backends/yarn/yarn_provider.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/yarn/yarn_backend.h"
#include "backends/yarn/yarn_section.h"
#include "backends/yarn/yarn_staging.h"

namespace shoal::backends {

std::vector<RunFlag> YarnProvider::Flags() const {
  return {{"--yarn-rm",
           "YARN ResourceManager web address, http://HOST:PORT (default $SHOAL_YARN_RM_WEB)"},
          {"--queue", "YARN queue (yarn.queue)"},
          {"--node-label", "YARN node label expression (yarn.node_label)"}};
}

std::optional<spec::JobSection> YarnProvider::JobSection() const { return YarnJobSection(); }

absl::StatusOr<YarnRequest> YarnFlagRequest(const spec::JobSpec& job,
                                            const std::map<std::string, std::string>& flags) {
  const YarnConfig& section = YarnConfigOf(job);
  YarnRequest request{section.queue, section.node_label};
  std::vector<std::string> problems;
  auto flag = [&](const char* name, std::string& into, bool (*valid)(absl::string_view),
                  const char* form) {
    auto it = flags.find(name);
    if (it == flags.end()) return;
    if (valid(it->second)) {
      into = it->second;
    } else {
      problems.push_back(
          absl::StrCat(name, ": must be ", form, ", got ", spec::DescribeText(it->second)));
    }
  };
  flag("--queue", request.queue, IsYarnQueue, kYarnQueueForm);
  flag("--node-label", request.node_label, IsYarnNodeLabel, kYarnNodeLabelForm);
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid flag: ", absl::StrJoin(problems, "\n")));
  }
  return request;
}

absl::StatusOr<Preflight> YarnProvider::Check(const PreflightRequest& request) const {
  // Everything the master needs is resolved here, before anything exists, and recorded in
  // submit.json: a wrong address, flag or missing jar changes nothing.
  // The flags' own rules first: a mistyped flag is named as such, whatever else is missing.
  absl::StatusOr<YarnRequest> yarn_request = YarnFlagRequest(*request.job, request.flags);
  if (!yarn_request.ok()) return yarn_request.status();
  std::string rm;
  if (auto it = request.flags.find("--yarn-rm"); it != request.flags.end()) rm = it->second;
  if (rm.empty()) {
    const char* env = std::getenv("SHOAL_YARN_RM_WEB");
    rm = env ? env : "";
  }
  if (rm.empty()) {
    return absl::InvalidArgumentError(
        "--backend yarn needs the ResourceManager's web address: --yarn-rm http://HOST:PORT or "
        "SHOAL_YARN_RM_WEB");
  }
  auto rm_web = NormalizeRmWebAddress(rm);
  if (!rm_web.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid flag: --yarn-rm: ", rm_web.status().message()));
  }
  absl::StatusOr<std::string> am_jar = FindYarnAmJar();
  if (!am_jar.ok()) return am_jar.status();
  if (auto st = YarnBackend::CheckResourceManager(*rm_web); !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend yarn: the ResourceManager at ", *rm_web, " does not answer: ", st.message()));
  }
  Preflight out;
  out.listen_host = request.listen_host;
  if (out.listen_host.empty()) {
    auto address = YarnBackend::AddressTowardsResourceManager(*rm_web);
    if (!address.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend yarn: ", address.status().message(),
                       "; give the address agents reach this machine at with --listen"));
    }
    out.listen_host = *address;
  }
  absl::StatusOr<YarnStaging> staging = ResolveYarnStaging(*rm_web, *am_jar);
  if (!staging.ok()) return staging.status();
  out.settings = {{"rm_web", *rm_web},
                  {"queue", yarn_request->queue},
                  {"node_label", yarn_request->node_label},
                  {"am_jar", staging->am_jar},
                  {"am_classpath", staging->am_classpath},
                  {"am_classpath_source", staging->am_classpath_source},
                  {"hdfs", staging->hdfs},
                  {"webhdfs", staging->webhdfs},
                  {"hdfs_user", staging->hdfs_user}};
  return out;
}

absl::StatusOr<CreatedBackend> YarnProvider::Create(const BackendContext& context) const {
  // `shoal run` resolved and checked these (flags over the job file's `yarn:` section).
  const nlohmann::json& flags = *context.settings;
  const YarnConfig& section = YarnConfigOf(*context.job);
  YarnBackendOptions yarn;
  yarn.rm_web = flags.value("rm_web", "");
  yarn.request.queue = flags.value("queue", section.queue);
  yarn.request.node_label = flags.value("node_label", section.node_label);
  yarn.am_jar = flags.value("am_jar", "");
  yarn.am_classpath = flags.value("am_classpath", "");
  yarn.am_classpath_source = flags.value("am_classpath_source", "submit.json");
  yarn.hdfs = flags.value("hdfs", "");
  yarn.webhdfs = flags.value("webhdfs", "");
  yarn.hdfs_user = flags.value("hdfs_user", "");
  yarn.state_dir = context.job_dir + "/agents/yarn";
  if (yarn.rm_web.empty() || yarn.am_jar.empty() || yarn.hdfs.empty() || yarn.webhdfs.empty() ||
      yarn.hdfs_user.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context.job_dir,
                     "/submit.json lacks one of yarn.rm_web, am_jar, hdfs, webhdfs, hdfs_user"));
  }
  CreatedBackend out;
  out.listen_host = context.listen_host;
  if (out.listen_host.empty()) {
    auto address = YarnBackend::AddressTowardsResourceManager(yarn.rm_web);
    if (!address.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(address.status().message(),
                       "; give the address agents can reach this machine at with --listen"));
    }
    out.listen_host = *address;
  }
  out.backend = std::make_unique<YarnBackend>(std::move(yarn));
  return out;
}

}  // namespace shoal::backends
