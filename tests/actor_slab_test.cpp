// The actor slab (troupe/actors/detail/actor_slab.hpp): task actors live in 2 MB chunks of
// their own, every block comes back, a drained burst's chunks wait for the next burst (up to
// a cap), and the reaper gives back the ones that sat unused through an interval. Under
// AddressSanitizer the slab is off; these tests then check only that tasks and blocks work
// (the accounting checks need it on).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <set>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include <catch2/catch.hpp>

#include <troupe/actors/detail/actor_slab.hpp>
#include <troupe/troupe.hpp>

#include "chunk_slab.hpp" // internal (actors/src): tested as a class of its own

namespace slab = troupe::detail::actor_slab;

namespace {

/// Spawns `n` trivial tasks at once, checks the slab holds them all at the peak, awaits
/// them; yields the sum of their results.
long spawn_burst(troupe::runtime& rt, long n, slab::counters& peak) {
  auto r = rt.run([n, &peak](troupe::context& cx) -> troupe::task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([]() -> troupe::task<int> { co_return 1; }));
    peak = slab::stats();
    long sum = 0;
    for (auto& h : hs)
      if (auto v = co_await cx.await(h)) sum += *v;
    co_return sum;
  });
  return r ? *r : -1;
}

/// Runs one task on a runtime of its own, so the slab's block size (the task actor's
/// storage size, set by the first task) is known.
void run_one_task() {
  auto rt = troupe::runtime::builder{}.threads(1).build();
  REQUIRE(rt);
  slab::counters peak;
  REQUIRE(spawn_burst(*rt, 1, peak) == 1);
}

/// The kernel's transparent huge page mode line ("always [madvise] never"; empty if none).
std::string thp_mode() {
  std::string line;
  std::ifstream f{"/sys/kernel/mm/transparent_hugepage/enabled"};
  std::getline(f, line);
  return line;
}

/// Hands every run of fresh pages to the prefault helper while a test runs (the test's
/// thread is no worker: none need be parked), then restores the rule.
struct helper_always {
  helper_always() { troupe::detail::prefault_helper::set_always(true); }
  ~helper_always() { troupe::detail::prefault_helper::set_always(false); }
  helper_always(const helper_always&) = delete;
  helper_always& operator=(const helper_always&) = delete;
};

/// Holds the slab's reaping interval at an hour while a test runs (its accounting checks
/// must not see the reaper give back chunks that earlier tests left empty; a slow build,
/// as under ThreadSanitizer, can spend a whole 10 s interval in one test), then restores it.
struct no_timed_reap {
  std::chrono::nanoseconds old = slab::set_reap_interval(std::chrono::hours{1});
  ~no_timed_reap() { slab::set_reap_interval(old); }
};

/// A chunk slab of its own for the reaping tests (1 KB blocks, up to 64 empty chunks kept,
/// no floor), no interval ending until a test sets one; the pacer is reset when it goes,
/// so the process's reapers go on unpaused.
struct paced_slab {
  troupe::detail::chunk_slab<std::mutex> s{troupe::detail::chunk_slab_shape{
      .block = 1024, .align = 64, .cap_chunks = 64, .floor_chunks = 0}};
  std::vector<void*> blocks;
  /// Starts with `chunks` chunks filled, then emptied: `chunks - 1` wait empty (the current
  /// one stays current).
  explicit paced_slab(std::size_t chunks) {
    s.set_reap_interval(std::chrono::hours{1});
    fill(chunks);
    empty_all();
  }
  ~paced_slab() { troupe::detail::reap_pacer::reset(); }
  /// Takes `chunks` chunks' worth of blocks, each written (its pages resident: an unmap
  /// then has work to do).
  void fill(std::size_t chunks) {
    blocks.push_back(s.allocate(1024));
    REQUIRE(blocks.back() != nullptr);
    while (blocks.size() < chunks * s.stats().blocks_per_chunk)
      blocks.push_back(s.allocate(1024));
    for (auto* p : blocks)
      std::memset(p, 1, 1024);
  }
  /// Pauses the pacer as a pass of 5 ms would (1 s): the next paced pass surely falls in it.
  static void pause_pacer() {
    auto five_ms = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds{5});
    troupe::detail::reap_pacer::spent(troupe::detail::reap_pacer::now() - five_ms.count());
  }
  /// Gives every block back (the current chunk stays current, the others wait empty).
  void empty_all() {
    for (auto* p : blocks)
      REQUIRE(s.deallocate(p, 1024));
    blocks.clear();
  }
};

} // namespace

