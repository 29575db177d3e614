// Not built: the thread-safety check's own test. Each function breaks an annotation the way a
// real change could; tools/check_thread_safety.py must flag this file, or it checks nothing.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shoal {

class Counter {
 public:
  // Reads the guarded field without the lock.
  int Read() const { return value_; }
  // Calls a REQUIRES function without the lock.
  void Bump() { BumpLocked(); }

 private:
  void BumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++value_; }
  mutable absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal
