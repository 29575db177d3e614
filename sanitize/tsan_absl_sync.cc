// Linked only into the TSan build (sanitize/run.sh tsan): tells ThreadSanitizer about abseil's
// Mutex, CondVar and Notification. Debian's abseil is not built with TSan, so its lock words and
// futex waits are invisible to it: without this, every field an absl::Mutex guards (the agent's,
// the supervisor's, and gRPC's own, since gRPC locks absl::Mutex too) would be reported as a
// race. The linker's --wrap sends every call of these functions from other objects here (the
// options are in sanitize/run.sh); each calls the real one and adds the annotation that abseil
// itself makes when it is built with TSan (absl/base/internal/tsan_mutex_interface.h).
#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

extern "C" {
void __real__ZN4absl7debian35Mutex4LockEv(Mutex* mu);
void __real__ZN4absl7debian35Mutex6UnlockEv(Mutex* mu);
bool __real__ZN4absl7debian35Mutex7TryLockEv(Mutex* mu);
void __real__ZN4absl7debian35Mutex10ReaderLockEv(Mutex* mu);
void __real__ZN4absl7debian35Mutex12ReaderUnlockEv(Mutex* mu);
void __real__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(CondVar* cv, Mutex* mu);
bool __real__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(CondVar* cv,
                                                                                 Mutex* mu,
                                                                                 Duration timeout);
bool __real__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(CondVar* cv,
                                                                              Mutex* mu,
                                                                              Time deadline);
void __real__ZN4absl7debian312Notification6NotifyEv(Notification* n);
void __real__ZNK4absl7debian312Notification19WaitForNotificationEv(const Notification* n);
bool __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
    const Notification* n, Duration timeout);
bool __real__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(
    const Notification* n, Time deadline);

void __wrap__ZN4absl7debian35Mutex4LockEv(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, 0);
  __real__ZN4absl7debian35Mutex4LockEv(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
}
void __wrap__ZN4absl7debian35Mutex6UnlockEv(Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, 0);
  __real__ZN4absl7debian35Mutex6UnlockEv(mu);
  __tsan_mutex_post_unlock(mu, 0);
}
bool __wrap__ZN4absl7debian35Mutex7TryLockEv(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  bool locked = __real__ZN4absl7debian35Mutex7TryLockEv(mu);
  __tsan_mutex_post_lock(mu, locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
  return locked;
}
void __wrap__ZN4absl7debian35Mutex10ReaderLockEv(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_read_lock);
  __real__ZN4absl7debian35Mutex10ReaderLockEv(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_read_lock, 0);
}
void __wrap__ZN4absl7debian35Mutex12ReaderUnlockEv(Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, __tsan_mutex_read_lock);
  __real__ZN4absl7debian35Mutex12ReaderUnlockEv(mu);
  __tsan_mutex_post_unlock(mu, __tsan_mutex_read_lock);
}

// A wait gives the mutex up and takes it again before it returns.
void __wrap__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(CondVar* cv, Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  __real__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(cv, mu);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
}
bool __wrap__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(CondVar* cv,
                                                                                 Mutex* mu,
                                                                                 Duration timeout) {
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  bool timed_out =
      __real__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(cv, mu, timeout);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return timed_out;
}
bool __wrap__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(CondVar* cv,
                                                                              Mutex* mu,
                                                                              Time deadline) {
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  bool timed_out =
      __real__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(cv, mu, deadline);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return timed_out;
}

// What happened before Notify() happened before a wait that saw it.
void __wrap__ZN4absl7debian312Notification6NotifyEv(Notification* n) {
  __tsan_release(n);
  __real__ZN4absl7debian312Notification6NotifyEv(n);
}
void __wrap__ZNK4absl7debian312Notification19WaitForNotificationEv(const Notification* n) {
  __real__ZNK4absl7debian312Notification19WaitForNotificationEv(n);
  __tsan_acquire(const_cast<Notification*>(n));
}
bool __wrap__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
    const Notification* n, Duration timeout) {
  bool notified =
      __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
          n, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}
bool __wrap__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(
    const Notification* n, Time deadline) {
  bool notified =
      __real__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(n,
                                                                                         deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}
}