TEST_CASE("actor slab: a burst of tasks lives in the slab, its empty chunks serve the next "
          "burst, and the reaper gives back those that sat unused",
          "[actor_slab]") {
  no_timed_reap hold;
  constexpr long n = 10000;
  // A clean start: what earlier tests left doomed (and the pacer held back) goes now, so
  // no reaper's pass during the bursts below finds a backlog to give back.
  slab::reap_now();
  slab::reap_now();
  auto before = slab::stats();
  slab::counters peak;
  {
    auto rt = troupe::runtime::builder{}.threads(2).build();
    REQUIRE(rt);
    CHECK(spawn_burst(*rt, n, peak) == n);
  }
  auto after = slab::stats();
  if (!slab::enabled()) {
    CHECK(after.allocated == 0);
    return;
  }
  // Every task of the burst (and the root) had its storage from the slab at the peak.
  CHECK(peak.live >= before.live + n);
  CHECK(after.allocated >= before.allocated + n + 1);
  CHECK(after.block_bytes % 64 == 0);
  CHECK(after.blocks_per_chunk * after.block_bytes <= slab::chunk_bytes);
  // The burst's own blocks (blocks alive before it may sit in chunks of their own).
  auto burst = peak.live - before.live;
  auto peak_chunks = (burst + after.blocks_per_chunk - 1) / after.blocks_per_chunk;
  REQUIRE(peak_chunks >= 3);
  // The runtime is gone: every block came back, and the burst's chunks wait, empty and
  // mapped, for the next burst (none was given back: far below the cap).
  CHECK(after.live == before.live);
  CHECK(after.unmapped == before.unmapped);
  CHECK(after.empty_chunks >= peak_chunks - 1);
  // The next burst maps nothing: it runs in the chunks kept.
  {
    auto rt = troupe::runtime::builder{}.threads(2).build();
    REQUIRE(rt);
    CHECK(spawn_burst(*rt, n, peak) == n);
  }
  auto again = slab::stats();
  CHECK(again.chunks == after.chunks);
  CHECK(again.unmapped == after.unmapped);
  CHECK(again.live == before.live);
  // A reap right after the burst keeps them (they were used during the interval); the next
  // one gives back all but the one kept for good (and the current chunk, empty too).
  slab::reap_now();
  CHECK(slab::stats().empty_chunks >= peak_chunks - 1);
  slab::reap_now();
  auto reaped = slab::stats();
  CHECK(reaped.empty_chunks <= 2);
  CHECK(reaped.chunks <= again.chunks - (again.empty_chunks - 2));
  CHECK(reaped.unmapped >= again.unmapped + again.empty_chunks - 2);
  CHECK(reaped.reaped >= again.reaped + again.empty_chunks - 2);
  CHECK(reaped.reaps >= again.reaps + 2);
}

TEST_CASE("actor slab: past its cap an emptied chunk goes back to the system at once",
          "[actor_slab]") {
  if (!slab::enabled()) return;
  no_timed_reap hold;
  run_one_task();
  auto size = slab::stats().block_bytes;
  auto per = slab::stats().blocks_per_chunk;
  // 140 chunks' worth of blocks (the cap is 128 empty chunks), then all freed.
  constexpr std::size_t chunks = 140;
  std::vector<void*> blocks;
  blocks.reserve(chunks * per);
  for (std::size_t i = 0; i < chunks * per; ++i)
    blocks.push_back(slab::allocate(size));
  auto full = slab::stats();
  CHECK(full.chunks >= chunks);
  for (auto* p : blocks)
    slab::deallocate(p, size);
  auto after = slab::stats();
  CHECK(after.live == full.live - blocks.size());
  // 128 wait empty, plus the current chunk; the others went back as they emptied.
  CHECK(after.empty_chunks <= 129);
  CHECK(after.empty_chunks >= 128);
  CHECK(after.unmapped >= full.unmapped + (full.chunks - after.chunks));
  CHECK(after.chunks <= full.chunks - (chunks - 129));
  // Leave the slab as the other tests expect it: the idle ones reaped.
  slab::reap_now();
  slab::reap_now();
  CHECK(slab::stats().empty_chunks <= 2);
}

