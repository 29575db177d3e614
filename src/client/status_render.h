#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace shoal::client {

// "digits-ddp-... running · 2/2 tasks running · 4s" (the live status line).
std::string StatusLine(const nlohmann::json& status, double elapsed_seconds);
// "job X succeeded in 6.2s" / "job X failed: worker:1 exited with code 3".
std::string OutcomeLine(const nlohmann::json& status, double elapsed_seconds);
// The job header and one row per task, for `shoal status`.
std::string StatusTable(const nlohmann::json& status);

}  // namespace shoal::client
