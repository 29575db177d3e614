#include "serve/scheduling/compute_slots.h"

#include <algorithm>

namespace shoal::serve {

ComputeSlots::ComputeSlots(int capacity) : capacity_(std::max(capacity, 1)), free_(capacity_) {}

int ComputeSlots::SlotsFor(int threads) const { return std::clamp(threads, 1, capacity_); }

bool ComputeSlots::TryAcquire(int n) {
  absl::MutexLock lock(&mu_);
  if (free_ < n) return false;
  free_ -= n;
  return true;
}

void ComputeSlots::Acquire(int n) {
  struct Enough {
    const int* free;
    int wanted;
    bool Holds() const { return *free >= wanted; }
  };
  absl::MutexLock lock(&mu_);
  Enough enough{&free_, n};
  mu_.Await(absl::Condition(&enough, &Enough::Holds));
  free_ -= n;
}

void ComputeSlots::Release(int n) {
  absl::MutexLock lock(&mu_);
  free_ += n;
}

}  // namespace shoal::serve