TEST_CASE("actor slab: blocks are distinct and come back from any thread", "[actor_slab]") {
  no_timed_reap hold;
  // The slab's block size is the task actor's storage size, set by the first task.
  run_one_task();
  auto size = slab::enabled() ? slab::stats().block_bytes : 1408;
  REQUIRE(size >= 64);
  auto before = slab::stats();
  constexpr int threads = 4;
  constexpr int per_thread = 3000; // two chunks' worth each
  std::vector<std::vector<unsigned char*>> made(threads);
  std::vector<std::thread> ts;
  std::atomic<int> misaligned{0}; // Catch's CHECK is not for other threads
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        auto* p = static_cast<unsigned char*>(slab::allocate(size));
        if (reinterpret_cast<uintptr_t>(p) % 64 != 0) ++misaligned;
        std::memset(p, t * 16 + i % 16, size); // a block shared by two would be overwritten
        made[t].push_back(p);
      }
    });
  for (auto& t : ts)
    t.join();
  CHECK(misaligned == 0);
  std::set<unsigned char*> all;
  for (int t = 0; t < threads; ++t)
    for (int i = 0; i < per_thread; ++i) {
      auto* p = made[t][i];
      all.insert(p);
      auto tag = static_cast<unsigned char>(t * 16 + i % 16);
      CHECK((p[0] == tag && p[size - 1] == tag));
    }
  CHECK(all.size() == size_t{threads} * per_thread);
  if (slab::enabled()) CHECK(slab::stats().live == before.live + threads * per_thread);
  // Each thread frees the blocks another one made.
  ts.clear();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (auto* p : made[(t + 1) % threads])
        slab::deallocate(p, size);
    });
  for (auto& t : ts)
    t.join();
  if (!slab::enabled()) return;
  auto after = slab::stats();
  CHECK(after.live == before.live);
  // The emptied chunks wait for the next burst (far below the cap): none went back.
  CHECK(after.unmapped == before.unmapped);
  // Blocks are handed out again from the chunks still mapped, no new one.
  auto* p = slab::allocate(size);
  auto* q = slab::allocate(size);
  CHECK(p != q);
  CHECK(slab::stats().chunks == after.chunks);
  slab::deallocate(q, size);
  slab::deallocate(p, size);
  CHECK(slab::stats().live == before.live);
  // A request larger than a block is served by `::operator new` and goes back there.
  auto* big = slab::allocate(size + 1);
  std::memset(big, 0, size + 1);
  CHECK(slab::stats().live == before.live);
  slab::deallocate(big, size + 1);
}

