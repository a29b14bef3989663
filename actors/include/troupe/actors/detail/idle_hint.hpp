#pragma once

// Internal: how many of troupe's workers are parked, process-wide (a hint, read relaxed).

#include <atomic>

namespace troupe::detail {

/// Workers of troupe's scheduler parked right now, over every runtime of the process: its
/// worker loop counts itself in when it parks and out when it wakes. The slabs hand the
/// faulting-in of fresh pages to a helper thread only while a core is idle by this count
/// (chunk_slab.hpp, prefault_helper); a stale reading costs a run faulted on one thread
/// rather than the other, nothing more.
inline std::atomic<int>& parked_workers() noexcept {
  static std::atomic<int> n{0};
  return n;
}

} // namespace troupe::detail
