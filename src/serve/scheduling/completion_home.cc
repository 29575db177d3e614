#include "serve/scheduling/completion_home.h"

#include <utility>

namespace shoal::serve {
namespace {

thread_local std::shared_ptr<CompletionHome> this_thread_home;
thread_local int this_thread_home_suspended = 0;

}  // namespace

void CompletionHome::Install(std::function<void()> wake) {
  this_thread_home = std::make_shared<CompletionHome>(std::move(wake));
}

void CompletionHome::Uninstall() {
  if (!this_thread_home) return;
  this_thread_home->Close();
  this_thread_home.reset();
}

void CompletionHome::DrainThisThread() {
  if (this_thread_home) this_thread_home->Drain();
}

std::shared_ptr<CompletionHome> CompletionHome::Current() {
  if (this_thread_home_suspended > 0) return nullptr;
  return this_thread_home;
}

CompletionHome::Suspend::Suspend() { ++this_thread_home_suspended; }
CompletionHome::Suspend::~Suspend() { --this_thread_home_suspended; }

bool CompletionHome::Deliver(std::vector<std::unique_ptr<PendingInference>>& finished) {
  // Under the lock, so that once Close() has returned nothing calls `wake_` (its loop may be
  // gone). A drain that has already taken the queue runs to its end; the next delivery finds
  // the queue empty and wakes again.
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  if (delivered_.empty()) {
    delivered_.swap(finished);
    wake_();
  } else {
    for (auto& request : finished) delivered_.push_back(std::move(request));
  }
  finished.clear();
  return true;
}

void CompletionHome::Drain() {
  {
    absl::MutexLock lock(&mu_);
    draining_.swap(delivered_);
  }
  // Each request, and what it holds, goes before the next one runs.
  for (auto& request : draining_) Finish(std::move(request));
  draining_.clear();
}

void CompletionHome::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Delivered before the close: their drain was posted to a loop that has stopped.
  Drain();
}

}  // namespace shoal::serve
