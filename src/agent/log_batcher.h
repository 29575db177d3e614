#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "process/process_supervisor.h"

namespace shoal::agent {

using process::OutputStream;

// Gathers task output for a short window before it goes to the master. A task that flushes
// every line would otherwise cost one message per line through agent, master and client: with
// ~2,000 lines/s, ~40 % of a core of Shoal's processes next to the training they watch. One
// window's output of a task stream goes out as one chunk, in order.
//
// The chunks of all the tasks a window held also leave together: the sink is called once per
// chunk and `batch_end` once after the last chunk of each flush, so that the agent sends them
// as one message. With 8 tasks printing a line each per step, one message per chunk still cost
// the master and client a gRPC hand-over per task and step (issue 24's overhead figure).
//
// Thread-safe. The sink is called from one thread at a time, in the order the output arrived
// (per task and stream), from the batcher's thread or from a caller of Add or Flush.
class LogBatcher {
 public:
  using Sink = std::function<void(const std::string& key, OutputStream stream, std::string data)>;
  using BatchEnd = std::function<void()>;

  // window 0: every Add goes to the sink at once, in the caller's thread.
  // max_pending_bytes: past this much held output, the Add that crossed it flushes everything.
  // batch_end (optional): called after the sink calls of each flush (each Add, with window 0),
  // from the same thread, only when the flush had output.
  LogBatcher(std::chrono::milliseconds window, size_t max_pending_bytes, Sink sink,
             BatchEnd batch_end = nullptr);
  ~LogBatcher();  // flushes what is held, then stops the thread

  LogBatcher(const LogBatcher&) = delete;
  LogBatcher& operator=(const LogBatcher&) = delete;

  void Add(const std::string& key, OutputStream stream, std::string_view data);
  // Sends everything held, now, before it returns: call it before any message that must come
  // after the output (a task's exit).
  void Flush();

 private:
  struct Pending {
    std::string key;
    OutputStream stream;
    std::string data;
  };
  void Loop();

  const std::chrono::milliseconds window_;
  const size_t max_pending_bytes_;
  const Sink sink_;
  const BatchEnd batch_end_;
  std::mutex send_mu_;  // held across a whole flush, taken before mu_: keeps flushes in order
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;  // by first arrival; one entry per task stream
  size_t pending_bytes_ = 0;
  std::chrono::steady_clock::time_point first_pending_at_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace shoal::agent
