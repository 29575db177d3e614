#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "ui/job_index.h"
#include "ui/job_metrics.h"

namespace shoal::ui {

struct UiRequest {
  std::string method;
  std::string path;  // percent-decoded, without the query
  std::map<std::string, std::string> query;
  std::string body;
};

struct UiReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// Sends one server-sent event; false once the client is gone.
using EventSink = std::function<bool(std::string_view event, std::string_view data)>;

// The JSON API and the pages (docs/design/0014-web-ui.md) over a jobs directory, without any
// transport: UiServer feeds it parsed requests. Thread-safe.
class UiRoutes {
 public:
  struct Options {
    std::string jobs_root;
    std::vector<std::string> serve_urls;
    std::string shoal_binary;
    std::function<int64_t()> now_unix_ms;
  };
  explicit UiRoutes(Options options);
  ~UiRoutes();

  UiReply Handle(const UiRequest& request);

  // Whether `request` is a log follow (an event stream, served by Follow).
  static bool IsFollow(const UiRequest& request);
  // Streams new log lines until the job is over and its log sent, `stopping` turns true, or
  // the sink fails. A reply is returned instead (nothing streamed) when the request is bad.
  std::optional<UiReply> Follow(const UiRequest& request, const EventSink& sink,
                                const std::function<bool()>& stopping);

  // Ends the TensorBoard processes started on request.
  void StopChildren();

  static UiReply Error(int status, absl::string_view message);

 private:
  UiReply ListJobs(const UiRequest& request);
  UiReply JobDetail(const std::string& dir);
  UiReply Logs(const std::string& dir, const UiRequest& request);
  UiReply Resources(const std::string& dir);
  UiReply Kill(const std::string& dir);
  UiReply Rerun(const std::string& dir);
  UiReply TensorBoard(const std::string& dir, const std::string& job_id);
  UiReply Models();
  UiReply Metrics();
  UiReply Asset(const std::string& path);

  Options options_;
  JobIndex index_;
  // Each scrape reads only the journals that changed since the last one.
  JobMetricsCache metrics_cache_;
  absl::Mutex children_mu_;
  // job id -> (pid, url)
  std::map<std::string, std::pair<int, std::string>> tensorboards_ ABSL_GUARDED_BY(children_mu_);
  // The last scrape of each serve URL, for request rates: url -> (unix ms, model -> count).
  absl::Mutex models_mu_;
  std::map<std::string, std::pair<int64_t, std::map<std::string, double>>> last_scrape_
      ABSL_GUARDED_BY(models_mu_);
};

}  // namespace shoal::ui
