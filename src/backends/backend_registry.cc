#include "backends/backend_registry.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shoal::backends {

absl::Status BackendRegistry::Add(std::unique_ptr<BackendProvider> provider) {
  const std::string name = provider->Name();
  std::set<std::string> flags;
  for (const auto& p : providers_) {
    if (p->Name() == name) return absl::InvalidArgumentError("backend " + name + " added twice");
    for (const RunFlag& flag : p->Flags()) flags.insert(flag.name);
  }
  for (const RunFlag& flag : provider->Flags()) {
    if (!flags.insert(flag.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend ", name, "'s flag ", flag.name, " is another backend's"));
    }
  }
  std::optional<spec::JobSection> section = provider->JobSection();
  if (section) {
    for (const spec::JobSection& s : sections_) {
      if (s.name == section->name) {
        return absl::InvalidArgumentError(
            absl::StrCat("backend ", name, "'s job-file section ", s.name, " is taken"));
      }
    }
    sections_.push_back(*std::move(section));
  }
  providers_.push_back(std::move(provider));
  return absl::OkStatus();
}

const BackendProvider* BackendRegistry::Find(const std::string& name) const {
  for (const auto& p : providers_) {
    if (p->Name() == name) return p.get();
  }
  return nullptr;
}

std::vector<std::string> BackendRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& p : providers_) names.push_back(p->Name());
  return names;
}

std::string BackendRegistry::NamesForMessages(const std::string& default_name) const {
  std::vector<std::string> names = Names();
  for (std::string& name : names) {
    if (name == default_name) name += " (default)";
  }
  if (names.size() < 2) return absl::StrJoin(names, "");
  std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

}  // namespace shoal::backends
