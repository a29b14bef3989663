// The recycler (troupe/actors/detail/recycler.hpp): small blocks are reused on their thread,
// cross threads in whole magazines through the depot, and go back to the system past the
// depot's cap or once they sat in the depot through a whole reaping interval. Under
// AddressSanitizer the recycler is off; these tests then check only that every block is
// usable (the reuse checks need it on).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <troupe/actors/detail/recycler.hpp>
#include <troupe/troupe.hpp>

#include "reap_clock.hpp" // internal (actors/src): the pacer

namespace rc = troupe::detail::recycler;

namespace {

troupe::task<int> frame_of(int x) {
  co_return x + 1;
}

/// Holds the reaping interval at an hour while it lives: only the test's own reaps run.
struct reap_interval_held {
  std::chrono::nanoseconds old = rc::set_reap_interval(std::chrono::hours{1});
  ~reap_interval_held() { rc::set_reap_interval(old); }
};


/// On a thread of its own: allocates `n` blocks of `size` bytes into `blocks`, then frees
/// them all; returns how many of them were in `seen`.
size_t burst_on_thread(size_t size, size_t n, const std::set<void*>& seen,
                       std::vector<void*>& blocks) {
  size_t reused = 0;
  std::thread t{[&] {
    for (size_t i = 0; i < n; ++i) {
      blocks.push_back(rc::allocate(size));
      reused += seen.count(blocks.back());
    }
    for (auto* p : blocks)
      rc::deallocate(p, size);
  }};
  t.join();
  return reused;
}

/// The pacing tests' start: the interval held, a clean depot (its 448-byte class at most at
/// its floor), a burst of `mags` magazines left in it by another thread, and the pacer reset
/// at the end (the process's reapers go on unpaused).
struct paced_depot {
  static constexpr size_t size = 448;
  reap_interval_held held;
  std::vector<void*> blocks;
  explicit paced_depot(size_t mags) {
    rc::reap_now();
    rc::reap_now();
    burst_on_thread(size, 64 * mags, {}, blocks);
  }
  ~paced_depot() { troupe::detail::reap_pacer::reset(); }
  /// Pauses the pacer as a pass of 5 ms would (1 s): the next paced pass surely falls in it.
  static void pause_pacer() {
    auto five_ms = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds{5});
    troupe::detail::reap_pacer::spent(troupe::detail::reap_pacer::now() - five_ms.count());
  }
};

} // namespace

TEST_CASE("recycler: a freed block is reused by the next allocation of its class on the same thread",
          "[recycler]") {
  // Classes are 16 bytes apart up to 256, 64 bytes apart above: {a size, the largest of its
  // class, the smallest of the next}.
  struct bounds {
    size_t size, last, next;
  };
  for (auto [size, last, next] : {bounds{130, 144, 145}, bounds{300, 320, 321}}) {
    INFO("class of " << size);
    auto* p = rc::allocate(size);
    std::memset(p, 0xab, size);
    rc::deallocate(p, size);
    auto* q = rc::allocate(last); // the same class
    std::memset(q, 0xcd, last);
    if (rc::enabled())
      CHECK(q == p);
    rc::deallocate(q, last);
    auto* r = rc::allocate(next); // another class does not get it
    if (rc::enabled())
      CHECK(r != p);
    rc::deallocate(r, next);
  }
  // Large blocks pass through.
  auto* big = rc::allocate(rc::max_small + 1);
  std::memset(big, 0, rc::max_small + 1);
  rc::deallocate(big, rc::max_small + 1);
}

TEST_CASE("recycler: blocks freed on another thread come back through the depot in magazines",
          "[recycler]") {
  constexpr size_t n = 64 * 8;
  constexpr size_t size = 448;
  std::vector<void*> made;
  std::thread producer{[&] {
    for (size_t i = 0; i < n; ++i)
      made.push_back(rc::allocate(size));
  }};
  producer.join();
  auto before = rc::stats();
  std::thread consumer{[&] {
    for (auto* p : made)
      rc::deallocate(p, size);
  }};
  consumer.join();
  auto after_free = rc::stats();
  std::set<void*> freed(made.begin(), made.end());
  std::vector<void*> again;
  size_t reused = burst_on_thread(size, n, freed, again);
  auto after_take = rc::stats();
  if (!rc::enabled()) {
    CHECK(after_take.depot_puts == before.depot_puts);
    return;
  }
  // The consumer kept two magazines and handed the others in, whole; its thread's end
  // handed in what it kept (the depot's cap may have sent some back to the system).
  CHECK(after_free.depot_puts - before.depot_puts >= 6);
  CHECK(after_take.depot_takes - after_free.depot_takes >= 6);
  // The third thread got the freed blocks, not fresh ones, while the depot had them.
  CHECK(reused >= 6 * 64);
}

