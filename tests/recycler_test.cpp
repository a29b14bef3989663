// The recycler (troupe/actors/detail/recycler.hpp): small blocks are reused on their thread,
// cross threads in whole magazines through the depot, and go back to the system past the
// depot's cap. Under AddressSanitizer the recycler is off; these tests then check only that
// every block is usable (the reuse checks need it on).

#include <map>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/actors/detail/recycler.hpp>
#include <troupe/troupe.hpp>

namespace rc = troupe::detail::recycler;

namespace {

troupe::task<int> frame_of(int x) {
  co_return x + 1;
}

} // namespace

TEST_CASE("recycler: a freed block is reused by the next allocation of its class on the same thread",
          "[recycler]") {
  auto* p = rc::allocate(100);
  std::memset(p, 0xab, 100);
  rc::deallocate(p, 100);
  auto* q = rc::allocate(128); // the same 64-byte class (65..128)
  std::memset(q, 0xcd, 128);
  if (rc::enabled())
    CHECK(q == p);
  rc::deallocate(q, 128);
  // Another class does not get it.
  auto* r = rc::allocate(129);
  if (rc::enabled())
    CHECK(r != p);
  rc::deallocate(r, 129);
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
  size_t reused = 0;
  std::vector<void*> again;
  std::thread taker{[&] {
    for (size_t i = 0; i < n; ++i) {
      again.push_back(rc::allocate(size));
      reused += freed.count(again.back());
    }
    for (auto* p : again)
      rc::deallocate(p, size);
  }};
  taker.join();
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
  constexpr size_t size = rc::max_small; // the largest class: the depot keeps two magazines
  constexpr size_t n = 64 * 12;
  auto before = rc::stats();
  std::thread t{[&] {
    std::vector<void*> blocks;
    for (size_t i = 0; i < n; ++i)
      blocks.push_back(rc::allocate(size));
    for (auto* p : blocks)
      rc::deallocate(p, size);
  }};
  t.join();
  auto after = rc::stats();
  if (!rc::enabled()) {
    CHECK(after.overflow_frees == before.overflow_frees);
    return;
  }
  // 12 magazines' worth: at most 2 kept by the thread and 2 by the depot.
  CHECK(after.overflow_frees - before.overflow_frees >= 8 * 64);
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
