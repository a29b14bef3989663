// The task actor's table of children (troupe/actors/detail/nursery_table.hpp): a map's
// behaviour (insert, find, erase, iteration, clear) checked against std::map through random
// operations, entries that stay where they are while others come and go, keys that all
// collide on the low bits switching it to the multiplicative hash, and insertion order.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/actors/detail/nursery_table.hpp>

namespace {

using table = troupe::detail::nursery_table<std::shared_ptr<int>>;

/// Every entry of `t` is in `ref` with the same value, and the other way round.
void check_same(table& t, const std::map<uint64_t, int>& ref) {
  REQUIRE(t.size() == ref.size());
  CHECK(t.empty() == ref.empty());
  size_t seen = 0;
  for (auto& kvp : t) {
    auto i = ref.find(kvp.first);
    REQUIRE(i != ref.end());
    CHECK(*kvp.second == i->second);
    ++seen;
  }
  CHECK(seen == ref.size());
  for (auto& [k, v] : ref) {
    auto i = t.find(k);
    REQUIRE(i != t.end());
    CHECK(*i->second == v);
  }
}

} // namespace

TEST_CASE("nursery table: random inserts, finds and erases agree with std::map") {
  for (bool spread : {false, true}) {
    table t;
    std::map<uint64_t, int> ref;
    std::mt19937_64 rng{spread ? 7u : 11u};
    // Increasing ids with small gaps (children's actor ids), or keys spread over 64 bits
    // (job tickets' keys and ids of another node).
    uint64_t next = 1;
    auto fresh = [&] { return spread ? (rng() | 1) : (next += 1 + rng() % 5); };
    for (int round = 0; round < 20000; ++round) {
      auto op = rng() % 10;
      if (op < 5 || ref.empty()) {
        auto k = fresh();
        int v = static_cast<int>(rng() % 1000);
        auto [it, inserted] = t.emplace(k, std::make_shared<int>(v));
        CHECK(inserted == (ref.count(k) == 0));
        CHECK(it->first == k);
        ref.emplace(k, v);
      } else if (op < 8) {
        // Erase a present key, by iterator or by key.
        auto i = ref.begin();
        std::advance(i, static_cast<long>(rng() % ref.size()));
        if (op == 5) {
          auto it = t.find(i->first);
          REQUIRE(it != t.end());
          t.erase(it);
        } else {
          CHECK(t.erase(i->first) == 1);
        }
        ref.erase(i);
      } else {
        // A key that is not there.
        auto k = fresh();
        if (ref.count(k) == 0) {
          CHECK(t.find(k) == t.end());
          CHECK(t.erase(k) == 0);
        }
      }
      if (round % 997 == 0) check_same(t, ref);
    }
    check_same(t, ref);
    // A key already present is not inserted again, and its entry is kept.
    if (!ref.empty()) {
      auto k = ref.begin()->first;
      auto [it, inserted] = t.emplace(k, std::make_shared<int>(-1));
      CHECK_FALSE(inserted);
      CHECK(*it->second == ref.begin()->second);
    }
    t.clear();
    CHECK(t.empty());
    CHECK(t.begin() == t.end());
    CHECK(t.find(1) == t.end());
  }
}

TEST_CASE("nursery table: an entry stays where it is while others are inserted and erased, "
          "and every value is released") {
  auto probe = std::make_shared<int>(42);
  std::set<const void*> addresses;
  {
    table t;
    for (uint64_t k = 1; k <= 5000; ++k)
      t.emplace(k, std::shared_ptr<int>{probe});
    auto& kept = t.find(2500)->second;
    const void* at = &kept;
    for (uint64_t k = 5001; k <= 20000; ++k)
      t.emplace(k, std::shared_ptr<int>{probe}); // grows the array several times
    for (uint64_t k = 1; k <= 20000; k += 2)
      t.erase(k);
    CHECK(&t.find(2500)->second == at);
    CHECK(t.size() == 10000);
    CHECK(probe.use_count() == 10001);
  }
  CHECK(probe.use_count() == 1); // the table's end released every entry
}

TEST_CASE("nursery table: keys that all collide on the low bits switch it to the "
          "multiplicative hash, and it keeps working") {
  table t;
  std::map<uint64_t, int> ref;
  // Keys 2^20 apart: the same low bits at every size the table reaches.
  for (uint64_t i = 1; i <= 3000; ++i) {
    t.emplace(i << 20, std::make_shared<int>(static_cast<int>(i)));
    ref.emplace(i << 20, static_cast<int>(i));
  }
  CHECK(t.mixed());
  check_same(t, ref);
  for (uint64_t i = 1; i <= 3000; i += 3) {
    CHECK(t.erase(i << 20) == 1);
    ref.erase(i << 20);
  }
  check_same(t, ref);
  // Increasing ids never collide: the table keeps placing them by their low bits.
  table plain;
  for (uint64_t k = 1; k <= 100000; ++k)
    plain.emplace(k, nullptr);
  CHECK_FALSE(plain.mixed());
  CHECK(plain.size() == 100000);
}

TEST_CASE("nursery table: iteration goes in insertion order, whatever the keys' values") {
  // The same inserts and erases with keys shifted by an offset (a second run in one process:
  // job tickets' keys come from a process-wide counter) iterate in the same order.
  auto order = [](uint64_t offset) {
    table t;
    std::vector<int> seen;
    for (int i = 0; i < 100; ++i)
      t.emplace(offset + static_cast<uint64_t>((i * 37) % 101), std::make_shared<int>(i));
    for (int i = 0; i < 100; i += 7)
      t.erase(offset + static_cast<uint64_t>((i * 37) % 101));
    for (auto& kvp : t)
      seen.push_back(*kvp.second);
    return seen;
  };
  auto a = order(1);
  CHECK(a == order(1000003));
  REQUIRE(a.size() == 100 - 15);
  CHECK(std::is_sorted(a.begin(), a.end())); // the oldest first
}
