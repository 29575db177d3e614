#pragma once

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace shoal::client {

// "digits-ddp-... running · 2/2 tasks running · 4s" (the live status line).
std::string StatusLine(const nlohmann::json& status, double elapsed_seconds);
// "job X succeeded in 6.2s" / "job X failed: worker:1 exited with code 3".
std::string OutcomeLine(const nlohmann::json& status, double elapsed_seconds);
// The job header and one row per task, for `shoal status`. `now_unix_ms` dates the last
// publication ("14s ago").
std::string StatusTable(const nlohmann::json& status, int64_t now_unix_ms);
// "mlp version 7 at step 1200 (loss 0.12), published by worker:0 14s ago": status.json's
// last_publication.
std::string PublicationLine(const nlohmann::json& publication, int64_t now_unix_ms);

}  // namespace shoal::client