TEST_CASE("recycler: past the depot's cap, freed blocks go back to the system", "[recycler]") {
  constexpr size_t size = rc::max_small; // the largest class: the depot keeps 256 magazines
  constexpr size_t n = 64 * 272;         // 68 MB
  auto before = rc::stats();
  std::vector<void*> blocks;
  burst_on_thread(size, n, {}, blocks);
  auto after = rc::stats();
  rc::reap_now(); // what the depot kept goes back too (see the working-set test below)
  rc::reap_now();
  if (!rc::enabled()) {
    CHECK(after.overflow_frees == before.overflow_frees);
    return;
  }
  // 272 magazines' worth: at most 2 kept by the thread and 256 by the depot.
  CHECK(after.overflow_frees - before.overflow_frees >= 14 * 64);
  CHECK(rc::depot_blocks(size) <= 2 * 64);
}

TEST_CASE("recycler: the depot keeps a burst's blocks for the next burst, and gives back those "
          "that sat unused through a whole reaping interval", "[recycler]") {
  // 448 bytes: the depot keeps up to 2340 magazines of this class, 18 past a reap (512 KB).
  constexpr size_t size = 448;
  constexpr size_t mags = 400; // more than one reap frees at once (256 magazines)
  constexpr size_t n = 64 * mags;
  constexpr size_t floor_blocks = 18 * 64;
  // Only this test's reaps: none begins on its own while it runs.
  reap_interval_held held;
  rc::reap_now();
  rc::reap_now(); // a clean start: this class holds at most its floor
  auto s0 = rc::stats();
  std::vector<void*> blocks;
  burst_on_thread(size, n, {}, blocks);
  std::set<void*> first(blocks.begin(), blocks.end());
  blocks.clear();
  auto s1 = rc::stats();
  if (!rc::enabled()) {
    CHECK(s1.overflow_frees == s0.overflow_frees);
    rc::reap_now();
    CHECK(rc::stats().reaped == s0.reaped);
    return;
  }
  // The whole burst stayed: nothing went back to the system at the depot's cap.
  CHECK(s1.overflow_frees == s0.overflow_frees);
  CHECK(rc::depot_blocks(size) >= (mags - 2) * 64);
  // The next burst (another thread) gets the same blocks, not fresh ones.
  CHECK(burst_on_thread(size, n, first, blocks) >= (mags - 2) * 64);
  // A reap now: the blocks were taken during the interval (its working set), so they stay.
  rc::reap_now();
  auto s2 = rc::stats();
  CHECK(s2.reaped - s1.reaped <= floor_blocks);
  CHECK(rc::depot_blocks(size) >= (mags - 2) * 64);
  // Nothing took them through a whole interval: the next reap gives back all but the floor,
  // over several passes (at most 256 magazines each).
  rc::reap_now();
  auto s3 = rc::stats();
  CHECK(s3.reaped - s2.reaped >= (mags - 20) * 64);
  CHECK(rc::depot_blocks(size) <= floor_blocks);
  CHECK(s3.reaps - s1.reaps == 2);
}

TEST_CASE("recycler: a reaper's own passes are paced (32 magazines a pass, then a pause); "
          "reap_now's are not",
          "[recycler]") {
  // An idle worker's timed-out sleep and the depot's trades call reap_idle: each pass frees
  // at most 32 magazines, and the next one waits 200 times as long as that took
  // (reap_pacer, shared with the actor slab), however much a burst left in the depot.
  namespace d = troupe::detail;
  constexpr size_t mags = 100;
  constexpr size_t floor_blocks = 18 * 64;
  paced_depot pd{mags};
  auto size = pd.size;
  if (!rc::enabled()) {
    SUCCEED("the recycler is off in this build");
    return;
  }
  REQUIRE(rc::depot_blocks(size) >= (mags - 2) * 64);
  rc::reap_now(); // the burst's interval ends: its blocks were used in it, they stay
  REQUIRE(rc::depot_blocks(size) >= (mags - 2) * 64);
  auto s0 = rc::stats();
  // From now on every reap_idle begins an interval.
  rc::set_reap_interval(std::chrono::nanoseconds{0});
  d::reap_pacer::reset();
  auto before_pass = d::reap_pacer::now();
  rc::reap_idle(); // they sat unused through a whole interval: 32 magazines go back
  auto s1 = rc::stats();
  CHECK(s1.reaped > s0.reaped);
  CHECK(s1.reaped - s0.reaped <= 32 * 64);
  CHECK(d::reap_pacer::resume_at() > before_pass); // the pass set the pause after it
  paced_depot::pause_pacer(); // (the pass's own pause, a few ms, a preempted test outlives)
  rc::reap_idle(); // paused: an interval begins, nothing goes back
  auto s2 = rc::stats();
  CHECK(s2.reaped == s1.reaped);
  CHECK(s2.reaps == s1.reaps + 1);
  CHECK(rc::depot_blocks(size) > floor_blocks + 32 * 64);
  // reap_now's passes are not paced.
  rc::reap_now();
  rc::reap_now();
  CHECK(rc::depot_blocks(size) <= floor_blocks);
}

