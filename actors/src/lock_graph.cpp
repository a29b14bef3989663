#include "lock_graph.hpp"

#include <algorithm>

namespace troupe::detail {

void lock_graph::blockers(const key_state& st, caf::actor_id who, std::vector<caf::actor_id>& out) {
  // Only edges that are necessary make a cycle a deadlock (a semaphore waiter that another
  // holder's release would serve waits on none of them in particular). A waiter cannot end
  // its wait without holder h when, all other holders gone, h alone still leaves too few
  // permits: capacity - held(h) < asked. The waiter's own permits are not among those that
  // go (it releases nothing while it waits), so for another holder h they count with h's:
  // capacity - held(h) - held(w) < asked. Strict FIFO: it cannot pass the untimed waiters
  // ahead of it either, so what they cannot do without, it cannot either (a reader
  // re-acquiring behind a waiting writer needs itself to release: a cycle).
  for (auto& [w, asked] : st.waiters) {
    int64_t own = 0;
    for (auto& [h, held] : st.holders)
      if (h == w) own += held;
    for (auto& [h, held] : st.holders)
      if (st.capacity - held - (h == w ? 0 : own) < asked &&
          std::find(out.begin(), out.end(), h) == out.end())
        out.push_back(h);
    if (w == who) break;
  }
}

void lock_graph::unpublish(uint64_t key, entry& e) {
  for (auto& w : e.st.waiters)
    if (auto i = waits_.find(w.first); i != waits_.end() && i->second == key) waits_.erase(i);
}

std::optional<std::vector<std::string>>
lock_graph::publish(uint64_t key, const std::string& name, const key_state& st,
                    caf::actor_id waiter) {
  std::lock_guard<std::mutex> guard{mx_};
  auto it = keys_.find(key);
  if (st.waiters.empty()) {
    if (it != keys_.end()) {
      unpublish(key, it->second);
      keys_.erase(it);
    }
    return std::nullopt;
  }
  if (it == keys_.end()) {
    it = keys_.emplace(key, entry{}).first;
    it->second.name = name;
  }
  auto& cur = it->second.st;
  // Between two publishes the waiters mostly stay (one granted at the head, one queued at
  // the tail): touch the index only for those that changed.
  auto in = [](const auto& xs, caf::actor_id id) {
    return std::any_of(xs.begin(), xs.end(), [id](auto& x) { return x.first == id; });
  };
  for (auto& w : cur.waiters)
    if (!in(st.waiters, w.first))
      if (auto i = waits_.find(w.first); i != waits_.end() && i->second == key) waits_.erase(i);
  for (auto& w : st.waiters)
    if (!in(cur.waiters, w.first)) waits_[w.first] = key;
  cur.capacity = st.capacity;
  cur.holders.assign(st.holders.begin(), st.holders.end()); // reuses the capacity
  cur.waiters.assign(st.waiters.begin(), st.waiters.end());
  if (waiter == 0) return std::nullopt;
  // The common case: no holder waits on a lock itself (nothing to follow).
  bool any = false;
  for (auto& h : cur.holders)
    any = any || h.first == waiter || waits_.count(h.first) > 0;
  if (!any) return std::nullopt;
  // Depth-first from what blocks the new waiter; reaching it again closes a cycle. The
  // path of keys is kept for the error (each frame: the key its task waits on).
  struct frame {
    std::vector<caf::actor_id> next;
    size_t at;
  };
  std::vector<caf::actor_id> seen;
  std::vector<frame> stack;
  std::vector<uint64_t> path{key};
  std::vector<caf::actor_id> first;
  blockers(cur, waiter, first);
  stack.push_back(frame{std::move(first), 0});
  while (!stack.empty()) {
    auto& top = stack.back();
    if (top.at == top.next.size()) {
      stack.pop_back();
      path.pop_back();
      continue;
    }
    auto t = top.next[top.at++];
    if (t == waiter) {
      std::vector<std::string> names;
      for (auto k : path)
        names.push_back(keys_.at(k).name);
      return names;
    }
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    auto w = waits_.find(t);
    if (w == waits_.end()) continue; // not waiting (untimed) on a lock: it can go on
    auto k = keys_.find(w->second);
    if (k == keys_.end()) continue;
    std::vector<caf::actor_id> next;
    blockers(k->second.st, t, next);
    path.push_back(w->second);
    stack.push_back(frame{std::move(next), 0});
  }
  return std::nullopt;
}

void lock_graph::forget(uint64_t key) {
  std::lock_guard<std::mutex> guard{mx_};
  if (auto it = keys_.find(key); it != keys_.end()) {
    unpublish(key, it->second);
    keys_.erase(it);
  }
}

size_t lock_graph::size() const {
  std::lock_guard<std::mutex> guard{mx_};
  return keys_.size();
}

} // namespace troupe::detail
