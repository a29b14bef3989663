#pragma once

// Internal: a one-byte lock for critical sections of a few stores (a recycler depot's trade,
// a job ticket's state). A waiter spins 64 times, then yields the thread each try.
//
// Why not `std::mutex`: a pthread mutex is 40 bytes. A job ticket's lock sits on the same
// cache line as the state it guards and the flags its lane sets, and a ticket is cold when
// its lane reads it (100k queued at once were written long before). Also, the recycler's
// fork handler holds every depot's lock at once (76): ThreadSanitizer's deadlock detector
// tracks at most 64 mutexes per thread, and its check failed inside fork and hung the
// process. An atomic flag is no mutex to it.

#include <atomic>
#include <thread>

namespace troupe::detail {

class spin_lock {
 public:
  void lock() noexcept {
    for (unsigned n = 0; busy_.load(std::memory_order_relaxed) ||
                         busy_.exchange(true, std::memory_order_acquire);
         ++n)
      if (n >= 64) std::this_thread::yield();
  }
  void unlock() noexcept { busy_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> busy_{false};
};

} // namespace troupe::detail
