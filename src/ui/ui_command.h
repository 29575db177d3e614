#pragma once

#include <string>
#include <vector>

namespace shoal::ui {

struct UiOptions {
  std::string listen = "127.0.0.1:8470";  // HOST:PORT; port 0: a free one
  std::string jobs_root;                  // resolved
  std::vector<std::string> serve_urls;
  std::string token_file;  // default $SHOAL_UI_TOKEN_FILE; required off loopback
  std::string shoal_binary;
};

// `shoal ui`: serves the dashboard until SIGINT or SIGTERM. Exit 2 for bad options (an
// unreadable token file, no token off loopback, a bad --listen or --serve), 1 when it cannot
// listen.
int RunUi(const UiOptions& options);

}  // namespace shoal::ui