TEST_CASE("actor slab: a thread's cache hands out the block it freed last, keeps at most 32 "
          "and gives them back when flushed and when the thread ends",
          "[actor_slab]") {
  if (!slab::enabled()) return;
  no_timed_reap hold;
  run_one_task();
  auto size = slab::stats().block_bytes;
  auto before = slab::stats();
  std::atomic<int> failures{0}; // Catch's CHECK is not for other threads
  uint64_t live_kept = 0, live_flushed = 0;
  std::thread t{[&] {
    slab::use_thread_cache();
    std::vector<void*> xs;
    for (int i = 0; i < 100; ++i)
      xs.push_back(slab::allocate(size));
    // The latest freed comes back first (its lines are the warmest).
    auto* last = xs.back();
    slab::deallocate(last, size);
    if (slab::allocate(size) != last) ++failures;
    // 100 freed: the cache keeps 32 at most (it gave back 16 at a time), counted as live.
    for (auto* p : xs)
      slab::deallocate(p, size);
    live_kept = slab::stats().live;
    slab::flush_thread_cache();
    live_flushed = slab::stats().live;
    // Kept again, then given back when the thread ends.
    for (int i = 0; i < 10; ++i)
      xs[i] = slab::allocate(size);
    for (int i = 0; i < 10; ++i)
      slab::deallocate(xs[i], size);
    if (slab::stats().live != before.live + 10) ++failures;
  }};
  t.join();
  CHECK(failures == 0);
  CHECK(live_kept > before.live);
  CHECK(live_kept <= before.live + 32);
  CHECK(live_flushed == before.live);
  CHECK(slab::stats().live == before.live);
}

TEST_CASE("actor slab: an idle worker gives back the blocks it kept", "[actor_slab]") {
  if (!slab::enabled()) return;
  no_timed_reap hold;
  auto rt = troupe::runtime::builder{}.threads(2).build();
  REQUIRE(rt);
  auto before = slab::stats();
  slab::counters peak;
  REQUIRE(spawn_burst(*rt, 2000, peak) == 2000);
  // The tasks ended on the workers, which keep 16 to 32 of the blocks they freed (the one
  // of the burst's root may still be held); a worker that sleeps through a long park
  // (100 ms) gives them back. Real time by nature: polled, bounded.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
  while (slab::stats().live > before.live + 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  CHECK(slab::stats().live <= before.live + 1);
}

TEST_CASE("actor slab: chunks are marked for transparent huge pages only with TROUPE_HUGEPAGES=1",
          "[actor_slab]") {
  if (!slab::enabled()) return;
  auto thp = thp_mode();
  // Marked (MADV_HUGEPAGE) only when asked: a fresh huge page cost ~4 ms on the CI machines
  // (chunk_slab.hpp). ctest runs this case twice: as is, and with TROUPE_HUGEPAGES=1.
  const char* v = std::getenv("TROUPE_HUGEPAGES");
  bool want = v != nullptr && std::string{v} == "1";
  if (thp.find("[never]") != std::string::npos || thp.empty()) {
    WARN("transparent huge pages are off here: nothing to check");
    return;
  }
  if (!want && thp.find("[always]") != std::string::npos) {
    WARN("transparent huge pages are on for every mapping here: an unmarked chunk is "
         "eligible too");
    return;
  }
  run_one_task();
  auto size = slab::stats().block_bytes;
  auto* p = slab::allocate(size);
  auto at = reinterpret_cast<uintptr_t>(p);
  // The mapping that holds the block: whole 2 MB-aligned chunks (neighbouring chunks may be
  // one mapping), eligible for huge pages exactly when asked.
  std::ifstream maps{"/proc/self/smaps"};
  std::string line;
  bool inside = false, found = false, eligible = false, reported = false;
  uintptr_t lo = 0, hi = 0;
  while (std::getline(maps, line)) {
    unsigned long a = 0, b = 0;
    // A mapping's first line is its range ("lo-hi perms ..."); its fields ("Name: value")
    // never parse as two hex numbers joined by a dash.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2) {
      inside = a <= at && at < b;
      if (inside) {
        found = true;
        lo = a;
        hi = b;
      }
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) {
      reported = true;
      eligible = line.find('1') != std::string::npos;
    }
  }
  slab::deallocate(p, size);
  REQUIRE(found);
  if (!reported) {
    WARN("this kernel's smaps has no THPeligible field: nothing more to check");
    return;
  }
  CHECK(lo % slab::chunk_bytes == 0);
  CHECK((hi - lo) % slab::chunk_bytes == 0);
  CHECK(eligible == want);
}

