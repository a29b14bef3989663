// The supervisor's child table (an internal class) against std::map, the structure it
// replaced: every lookup, bound and walk answers as the map does, after any mix of appends
// and erases.

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "child_table.hpp" // supervision/src: internal

namespace {

struct rec {
  int value = 0;
  troupe::detail::table_links<rec> links;
};

using table = troupe::detail::ordered_table<rec>;

/// The table's uids forward and backward, and each record's value, against the model.
void same_walks(table& t, const std::map<uint64_t, int>& model) {
  std::vector<uint64_t> fwd, want;
  for (auto& [uid, r] : t) {
    fwd.push_back(uid);
    REQUIRE(r.value == model.at(uid));
  }
  for (auto& kv : model)
    want.push_back(kv.first);
  REQUIRE(fwd == want);
  std::vector<uint64_t> back;
  for (auto it = t.end(); it != t.begin();) {
    --it;
    back.push_back(it->first);
  }
  std::vector<uint64_t> want_back(want.rbegin(), want.rend());
  REQUIRE(back == want_back);
  REQUIRE(t.size() == model.size());
}

/// The uid lower_bound (or upper_bound) finds, 0 for the end.
template <class It, class End>
uint64_t uid_at(It it, End end) {
  return it == end ? 0 : it->first;
}

} // namespace

TEST_CASE("child table: lookups, bounds and walks answer as std::map after random appends and "
          "erases") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng{seed};
    table t;
    std::map<uint64_t, int> model;
    uint64_t next = 0;
    for (int step = 0; step < 2000; ++step) {
      auto op = rng() % 10;
      if (op < 4) { // append, sometimes skipping uids
        next += 1 + rng() % 3;
        auto v = static_cast<int>(rng() % 1000);
        t.append(next).value = v;
        model[next] = v;
      } else if (op < 7 && next > 0) { // erase a uid that may or may not be there
        auto uid = 1 + rng() % next;
        t.erase(uid);
        model.erase(uid);
        // The stop sequence's question right after an erase: the hint answers it.
        REQUIRE(uid_at(t.lower_bound(uid), t.end()) ==
                uid_at(model.lower_bound(uid), model.end()));
      } else { // bounds and lookups of any uid, in the table or not
        auto uid = rng() % (next + 3);
        REQUIRE(uid_at(t.lower_bound(uid), t.end()) ==
                uid_at(model.lower_bound(uid), model.end()));
        REQUIRE(uid_at(t.upper_bound(uid), t.end()) ==
                uid_at(model.upper_bound(uid), model.end()));
        REQUIRE(t.count(uid) == model.count(uid));
        auto f = t.find(uid);
        REQUIRE((f == t.end()) == (model.count(uid) == 0));
        if (f != t.end()) REQUIRE(f->second.value == model.at(uid));
      }
      if (step % 97 == 0) same_walks(t, model);
    }
    same_walks(t, model);
  }
}

TEST_CASE("child table: the record erased last is the stop cursor's hint, also after an append") {
  table t;
  for (uint64_t uid = 1; uid <= 5; ++uid)
    t.append(uid).value = static_cast<int>(uid);
  t.erase(5); // the last one: nothing comes after it ...
  CHECK(t.lower_bound(5) == t.end());
  t.append(9).value = 9; // ... until a new record does
  REQUIRE(t.lower_bound(5) != t.end());
  CHECK(t.lower_bound(5)->first == 9);
  t.erase(3);
  CHECK(t.lower_bound(3)->first == 4);
  t.erase(4); // the hint's record erased: the new hint is the one after it
  CHECK(t.lower_bound(4)->first == 9);
  CHECK(t.lower_bound(3)->first == 9); // an older erase: found by the walk
  auto it = t.lower_bound(3);
  --it;
  CHECK(it->first == 2);
}

TEST_CASE("child table: records keep their address while the table grows") {
  table t;
  auto& first = t.append(1);
  first.value = 42;
  for (uint64_t uid = 2; uid <= 10'000; ++uid) // many rehashes
    t.append(uid);
  CHECK(&t.at(1) == &first);
  CHECK(first.value == 42);
  const auto& ct = t;
  CHECK(ct.find(1)->second.value == 42);
  CHECK(ct.find(10'001) == ct.end());
}
