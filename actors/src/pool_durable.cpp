// Pipeline pools: their records through the storage actor (reload, group-committed saves,
// submits answered after the commit), and the `pool.audit` event-log topic.

#include "pool_actor.hpp"

#include "primitive_actors.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

void pool_actor::load() {
  loading_ = true;
  auto fail = [this](caf::error& err) {
    load_error_ = err ? err : make_error(errc::storage_unavailable, "storage", "no storage");
    loading_ = false;
    closed_ = true;
    for (auto& rp : ready_waiters_)
      rp.deliver(load_error_);
    ready_waiters_.clear();
  };
  if (!env_->registry) {
    caf::error err = make_error(errc::storage_unavailable, "storage", "no registry");
    fail(err);
    return;
  }
  request(env_->registry, caf::infinite, dir_find_atom::value, runtime_service::storage,
          std::string{}, true)
      .then(
          [this, fail](caf::actor& st) mutable {
            if (!st) {
              caf::error err = make_error(errc::storage_unavailable, "storage",
                                          "a pipeline pool needs the runtime's storage");
              fail(err);
              return;
            }
            storage_ = std::move(st);
            request(storage_, caf::infinite, st_pool_load_atom::value, id_)
                .then([this](std::vector<pool_row>& rows) { reload(rows); }, fail);
          },
          fail);
}

void pool_actor::reload(std::vector<pool_row>& rows) {
  for (auto& r : rows) {
    auto j = nlohmann::json::parse(r.record, nullptr, false);
    auto snap = pool_task_snapshot_from_json(j);
    if (!snap) continue; // not ours to interpret: left in the store as it is
    auto& rec = jobs_[snap->id];
    rec.snap = std::move(*snap);
    if (!is_terminal(rec.snap.status)) { // its closure died with its process
      rec.snap.status = pool_task_status::failed;
      rec.snap.stale = true;
      rec.snap.error = make_error(errc::pool_task_stale, "task",
                                  "the task was queued or running when its process died");
      save(rec);
    }
    rec.out.err = rec.snap.error;
    next_id_ = std::max(next_id_, rec.snap.id);
    ++total_;
    switch (rec.snap.status) {
      case pool_task_status::completed:
        ++completed_;
        break;
      case pool_task_status::rejected:
        ++rejected_;
        break;
      case pool_task_status::cancelled:
        ++cancelled_;
        break;
      default:
        ++failed_;
    }
    // A stale task's closure is gone: a resubmit with its key runs fresh.
    if (!rec.snap.idempotency_key.empty() && !rec.snap.stale)
      idem_[rec.snap.idempotency_key] = rec.snap.id;
    terminal_order_.push_back(rec.snap.id);
  }
  loading_ = false;
  for (auto& rp : ready_waiters_)
    rp.deliver(true);
  ready_waiters_.clear();
}

void pool_actor::save(const job& j) {
  // The storage actor encodes the record (on its own thread, not in the pool's turn).
  save_buf_.push_back(pool_row{j.snap.id, j.snap.status, {}, true, j.snap});
  unsaved_.insert(j.snap.id);
  schedule_flush();
}

void pool_actor::schedule_flush() {
  if (flush_sent_) return;
  flush_sent_ = true;
  send(this, pool_flush_atom::value);
}

void pool_actor::flush_saves() {
  if (save_buf_.empty() || !storage_) return;
  int64_t keep = 0;
  if (terminal_saves_ >= compact_every()) {
    keep = spec_.keep_terminal;
    terminal_saves_ = 0;
  }
  std::vector<uint64_t> ids;
  ids.reserve(save_buf_.size());
  for (auto& r : save_buf_)
    ids.push_back(r.task_id);
  request(storage_, caf::infinite, st_pool_save_atom::value, id_, std::exchange(save_buf_, {}),
          keep)
      .then(
          [this, ids](uint64_t) {
            for (auto id : ids) {
              unsaved_.erase(id);
              save_failed_.erase(id);
              auto w = save_waiters_.find(id);
              if (w == save_waiters_.end()) continue;
              auto i = jobs_.find(id);
              auto t = trimmed_waiting_.find(id);
              for (auto& rp : w->second)
                if (i != jobs_.end())
                  rp.deliver(pool_ack{view(i->second), 0, 0});
                else if (t != trimmed_waiting_.end()) // trimmed before its commit
                  rp.deliver(pool_ack{t->second, 0, 0});
                else
                  rp.deliver(unknown_job(id));
              if (t != trimmed_waiting_.end()) trimmed_waiting_.erase(t);
              save_waiters_.erase(w);
            }
          },
          [this, ids](caf::error& err) {
            // Not saved: a record never committed stays unsaved, and a repeat of its submit
            // saves it again and is answered after that commit (not before, not at once).
            for (auto id : ids) {
              if (jobs_.find(id) == jobs_.end()) // trimmed meanwhile: nothing repeats it
                unsaved_.erase(id);
              else if (unsaved_.count(id) > 0)
                save_failed_.insert(id);
              trimmed_waiting_.erase(id);
              auto w = save_waiters_.find(id);
              if (w == save_waiters_.end()) continue;
              for (auto& rp : w->second)
                rp.deliver(err);
              save_waiters_.erase(w);
            }
          });
}

void pool_actor::find_storage() {
  if (!env_->registry || spec_.audit == pool_audit::none) return;
  request(env_->registry, caf::infinite, dir_find_atom::value, runtime_service::storage,
          std::string{}, true)
      .then([this](caf::actor& st) { storage_ = std::move(st); }, [](caf::error&) {});
}

bool pool_actor::audits(std::string_view event) const noexcept {
  if (!storage_ || spec_.audit == pool_audit::none) return false;
  return spec_.audit == pool_audit::receipts || event == "drop";
}

void pool_actor::audit(const char* event, const job& j, nlohmann::json extra) {
  nlohmann::json rec{{"event", event}, {"pool", spec_.name}, {"pool_id", id_},
                     {"task", j.snap.id}};
  if (extra.is_object())
    for (auto& [k, v] : extra.items())
      rec[k] = v;
  audit_buf_.push_back(rec.dump());
  schedule_flush();
  if (audit_buf_.size() >= 256) flush_audit();
}

void pool_actor::flush_audit() {
  if (audit_buf_.empty() || !storage_) return;
  request(storage_, caf::infinite, st_append_many_atom::value, std::string{"pool.audit"},
          std::exchange(audit_buf_, payload_batch{}))
      .then([](const std::vector<event_receipt>&) {}, [](caf::error&) {});
}

} // namespace troupe::detail
