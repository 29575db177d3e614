#pragma once

#include "nlohmann/json.hpp"

namespace shoal::v1 {
class JobStatus;
}

namespace shoal::master {

// The one JSON form of a job's status: status.json, `shoal status --json`, `shoal list --json`.
nlohmann::json JobStatusToJson(const v1::JobStatus& status);

}  // namespace shoal::master