TEST_CASE("recycler: magazines a burst takes back in use are no longer doomed, however long "
          "the pacer held their reaping back",
          "[recycler]") {
  namespace d = troupe::detail;
  constexpr size_t mags = 100;
  paced_depot pd{mags};
  auto size = pd.size;
  if (!rc::enabled()) {
    SUCCEED("the recycler is off in this build");
    return;
  }
  rc::reap_now(); // the burst's interval ends: its magazines stay (used in it)
  // An interval dooms them all; the pacer holds their reaping back.
  rc::set_reap_interval(std::chrono::nanoseconds{0});
  paced_depot::pause_pacer();
  rc::reap_idle();
  rc::set_reap_interval(std::chrono::hours{1});
  auto s0 = rc::stats();
  // Another burst takes every magazine back in use and hands its own back.
  pd.blocks.clear();
  burst_on_thread(size, 64 * mags, {}, pd.blocks);
  REQUIRE(rc::depot_blocks(size) >= (mags - 2) * 64);
  d::reap_pacer::reset();
  rc::reap_idle(); // no interval ends; the backlog went with the magazines' use
  CHECK(rc::stats().reaped == s0.reaped);
  CHECK(rc::depot_blocks(size) >= (mags - 2) * 64);
}

TEST_CASE("recycler: coroutine frames and node containers use it", "[recycler]") {
  auto before = rc::stats();
  for (int round = 0; round < 2; ++round) { // the second round reuses the first's frames
    std::vector<troupe::task<int>> ts; // kept, so the frames are not elided
    for (int i = 0; i < 10; ++i)
      ts.push_back(frame_of(i));
  }
  std::map<int, int, std::less<>, rc::allocator<std::pair<const int, int>>> m;
  for (int i = 0; i < 100; ++i)
    m.emplace(i, i);
  m.clear();
  for (int i = 0; i < 100; ++i)
    m.emplace(i, i);
  CHECK(m.size() == 100);
  auto sp = rc::make_shared<std::string>("shared through the recycler");
  CHECK(*sp == "shared through the recycler");
  auto after = rc::stats();
  if (rc::enabled())
    CHECK(after.hits - before.hits >= 10 + 100); // the second round of frames, the second fill
  else
    CHECK(after.hits == before.hits);
}

