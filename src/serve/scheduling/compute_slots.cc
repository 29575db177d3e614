#include "serve/scheduling/compute_slots.h"

#include <algorithm>

namespace shoal::serve {

ComputeSlots::ComputeSlots(int capacity) : capacity_(std::max(capacity, 1)), free_(capacity_) {}

int ComputeSlots::SlotsFor(int threads) const { return std::clamp(threads, 1, capacity_); }

bool ComputeSlots::TryAcquire(int n) {
  absl::MutexLock lock(&mu_);
  // Slots freed while others wait are theirs: a thread that just released them must not take
  // them back before the waiters run.
  if (waiters_ > 0 || free_ < n) return false;
  free_ -= n;
  return true;
}

void ComputeSlots::Acquire(int n) {
  // First come, first served: a thread that released slots and asks again at once queues
  // behind those already waiting, even though the slots are free when it asks. A CondVar, not
  // Mutex::Await: the sanitizers' wrapper of Debian's abseil (sanitize/tsan_absl_sync.cc) sees
  // CondVar waits, and Await's conditions run on other threads inside abseil.
  absl::MutexLock lock(&mu_);
  uint64_t ticket = next_ticket_++;
  ++waiters_;
  while (head_ticket_ != ticket || free_ < n) turn_.Wait(&mu_);
  --waiters_;
  ++head_ticket_;
  free_ -= n;
  turn_.SignalAll();  // the next in line may fit in what is left
}

void ComputeSlots::Release(int n) {
  absl::MutexLock lock(&mu_);
  free_ += n;
  turn_.SignalAll();
}

int ComputeSlots::Available() const {
  absl::MutexLock lock(&mu_);
  return free_;
}

bool ComputeSlots::HasWaiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_ > 0;
}

}  // namespace shoal::serve
