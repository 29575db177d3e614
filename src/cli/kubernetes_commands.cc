#include "cli/kubernetes_commands.h"

#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/kubernetes/agent_delivery.h"
#include "backends/kubernetes/kubernetes_section.h"
#include "client/commands.h"
#include "spec/job_section.h"

namespace shoal::cli {
namespace {

void Check(const std::string& flag, const std::string& value, bool (*valid)(absl::string_view),
           const char* form, std::vector<std::string>& problems) {
  if (!valid(value)) {
    problems.push_back(absl::StrCat(flag, ": must be ", form, ", got ", spec::DescribeText(value)));
  }
}

}  // namespace

int PrintAgentDaemonSet(const AgentDaemonSetFlags& flags) {
  backends::AgentDaemonSetOptions options;
  options.agent_image = flags.agent_image.empty() ? backends::kDefaultAgentImage
                                                  : flags.agent_image;
  options.agent_host_path = flags.agent_host_path.empty() ? backends::kDefaultAgentHostPath
                                                          : flags.agent_host_path;
  options.pause_image = flags.pause_image.empty() ? backends::kDefaultPauseImage
                                                  : flags.pause_image;
  options.ns = flags.ns;
  std::vector<std::string> problems;
  Check("--agent-image", options.agent_image, backends::IsImageReference, backends::kImageForm,
        problems);
  Check("--agent-host-path", options.agent_host_path, backends::IsAgentHostPath,
        backends::kAgentHostPathForm, problems);
  Check("--pause-image", options.pause_image, backends::IsImageReference, backends::kImageForm,
        problems);
  if (!options.ns.empty()) {
    Check("--namespace", options.ns, backends::IsDnsLabel, backends::kNamespaceForm, problems);
  }
  if (!problems.empty()) {
    for (const std::string& problem : problems) {
      std::cerr << "shoal kubernetes agent-daemonset: " << problem << "\n";
    }
    return client::kExitUsage;
  }
  std::cout << backends::AgentDaemonSet(options).dump(2) << "\n";
  return 0;
}

int RunAgentInstall(const std::string& from, const std::string& to) {
  std::string what_happened;
  if (absl::Status st = backends::InstallAgent(from, to, &what_happened); !st.ok()) {
    std::cerr << "shoal kubernetes agent-install: " << st.message() << "\n";
    return 1;
  }
  std::cout << "shoal kubernetes agent-install: " << what_happened << "\n";
  return 0;
}

}  // namespace shoal::cli