TEST_CASE("recycler: a child forked while other threads trade magazines can still allocate",
          "[recycler]") {
  // Two threads pass blocks back and forth (each free of the other's blocks fills magazines
  // that go through the depot's locks) while the main thread forks. In each child the
  // recycler must work at once: the fork held every depot lock (pthread_atfork), so none is
  // left locked by a thread that does not exist in the child. A child that hangs is ended
  // by its alarm and counts as a failure (without the fork handlers, about 2% of the 300
  // children hung).
  if (!rc::enabled()) {
    // Under AddressSanitizer every call goes to ASan's allocator, whose fork safety is not
    // troupe's to test (clang 14's leaves about 1% of such children hanging).
    SUCCEED("the recycler is off in this build");
    return;
  }
  std::atomic<bool> stop{false};
  // Each loop allocates `n` blocks of `size` and frees them; with `reap`, two reaps in a row
  // then give every block back to its class's chunks, so the next loop maps and takes them
  // again under the class slab's lock, which the fork must hold too.
  auto churn = [&](size_t size, int n, bool reap) {
    std::vector<void*> mine;
    while (!stop.load(std::memory_order_relaxed)) {
      for (int i = 0; i < n; ++i)
        mine.push_back(rc::allocate(size));
      for (auto* p : mine)
        rc::deallocate(p, size);
      mine.clear();
      if (reap) {
        rc::reap_now();
        rc::reap_now();
      }
    }
  };
  constexpr size_t chunky_size = 3008; // past its burst: a third thread sends it through chunks
  reap_interval_held held; // only this test's reaps
  auto chunk_blocks_before = rc::stats().chunk_blocks;
  std::thread a{churn, 192, 256, false};
  std::thread b{churn, 192, 256, false};
  std::thread c{churn, chunky_size, 1024, true};
  int failed = 0;
  for (int round = 0; round < 300; ++round) {
    auto pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::alarm(2);
      std::vector<void*> blocks;
      for (int i = 0; i < 64 * 8; ++i)
        blocks.push_back(rc::allocate(192));
      for (auto* p : blocks)
        rc::deallocate(p, 192);
      for (int i = 0; i < 64 * 8; ++i)
        blocks[static_cast<size_t>(i)] = rc::allocate(192);
      for (auto* p : blocks)
        rc::deallocate(p, 192);
      for (int i = 0; i < 64 * 8; ++i) // the chunked class too
        blocks[static_cast<size_t>(i)] = rc::allocate(chunky_size);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  a.join();
  b.join();
  c.join();
  CHECK(failed == 0);
  CHECK(rc::stats().chunk_blocks > chunk_blocks_before); // the third thread used chunks
}

TEST_CASE("recycler: past a 1 MB burst a class's blocks come from 2 MB chunks of its own, which "
          "go back to the system once the depot gave their blocks back",
          "[recycler]") {
  // 3008 bytes: a class no other test here uses. 1 MB of it is 349 blocks: the rest of a
  // 4000-block burst must come from chunks (one trip per 32 blocks).
  constexpr size_t size = 3008;
  constexpr size_t n = 4000;
  reap_interval_held held; // only this test's reaps
  auto s0 = rc::stats();
  std::vector<void*> blocks;
  std::thread t{[&] {
    for (size_t i = 0; i < n; ++i) {
      blocks.push_back(rc::allocate(size));
      std::memset(blocks.back(), static_cast<int>(i & 0xff), size);
    }
  }};
  t.join();
  auto s1 = rc::stats();
  // Every block is whole and apart from the others (a chunk's blocks do not overlap).
  std::vector<char*> sorted;
  for (auto* p : blocks)
    sorted.push_back(static_cast<char*>(p));
  std::sort(sorted.begin(), sorted.end());
  size_t overlapping = 0;
  for (size_t i = 1; i < sorted.size(); ++i)
    overlapping += sorted[i] < sorted[i - 1] + size;
  CHECK(overlapping == 0);
  size_t damaged = 0;
  for (size_t i = 0; i < n; ++i) {
    auto* p = static_cast<unsigned char*>(blocks[i]);
    damaged += p[0] != (i & 0xff) || p[size - 1] != (i & 0xff);
  }
  CHECK(damaged == 0);
  if (rc::enabled()) {
    CHECK(s1.chunk_blocks - s0.chunk_blocks >= n - 1024 * 1024 / size - 64);
    // 2 MB chunks of 697 blocks each: at least the 3651 blocks past the burst's first 1 MB.
    CHECK(s1.chunks - s0.chunks >= 5);
  } else {
    CHECK(s1.chunk_blocks == s0.chunk_blocks);
  }
  std::thread u{[&] {
    for (auto* p : blocks)
      rc::deallocate(p, size);
  }};
  u.join();
  // The depot keeps them through the interval they were freed in; the next reap gives back
  // all but its floor (2 magazines of this class), and the chunks they emptied go back.
  rc::reap_now();
  rc::reap_now();
  rc::reap_now();
  auto s2 = rc::stats();
  CHECK(rc::depot_blocks(size) <= 2 * 64);
  if (rc::enabled()) CHECK(s2.chunks <= s0.chunks + 2); // the chunks the floor's blocks hold
}

namespace {

/// Frees its block when its thread ends, after the thread's recycler cache is gone (it was
/// made before the cache, so it is destroyed after it).
struct late_free {
  void* block = nullptr;
  size_t size = 0;
  ~late_free() {
    if (block != nullptr) rc::deallocate(block, size);
  }
};

} // namespace

TEST_CASE("recycler: a block from a class's chunks freed as its thread ends goes back to its chunk",
          "[recycler]") {
  // Without the chunk check, that free went to `::operator delete` and glibc aborted the
  // process ("free(): invalid pointer"): a chunk's block is no block of glibc's.
  constexpr size_t size = 3008; // past its burst since the test above (or made so here)
  std::vector<void*> warm;
  for (size_t i = 0; i < 1500; ++i)
    warm.push_back(rc::allocate(size));
  for (auto* p : warm)
    rc::deallocate(p, size);
  bool from_chunk = false;
  std::thread t{[&from_chunk] {
    thread_local late_free holder; // before the thread's first recycler call
    holder.size = size;
    std::vector<void*> more;
    // Past the depot's blocks: the first block a trip to the chunks brought is kept.
    for (size_t i = 0; i < 20000 && holder.block == nullptr; ++i) {
      auto seen = rc::stats().chunk_blocks;
      auto* p = rc::allocate(size);
      if (rc::stats().chunk_blocks > seen)
        holder.block = p;
      else
        more.push_back(p);
    }
    from_chunk = holder.block != nullptr;
    for (auto* p : more)
      rc::deallocate(p, size);
  }};
  t.join();
  CHECK(from_chunk == rc::enabled());
  auto* again = rc::allocate(size);
  std::memset(again, 1, size);
  rc::deallocate(again, size);
}
