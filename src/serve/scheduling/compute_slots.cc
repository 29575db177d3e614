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
  // behind those already waiting, even though the slots are free when it asks.
  struct Turn {
    const int* free;
    const uint64_t* head;
    uint64_t ticket;
    int wanted;
    bool Holds() const { return *head == ticket && *free >= wanted; }
  };
  absl::MutexLock lock(&mu_);
  Turn turn{&free_, &head_ticket_, next_ticket_++, n};
  ++waiters_;
  mu_.Await(absl::Condition(&turn, &Turn::Holds));
  --waiters_;
  ++head_ticket_;
  free_ -= n;
}

void ComputeSlots::Release(int n) {
  absl::MutexLock lock(&mu_);
  free_ += n;
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