TEST_CASE("chunk slab: a fresh chunk's pages are faulted in a run at a time, just ahead of its "
          "blocks",
          "[actor_slab]") {
  // A burst writes every block of a fresh chunk; its pages come in runs of one system call
  // (MADV_POPULATE_WRITE) instead of a fault each, a run ahead of the blocks handed out and
  // no further, made by a helper thread unless TROUPE_PREFAULT_HELPER=0 or on one core
  // (chunk_slab.hpp, prefault_helper): `drain` waits for the runs asked for so far.
  namespace d = troupe::detail;
  constexpr std::size_t page = 4096;
#ifndef MADV_POPULATE_WRITE
  WARN("these system headers have no MADV_POPULATE_WRITE: the slab faults pages one by one");
  return;
#else
  {
    // A kernel without MADV_POPULATE_WRITE (before 5.14): nothing to check.
    auto* scratch = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(scratch != MAP_FAILED);
    bool works = ::madvise(scratch, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(scratch, page);
    if (!works || std::getenv("TROUPE_NO_PREFAULT") != nullptr) {
      WARN("no MADV_POPULATE_WRITE here (or TROUPE_NO_PREFAULT set): nothing to check");
      return;
    }
  }
  auto thp = thp_mode();
  const char* hp = std::getenv("TROUPE_HUGEPAGES");
  // With huge pages a first touch may bring the whole chunk: only the runs are checked.
  bool exact = thp.find("[always]") == std::string::npos && !(hp != nullptr && std::string{hp} == "1");
  // A slab of its own, so that its chunk is fresh. (It stays mapped when the test gives its
  // blocks back: an emptied current chunk stays current, and the slab is never unmapped.)
  d::chunk_slab<std::mutex> s{d::chunk_slab_shape{.block = 1024, .align = 64, .prefault_on_helper = true}};
  auto resident = [](const char* at) {
    unsigned char v = 0;
    auto* pg = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(at) & ~uintptr_t{page - 1});
    REQUIRE(::mincore(pg, page, &v) == 0);
    return (v & 1) != 0;
  };
  helper_always every_run;
  std::vector<void*> blocks;
  auto by_helper = d::prefault_helper::runs_done();
  blocks.push_back(s.allocate(1024));
  REQUIRE(blocks.back() != nullptr);
  d::prefault_helper::drain();
  auto* chunk = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(blocks.back()) &
                                        ~uintptr_t{d::chunk_slab<std::mutex>::chunk_bytes - 1});
  // One block handed out (and not written): the first run, 64 KB past it, is in.
  CHECK(resident(chunk + 32 * 1024));
  CHECK(resident(chunk + 64 * 1024));
  if (exact) CHECK_FALSE(resident(chunk + 100 * 1024));
  // Blocks up to 40 KB in (past half the run): the next run is in, and no more.
  while (reinterpret_cast<char*>(blocks.back()) < chunk + 40 * 1024)
    blocks.push_back(s.allocate(1024));
  d::prefault_helper::drain();
  CHECK(resident(chunk + 100 * 1024));
  if (exact) CHECK_FALSE(resident(chunk + 160 * 1024));
  // The two runs were the helper's, where it runs.
  if (d::prefault_helper::enabled()) CHECK(d::prefault_helper::runs_done() >= by_helper + 2);
  for (auto* p : blocks)
    CHECK(s.deallocate(p, 1024));
#endif
}

