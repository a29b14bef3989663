#include "lock_graph.hpp"

#include <algorithm>
#include <unordered_set>

namespace troupe::detail {

void lock_graph::blockers(const key_state& st, caf::actor_id who,
                          std::vector<caf::actor_id>& out) const {
  out.insert(out.end(), st.holders.begin(), st.holders.end());
  for (auto w : st.waiters) {
    if (w == who) break;
    out.push_back(w);
  }
}

std::optional<std::vector<std::string>> lock_graph::publish(const std::string& key, key_state st,
                                                            caf::actor_id waiter) {
  std::lock_guard<std::mutex> guard{mx_};
  if (auto old = keys_.find(key); old != keys_.end()) {
    for (auto w : old->second.waiters)
      if (auto i = waits_.find(w); i != waits_.end() && i->second == key) waits_.erase(i);
    if (st.waiters.empty()) keys_.erase(old);
  }
  if (st.waiters.empty()) return std::nullopt;
  for (auto w : st.waiters)
    waits_[w] = key;
  auto& cur = keys_[key] = std::move(st);
  if (waiter == 0) return std::nullopt;
  // Depth-first from what blocks the new waiter; reaching it again closes a cycle. The path
  // of keys is kept for the error (each node: the key its task waits on).
  struct frame {
    caf::actor_id task;
    std::vector<caf::actor_id> next;
    size_t at;
  };
  std::unordered_set<caf::actor_id> seen;
  std::vector<frame> stack;
  std::vector<std::string> path{key};
  std::vector<caf::actor_id> first;
  blockers(cur, waiter, first);
  stack.push_back(frame{waiter, std::move(first), 0});
  while (!stack.empty()) {
    auto& top = stack.back();
    if (top.at == top.next.size()) {
      stack.pop_back();
      path.pop_back();
      continue;
    }
    auto t = top.next[top.at++];
    if (t == waiter) return path;
    if (!seen.insert(t).second) continue;
    auto w = waits_.find(t);
    if (w == waits_.end()) continue; // not waiting (untimed) on a lock: it can go on
    auto k = keys_.find(w->second);
    if (k == keys_.end()) continue;
    std::vector<caf::actor_id> next;
    blockers(k->second, t, next);
    path.push_back(w->second);
    stack.push_back(frame{t, std::move(next), 0});
  }
  return std::nullopt;
}

void lock_graph::forget(const std::string& key) {
  publish(key, key_state{}, 0);
}

size_t lock_graph::size() const {
  std::lock_guard<std::mutex> guard{mx_};
  return keys_.size();
}

} // namespace troupe::detail
