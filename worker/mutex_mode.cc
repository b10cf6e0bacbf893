#include "worker/mutex_mode.h"

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace ring::worker {

void UseServingMutexMode() {
  const char* v = std::getenv("RING_MUTEX_DEADLOCK_CHECK");
  absl::SetMutexDeadlockDetectionMode(v != nullptr && std::strcmp(v, "1") == 0
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ring::worker