TEST_CASE("chunk slab: a range forgotten before it is unmapped is never faulted in after",
          "[actor_slab]") {
  // The slab forgets a chunk before it unmaps it (another mapping may take the address):
  // the helper's queued runs of it are dropped and a run of it in progress is waited for.
  namespace d = troupe::detail;
  constexpr std::size_t page = 4096, run = 256 * 1024, span = 8 * run;
  helper_always every_run;
  auto* base = static_cast<char*>(
      ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(base != MAP_FAILED);
  auto before = d::prefault_helper::runs_done();
  size_t posted = 0;
  for (std::size_t off = 0; off < span; off += run)
    posted += d::prefault_helper::post(base + off, run) ? 1 : 0;
  d::prefault_helper::forget(base, span);
  auto at_forget = d::prefault_helper::runs_done();
  d::prefault_helper::drain();
  // Nothing of the range ran once `forget` returned, and no run was left half done.
  CHECK(d::prefault_helper::runs_done() == at_forget);
  std::vector<unsigned char> v(span / page);
  REQUIRE(::mincore(base, span, v.data()) == 0);
  std::size_t resident = 0;
  for (auto x : v)
    resident += x & 1;
  // A run faults pages in only where the kernel has the call (read after the drain: a
  // refusal switches it off). With transparent huge pages always on, a run may bring a whole
  // huge page: then only whether any run was made before the forget shows in the residency.
  bool works = d::prefault_works().load();
  bool exact = thp_mode().find("[always]") == std::string::npos;
  if (posted > 0 && works && exact) CHECK(resident == (at_forget - before) * (run / page));
  if (posted > 0 && works) CHECK((resident == 0) == (at_forget == before));
  if (d::prefault_helper::enabled()) CHECK(posted == span / run);
  ::munmap(base, span);
}

TEST_CASE("chunk slab: a reaper's own passes are paced (giving chunks back costs an idle "
          "process at most ~0.5% of a core); reap_now's are not",
          "[actor_slab]") {
  // An idle worker's timed-out sleep and a chunk that empties call reap_idle: each pass
  // unmaps at most 4 chunks, and the next one waits 200 times as long as that took
  // (reap_pacer), however many chunks a burst left. An interval still begins meanwhile.
  paced_slab ps{11}; // 10 empty chunks
  auto& s = ps.s;
  using pacer = troupe::detail::reap_pacer;
  auto start = s.stats();
  REQUIRE(start.chunks == 11);
  REQUIRE(start.unmapped == 0);
  // From now on every reap_idle begins an interval.
  s.set_reap_interval(std::chrono::nanoseconds{0});
  pacer::reset();
  s.reap_idle(); // the first interval: nothing sat unused through a whole one yet
  CHECK(s.stats().unmapped == 0);
  auto before_pass = pacer::now();
  s.reap_idle(); // the 10 empty chunks are doomed: 4 go back
  CHECK(s.stats().unmapped == 4);
  CHECK(pacer::resume_at() > before_pass); // the pass set the pause after it
  // A pause long enough that the next call surely falls in it (the pass's own is 200 times
  // its unmapping, which a preempted test could outlive).
  paced_slab::pause_pacer();
  s.reap_idle(); // paused: an interval begins, nothing goes back
  auto paused = s.stats();
  CHECK(paused.unmapped == 4);
  CHECK(paused.reaps == start.reaps + 3);
  CHECK(paused.chunks == 7);
  // reap_now's passes (tests, an explicit call) are not paced.
  s.reap_pass(false);
  CHECK(s.stats().unmapped == 10);
  CHECK(s.stats().chunks == 1);
}

TEST_CASE("chunk slab: chunks a burst takes back in use are no longer doomed, however long the "
          "pacer held their reaping back",
          "[actor_slab]") {
  // Doomed chunks are counted (the oldest empty ones). A count the pacer left behind must
  // not unmap the chunks a later burst used and emptied again.
  paced_slab ps{9}; // 8 empty chunks
  auto& s = ps.s;
  using pacer = troupe::detail::reap_pacer;
  // Two intervals doom the 8; the pacer holds their reaping back.
  s.set_reap_interval(std::chrono::nanoseconds{0});
  s.reap_pass(true); // (unpaced: nothing sat unused through a whole interval yet)
  paced_slab::pause_pacer();
  REQUIRE_FALSE(pacer::ready());
  s.reap_idle(); // an interval: 8 doomed, none unmapped (paused)
  auto held = s.stats();
  REQUIRE(held.unmapped == 0);
  REQUIRE(held.chunks == 9);
  // A burst takes every chunk back in use and empties them again.
  s.set_reap_interval(std::chrono::hours{1});
  ps.fill(9);
  ps.empty_all();
  pacer::reset();
  s.reap_idle(); // no interval ends; the backlog went with the chunks' use
  CHECK(s.stats().unmapped == 0);
  CHECK(s.stats().chunks == 9);
}
