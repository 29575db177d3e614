#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shoal::serve {

// The CPUs every model instance of the server shares, as slots: an instance holds as many as
// it has intra-op threads while it runs a batch. When the configs ask for more instances than
// there are CPUs, the ones beyond wait for a slot rather than preempt the running ones: on a
// shared core two LSTM instances preempting each other spent a third more CPU per request
// than one at a time (context switches, each evicting the other's caches), and the requests
// that arrive meanwhile join the waiting instance's batch, which the model runs for less CPU
// per row than two small ones. Thread-safe.
class ComputeSlots {
 public:
  // `capacity` >= 1: the server's CPUs.
  explicit ComputeSlots(int capacity);

  int capacity() const { return capacity_; }
  // The slots an instance of `threads` intra-op threads holds: at least 1, at most all.
  int SlotsFor(int threads) const;
  // Takes `n` slots (from SlotsFor) if they are free now and nobody waits for slots.
  bool TryAcquire(int n);
  // Waits until `n` slots are free and every earlier caller of Acquire has had its turn, then
  // takes them.
  void Acquire(int n);
  void Release(int n);
  // Hints, for deciding whom to wake: they may be stale by the time they return.
  int Available() const;
  bool HasWaiters() const;

 private:
  const int capacity_;
  mutable absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;  // threads in Acquire
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // Acquire's turns, in arrival order
  uint64_t head_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // the turn that may take slots next
  absl::CondVar turn_;  // slots were released, or the head of the line moved
};

}  // namespace shoal::serve
