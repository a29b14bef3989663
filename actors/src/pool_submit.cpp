// Submits: backpressure policies, credits (room reserved for a submitter that then posts
// one-way), idempotency, blocked submitters, rejections.

#include "pool_actor.hpp"

#include "primitive_actors.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

bool pool_actor::bounded() const noexcept {
  return spec_.backpressure.kind == pool_backpressure_kind::queue;
}

bool pool_actor::has_room() const noexcept {
  return static_cast<int64_t>(queue_.size()) + outstanding_ < spec_.backpressure.max_depth;
}

// A worker can take a task this instant. A worker whose batch was collected from a report
// (every job finished) but that has not pulled again counts as free while tasks still wait
// in the queue: those go to it on its pull, and a new task must not pass them (nor push the
// queue past its bound, which it did when "a free worker" alone admitted it).
bool pool_actor::starts_now() const noexcept {
  return queue_.empty() && free_workers() > 0;
}

caf::result<pool_ack> pool_actor::on_submit(pool_submission sub, bool wants_credits) {
  if (loading_ || load_error_)
    return load_error_ ? load_error_
                       : make_error(errc::pool_closed, "pool", "the pool is still loading");
  if (closed_) return closed_error();
  if (!sub.body)
    return make_error(errc::invalid_pool_spec, "body", "the submitted body is empty");
  if (auto* j = find_idempotent(sub.idempotency_key)) {
    // A repeat of a record not committed yet is answered after its commit, never before.
    if (durable_ && unsaved_.count(j->snap.id) > 0) return after_save(j->snap.id);
    return pool_ack{view(*j), 0, 0};
  }
  auto now = env_->clock->now();
  auto& bp = spec_.backpressure;
  switch (bp.kind) {
    case pool_backpressure_kind::unbounded:
      break;
    case pool_backpressure_kind::fail_fast:
      if (!starts_now())
        return make_error(errc::pool_no_worker, "pool",
                          "pool \"" + spec_.name + "\" has no free worker (fail_fast, " +
                              std::to_string(spec_.max_concurrent) + " running)");
      break;
    case pool_backpressure_kind::ring_buffer:
      if (!starts_now() && static_cast<int64_t>(queue_.size()) >= bp.capacity)
        evict_oldest("ring_buffer", bp.capacity);
      break;
    case pool_backpressure_kind::queue:
      if (starts_now() || has_room()) {
        if (!blocked_.empty()) { // FIFO among submitters: wait behind the blocked ones
          auto rp = make_response_promise<pool_ack>();
          blocked_.push_back(blocked_submit{rp, std::move(sub), now, wants_credits});
          return rp;
        }
        break;
      }
      switch (bp.on_full) {
        case pool_on_full::block_submitter: {
          auto rp = make_response_promise<pool_ack>();
          blocked_.push_back(blocked_submit{rp, std::move(sub), now, wants_credits});
          return rp;
        }
        case pool_on_full::drop_oldest:
          evict_oldest("drop_oldest", bp.max_depth);
          break;
        case pool_on_full::drop_newest: {
          auto& j = accept(++next_id_, std::move(sub), now, false);
          auto id = j.snap.id;
          reject(j, "queue full: the new task was dropped", "drop_newest", bp.max_depth);
          if (durable_) return after_save(id);
          return pool_ack{jobs_.at(id).snap, 0, 0};
        }
        case pool_on_full::fail_submitter:
          return make_error(errc::pool_queue_full, "pool",
                            "pool \"" + spec_.name + "\" has " + std::to_string(queue_.size()) +
                                " queued (max_depth " + std::to_string(bp.max_depth) + ")");
      }
      break;
  }
  auto id = accept(++next_id_, std::move(sub), now, true).snap.id;
  dispatch();
  if (durable_) return after_save(id);
  return ack_for(id, wants_credits);
}

caf::result<pool_ack> pool_actor::after_save(uint64_t id) {
  auto rp = make_response_promise<pool_ack>();
  ack_after_save(id, rp);
  return rp;
}

void pool_actor::ack_after_save(uint64_t id, caf::response_promise rp) {
  if (save_failed_.erase(id) > 0) // its last save failed: save it again
    if (auto i = jobs_.find(id); i != jobs_.end()) save(i->second);
  save_waiters_[id].push_back(std::move(rp));
}

pool_ack pool_actor::ack_for(uint64_t id, bool wants_credits) {
  pool_ack ack;
  if (auto i = jobs_.find(id); i != jobs_.end()) ack.snapshot = view(i->second);
  if (!wants_credits || closed_ || durable_) return ack;
  int64_t grant = 0;
  switch (spec_.backpressure.kind) {
    case pool_backpressure_kind::unbounded:
    case pool_backpressure_kind::ring_buffer:
      grant = max_grant;
      break;
    case pool_backpressure_kind::queue:
      if (spec_.backpressure.on_full == pool_on_full::drop_oldest) {
        grant = max_grant; // a full queue evicts: no room to reserve
      } else {
        auto room = spec_.backpressure.max_depth - static_cast<int64_t>(queue_.size()) -
                    outstanding_;
        grant = std::clamp<int64_t>(room, 0, max_grant);
        outstanding_ += grant;
      }
      break;
    case pool_backpressure_kind::fail_fast:
      break;
  }
  if (grant > 0) {
    ack.credits = grant;
    ack.first_id = next_id_ + 1;
    next_id_ += static_cast<uint64_t>(grant);
  }
  return ack;
}

