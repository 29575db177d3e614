#include "ui/ui_command.h"

#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "ui/ui_server.h"

namespace shoal::ui {
namespace {

constexpr int kExitUsage = 2;

absl::StatusOr<std::string> ReadUiToken(const std::string& path) {
  auto token = ReadTokenFile(path);
  if (!token.ok()) return token.status();
  if (token->size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--token-file ", path, ": the token must be at least 16 characters (e.g. `openssl rand "
        "-hex 32 > ", path, "`)"));
  }
  return token;
}

}  // namespace

int RunUi(const UiOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A browser that goes away mid-write must not end the server.
  ::signal(SIGPIPE, SIG_IGN);

  UiServerOptions server;
  size_t colon = options.listen.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port > 65535) {
    std::cerr << "shoal ui: --listen '" << options.listen
              << "' is not HOST:PORT (e.g. 127.0.0.1:8470; port 0 picks a free one)\n";
    return kExitUsage;
  }
  server.host = options.listen.substr(0, colon);
  server.port = static_cast<uint16_t>(port);
  for (const auto& url : options.serve_urls) {
    if (!absl::StartsWith(url, "http://")) {
      std::cerr << "shoal ui: --serve '" << url
                << "' is not an http:// URL of a shoal serve (e.g. http://127.0.0.1:8000)\n";
      return kExitUsage;
    }
    std::string trimmed = url;
    while (!trimmed.empty() && trimmed.back() == '/') trimmed.pop_back();
    server.serve_urls.push_back(trimmed);
  }
  std::string token_file = options.token_file;
  if (token_file.empty()) {
    if (const char* env = std::getenv("SHOAL_UI_TOKEN_FILE"); env && *env) token_file = env;
  }
  if (!token_file.empty()) {
    auto token = ReadUiToken(token_file);
    if (!token.ok()) {
      std::cerr << "shoal ui: " << token.status().message() << "\n";
      return kExitUsage;
    }
    server.token = *token;
  }
  server.jobs_root = options.jobs_root;
  server.shoal_binary = options.shoal_binary;
  auto started = UiServer::Start(server);
  if (!started.ok()) {
    std::cerr << "shoal ui: " << started.status().message() << "\n";
    return absl::IsInvalidArgument(started.status()) ? kExitUsage : 1;
  }
  std::string host = server.host.find(':') != std::string::npos && server.host[0] != '['
                         ? absl::StrCat("[", server.host, "]")
                         : server.host;
  std::cout << "shoal ui: http://" << host << ":" << (*started)->port() << "/ (jobs in "
            << options.jobs_root << (server.token.empty() ? "" : "; callers need the token")
            << "; Ctrl-C stops it)" << std::endl;
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::cerr << "shoal ui: " << (signal_number == SIGINT ? "SIGINT" : "SIGTERM")
            << ", stopping\n";
  (*started)->Stop();
  return 0;
}

}  // namespace shoal::ui