void pool_actor::on_post(uint64_t id, pool_submission sub) {
  auto now = sub.submitted_ns >= 0 ? clock::time_point{clock::duration{sub.submitted_ns}}
                                   : env_->clock->now();
  if (bounded() && spec_.backpressure.on_full != pool_on_full::drop_oldest)
    outstanding_ = std::max<int64_t>(0, outstanding_ - 1);
  if (closed_ || !sub.body) { // recorded, so that its handle can tell
    auto& j = accept(id, std::move(sub), now, false);
    complete(j, outcome_box{nullptr, closed_ ? closed_error()
                                             : make_error(errc::invalid_pool_spec, "body",
                                                          "the submitted body is empty")});
    return;
  }
  auto& bp = spec_.backpressure;
  if (bp.kind == pool_backpressure_kind::ring_buffer && !starts_now() &&
      static_cast<int64_t>(queue_.size()) >= bp.capacity)
    evict_oldest("ring_buffer", bp.capacity);
  else if (bounded() && bp.on_full == pool_on_full::drop_oldest && !starts_now() &&
           static_cast<int64_t>(queue_.size()) >= bp.max_depth)
    evict_oldest("drop_oldest", bp.max_depth);
  accept(id, std::move(sub), now, true);
  dispatch();
}

pool_actor::job* pool_actor::find_idempotent(const std::string& key) {
  if (key.empty()) return nullptr;
  auto i = idem_.find(key);
  if (i == idem_.end()) return nullptr;
  auto j = jobs_.find(i->second);
  return j == jobs_.end() ? nullptr : &j->second;
}

pool_actor::job& pool_actor::accept(uint64_t id, pool_submission sub, clock::time_point now, bool enqueue) {
  auto& j = jobs_[id];
  j.snap.id = id;
  j.snap.status = pool_task_status::queued;
  j.snap.submitted_at_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  j.snap.priority = sub.priority;
  j.snap.key = sub.has_key ? sub.key : std::string{};
  j.snap.idempotency_key = sub.idempotency_key;
  j.body = std::move(sub.body);
  if (j.body) j.body->bind(spec_, id);
  j.locals = std::move(sub.locals);
  j.deadline_ns = sub.deadline_ns;
  j.submitted = now;
  ++total_;
  if (!j.snap.idempotency_key.empty()) idem_[j.snap.idempotency_key] = id;
  if (durable_) save(j);
  if (enqueue) {
    std::tie(j.partition, j.has_partition) = partition_of(sub.has_key, j);
    j.seq = ++next_seq_;
    queue_.push(id, j.seq, j.snap.priority, j.partition, j.has_partition);
    max_depth_seen_ = std::max<uint64_t>(max_depth_seen_, queue_.size());
    if (j.deadline_ns >= 0)
      j.timer = env_->clock->schedule(clock::time_point{clock::duration{j.deadline_ns}},
                                      caf::actor_cast<caf::actor>(this),
                                      caf::make_message(pool_tick_atom::value, id));
    if (audits("submit")) audit("submit", j, {});
  }
  return j;
}

std::pair<std::string, bool> pool_actor::partition_of(bool has_key, const job& j) const {
  if (spec_.queue.kind != pool_queue_kind::fair_round_robin) return {{}, false};
  if (spec_.queue.key == "key") return {j.snap.key, has_key};
  auto locals = std::static_pointer_cast<const task_locals::element_type>(j.locals);
  if (!locals) return {{}, false};
  auto i = locals->find(spec_.queue.key);
  if (i == locals->end()) return {{}, false};
  if (auto* s = std::any_cast<std::string>(&i->second)) return {*s, true};
  if (auto* n = std::any_cast<int64_t>(&i->second)) return {std::to_string(*n), true};
  if (auto* n = std::any_cast<int>(&i->second)) return {std::to_string(*n), true};
  return {{}, false};
}

void pool_actor::evict_oldest(const char* policy, int64_t max_depth) {
  auto victim = queue_.oldest();
  if (!victim) return;
  queue_.remove(victim->first, victim->second);
  reject(jobs_.at(victim->first), "evicted by a newer task", policy, max_depth);
}

void pool_actor::reject(job& j, std::string reason, const char* policy, int64_t max_depth) {
  j.snap.status = pool_task_status::rejected;
  j.snap.rejection_reason = std::move(reason);
  j.snap.rejection_policy = policy;
  j.out.err = make_error(errc::pool_task_rejected, "task",
                         "rejected by " + std::string{policy} + ": " + j.snap.rejection_reason);
  j.snap.error = j.out.err;
  ++rejected_;
  ++drops_[policy];
  if (audits("drop"))
    audit("drop", j, {{"policy", policy}, {"depth", queue_.size()}, {"max_depth", max_depth}});
  finish(j);
}

void pool_actor::admit_blocked() {
  while (!blocked_.empty() && !closed_ && (has_room() || starts_now())) {
    auto b = std::move(blocked_.front());
    blocked_.pop_front();
    if (auto* j = find_idempotent(b.sub.idempotency_key)) {
      if (durable_ && unsaved_.count(j->snap.id) > 0)
        ack_after_save(j->snap.id, std::move(b.rp)); // not committed yet: after its commit
      else
        b.rp.deliver(pool_ack{view(*j), 0, 0});
      continue;
    }
    auto id = accept(++next_id_, std::move(b.sub), b.at, true).snap.id;
    for (uint32_t i = 0; i < workers_.size(); ++i) // a free worker starts it right away
      if (workers_[i].free()) {
        give(i);
        break;
      }
    if (durable_)
      ack_after_save(id, std::move(b.rp));
    else
      // No credits for an answer that comes late: its submitter may have stopped waiting
      // (cancelled), and room granted to nobody would stay reserved.
      b.rp.deliver(ack_for(id, false));
  }
}

} // namespace troupe::detail
