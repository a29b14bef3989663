#include "troupe/persistence/storage.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "pool_store.hpp"
#include "schema.hpp"
#include "signing.hpp"
#include "troupe/messages/durable.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"


namespace troupe {

namespace {

using namespace troupe::atoms;

using namespace troupe::detail;

/// One SQLite file's owner. Writes are grouped: an append joins the current group; the
/// first append of a group sends this actor a `st_commit` marker, which queues behind every
/// message that arrived before it; when the marker comes, the whole group is written in one
/// transaction and each writer is answered after the commit (or gets the error, nothing of
/// the group being kept).
class storage_actor final : public storage_actor_type::base {
 public:
  storage_actor(caf::actor_config& cfg, storage_config sc, db_ptr db, int64_t version,
                std::string key)
      : storage_actor_type::base(cfg), cfg_(std::move(sc)), db_(std::move(db)), key_(std::move(key)) {
    metrics_.schema_version = version;
  }

  const char* name() const override { return "troupe.storage"; }

  behavior_type make_behavior() override {
    if (auto err = prepare()) {
      quit(err);
      return behavior_type{behavior_type::unsafe_init{}, caf::behavior{}};
    }
    set_down_handler([this](caf::down_msg& dm) {
      for (auto& kvp : subscribers_)
        kvp.second.erase(
            std::remove_if(kvp.second.begin(), kvp.second.end(),
                           [&](const caf::actor& a) { return a.address() == dm.source; }),
            kvp.second.end());
    });
    return {
        [this](st_append_atom, std::string& topic,
               std::string& payload) -> caf::result<event_receipt> {
          if (auto err = check_topic(topic)) return err;
          auto rp = make_response_promise<event_receipt>();
          write w{write::one_event, std::move(topic), {}, nullptr, rp, {}, 0};
          w.payloads.push_back(payload);
          add_write(std::move(w));
          return rp;
        },
        [this](st_append_many_atom, std::string& topic,
               payload_batch& payloads) -> caf::result<std::vector<event_receipt>> {
          if (auto err = check_topic(topic)) return err;
          auto rp = make_response_promise<std::vector<event_receipt>>();
          add_write(
              write{write::many_events, std::move(topic), std::move(payloads), nullptr, rp, {}, 0});
          return rp;
        },
        [this](st_chan_append_atom, channel_write& a) -> caf::result<channel_receipt> {
          if (auto err = check_topic(a.name_resolved)) return err;
          auto rp = make_response_promise<channel_receipt>();
          auto chan = std::make_unique<channel_state>();
          chan->in = std::move(a);
          add_write(write{write::channel, {}, {}, std::move(chan), rp, {}, 0});
          return rp;
        },
        [this](st_commit_atom) {
          marker_sent_ = false;
          commit();
        },
        [this](st_read_atom, const std::string& topic, int64_t after,
               int64_t limit) -> caf::result<std::vector<event_record>> {
          if (auto err = check_topic(topic)) return err;
          if (limit <= 0) return make_error(errc::invalid_argument, "limit", "must be at least 1");
          commit(); // a read sees every write that came before it
          std::vector<event_record> out;
          if (auto err = read(topic, after, limit, out)) return err;
          return out;
        },
        [this](st_chan_read_atom, const std::string& name, int64_t after,
               int64_t limit) -> caf::result<std::vector<channel_event>> {
          if (auto err = check_topic(name)) return err;
          if (limit <= 0) return make_error(errc::invalid_argument, "limit", "must be at least 1");
          commit();
          std::vector<channel_event> out;
          if (auto err = read_channel(name, after, limit, out)) return err;
          return out;
        },
        [this](st_chan_verify_atom, const channel_receipt& r) {
          return detail::verify_receipt(key_, r);
        },
        [this](st_rate_acquire_atom, const std::vector<rate_bucket>& buckets,
               int64_t max_wait_ms) -> caf::result<rate_attempt> {
          commit(); // writes that came first are committed first
          // A caller with a shorter timeout waits for another process's lock that long at
          // most (then it is storage_busy, which the caller treats as "no room yet").
          auto bound =
              std::min<int64_t>(std::max<int64_t>(max_wait_ms, 0), cfg_.busy_timeout.count());
          sqlite3_busy_timeout(db_.get(), static_cast<int>(bound));
          auto r = rate_acquire(buckets);
          sqlite3_busy_timeout(db_.get(), static_cast<int>(cfg_.busy_timeout.count()));
          return r;
        },
        [this](st_subscribe_atom, const std::string& topic, int64_t from,
               caf::actor& who) -> caf::result<bool> {
          if (auto err = check_topic(topic)) return err;
          commit();
          // The backlog first, from this actor, then every commit: nothing missed, nothing twice.
          for (;;) {
            std::vector<event_record> batch;
            if (auto err = read(topic, from, 1000, batch)) return err;
            for (auto& e : batch) {
              from = e.event_id;
              caf::anon_send(who, st_event_atom::value, std::move(e));
            }
            if (batch.size() < 1000) break;
          }
          monitor(who);
          auto& v = subscribers_[topic];
          v.erase(std::remove(v.begin(), v.end(), who), v.end()); // a resubscription replaces
          v.push_back(std::move(who));
          return true;
        },
        [this](st_unsubscribe_atom, const std::string& topic, const caf::actor& who) {
          auto& v = subscribers_[topic];
          auto n = v.size();
          v.erase(std::remove(v.begin(), v.end(), who), v.end());
          return v.size() != n;
        },
        [this](st_pool_save_atom, std::string& pool_id, std::vector<pool_row>& rows,
               int64_t keep) -> caf::result<uint64_t> {
          auto rp = make_response_promise<uint64_t>();
          write w{write::pool, std::move(pool_id), {}, nullptr, rp, std::move(rows), keep};
          add_write(std::move(w));
          return rp;
        },
        [this](st_pool_load_atom, const std::string& pool_id) -> caf::result<std::vector<pool_row>> {
          commit(); // a load sees every save that came before it
          std::vector<pool_row> out;
          if (auto err = pools_.load(db_.get(), pool_id, out)) return err;
          return out;
        },
        [this](st_metrics_atom) { return metrics_; },
    };
  }

  void on_exit() override {
    if (!pending_.empty()) commit(); // answer the writers: nothing is left unanswered
    subscribers_.clear();            // no reference cycle keeps this actor's thread alive
    for (auto st : {&insert_, &read_, &chan_insert_, &chan_find_, &chan_read_, &rate_expire_,
                    &rate_held_, &rate_reserve_})
      st->reset();
    pools_.reset();
    db_.reset();
  }

 private:
  /// One message's writes: one event (`st_append`, answered with a receipt), several
  /// (`st_append_many`, answered with their receipts in order) or one channel event.
  struct channel_state {
    channel_write in;
    channel_receipt out; // filled while the group is written
  };
  struct write {
    enum kind_t : uint8_t { one_event, many_events, channel, pool } kind;
    /// The topic; a pool save: the pool id.
    std::string topic;
    payload_batch payloads;
    std::unique_ptr<channel_state> chan;
    caf::response_promise rp;
    std::vector<pool_row> pool_rows;
    int64_t keep = 0;
  };

  caf::error prepare() {
    std::pair<std::unique_ptr<statement>*, const char*> all[] = {
        {&insert_, sql_insert_event},
        {&read_, sql_read_events},
        {&chan_insert_, sql_insert_channel_event},
        {&chan_find_, sql_find_channel_event},
        {&chan_read_, sql_read_channel_events},
        {&rate_expire_, sql_rate_expire},
        {&rate_held_, sql_rate_held},
        {&rate_reserve_, sql_rate_reserve},
    };
    for (auto& [st, sql] : all) {
      *st = std::make_unique<statement>();
      if (auto err = (*st)->prepare(db_.get(), sql)) return err;
    }
    return pools_.prepare(db_.get());
  }

  int64_t now_ms() const {
    if (cfg_.clock != nullptr) return cfg_.clock->now_ms();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  static void bind(sqlite3_stmt* st, int i, std::string_view x, int& rc) {
    if (rc == SQLITE_OK)
      rc = sqlite3_bind_text(st, i, x.data(), static_cast<int>(x.size()), SQLITE_STATIC);
  }

  static void bind(sqlite3_stmt* st, int i, int64_t x, int& rc) {
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, i, x);
  }

  static std::string column_text(sqlite3_stmt* st, int i) {
    auto text = reinterpret_cast<const char*>(sqlite3_column_text(st, i));
    return text == nullptr ? std::string{}
                           : std::string{text, static_cast<size_t>(sqlite3_column_bytes(st, i))};
  }

  caf::error read(const std::string& topic, int64_t after, int64_t limit,
                  std::vector<event_record>& out) {
    auto st = read_->get();
    sqlite3_reset(st);
    int rc = SQLITE_OK;
    bind(st, 1, topic, rc);
    bind(st, 2, after, rc);
    bind(st, 3, limit, rc);
    if (rc != SQLITE_OK) return sqlite_error(db_.get(), rc, "read");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      event_record e;
      e.event_id = sqlite3_column_int64(st, 0);
      e.topic = topic;
      e.at_ms = sqlite3_column_int64(st, 1);
      e.payload = column_text(st, 2);
      out.push_back(std::move(e));
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return sqlite_error(db_.get(), rc, "read");
    return {};
  }

  caf::error read_channel(const std::string& name, int64_t after, int64_t limit,
                          std::vector<channel_event>& out) {
    auto st = chan_read_->get();
    sqlite3_reset(st);
    int rc = SQLITE_OK;
    bind(st, 1, name, rc);
    bind(st, 2, after, rc);
    bind(st, 3, limit, rc);
    if (rc != SQLITE_OK) return sqlite_error(db_.get(), rc, "read");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      channel_event e;
      e.receipt.event_id = sqlite3_column_int64(st, 0);
      e.receipt.name_resolved = name;
      e.receipt.emitted_at.scope = column_text(st, 1);
      e.receipt.emitted_at.scope_id = column_text(st, 2);
      e.id = column_text(st, 3);
      e.receipt.emitted_at.at_ms = sqlite3_column_int64(st, 4);
      e.receipt.emitted_at.emitted_by = column_text(st, 5);
      e.payload = column_text(st, 6);
      e.receipt.emitted_at.sig = detail::sign_receipt(key_, e.receipt);
      out.push_back(std::move(e));
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return sqlite_error(db_.get(), rc, "read");
    return {};
  }

  void add_write(write w) {
    auto too_big = [&](std::string_view p) {
      if (p.size() <= max_payload_bytes) return false;
      // would fail (or wrap) in SQLite: refused alone
      w.rp.deliver(make_error(errc::invalid_payload, "payload",
                              "a payload has at most " + std::to_string(max_payload_bytes) +
                                  " bytes, got " + std::to_string(p.size())));
      return true;
    };
    if (w.kind == write::channel) {
      if (too_big(w.chan->in.payload)) return;
      pending_rows_ += 1;
    } else if (w.kind == write::pool) {
      for (auto& r : w.pool_rows) {
        if (r.encode) {
          // The pool left the encoding to us (off its turn). Done here, before the row
          // joins a group: text that is not UTF-8 is replaced, never thrown inside a
          // transaction that other writers share, and the size check sees the text.
          r.record = to_json(r.snapshot).dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace);
          r.encode = false;
          r.snapshot = {};
        }
        if (too_big(r.record)) return;
      }
      pending_rows_ += w.pool_rows.size();
    } else {
      for (size_t i = 0; i < w.payloads.size(); ++i)
        if (too_big(w.payloads[i])) return;
      pending_rows_ += w.payloads.size();
    }
    pending_.push_back(std::move(w));
    if (pending_rows_ >= cfg_.max_batch) {
      commit();
    } else if (!marker_sent_) {
      marker_sent_ = true;
      send(this, st_commit_atom::value);
    }
  }

  /// Writes the pending group in one transaction; answers each writer after the commit. An
  /// exception (out of memory) still answers every writer of the group.
  void commit() {
    if (pending_.empty()) return;
    auto group = std::move(pending_);
    pending_.clear();
    if (cfg_.write_fault && cfg_.write_fault()) {
      ++metrics_.failures;
      pending_rows_ = 0; // as commit_group does: the next group counts its own rows
      auto err = make_error(errc::storage_failed, "commit",
                            "a simulated write failure (fault point storage.write)");
      for (auto& w : group)
        if (w.rp.pending()) w.rp.deliver(err);
      group.clear();
      if (pending_.empty()) pending_.swap(group);
      return;
    }
    try {
      commit_group(group);
    } catch (const std::exception& e) {
      exec(db_.get(), "ROLLBACK", "rollback");
      ++metrics_.failures;
      auto err = make_error(errc::storage_failed, "commit", e.what());
      for (auto& w : group)
        if (w.rp.pending()) w.rp.deliver(err);
    }
    group.clear();
    if (pending_.empty()) pending_.swap(group); // keeps the capacity
  }

  /// Inserts one event-log row; returns its id or 0 after setting `err`.
  int64_t insert_event(const std::string& topic, int64_t at, std::string_view payload,
                       caf::error& err) {
    auto st = insert_->get();
    sqlite3_reset(st);
    int rc = SQLITE_OK;
    bind(st, 1, topic, rc);
    bind(st, 2, at, rc);
    bind(st, 3, payload, rc);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
      err = sqlite_error(db_.get(), rc, "append");
      return 0;
    }
    return sqlite3_last_insert_rowid(db_.get());
  }

  /// Writes one channel append (or finds its earlier twin) and its audit row.
  caf::error write_channel(write& w, int64_t at, std::vector<event_record>& notes) {
    auto db = db_.get();
    auto& a = w.chan->in;
    auto& r = w.chan->out;
    r.name_resolved = a.name_resolved;
    r.emitted_at.scope = a.scope;
    r.emitted_at.scope_id = a.scope_id;
    int rc = SQLITE_OK;
    if (!a.id.empty()) {
      auto st = chan_find_->get();
      sqlite3_reset(st);
      bind(st, 1, a.name_resolved, rc);
      bind(st, 2, a.id, rc);
      if (rc == SQLITE_OK) rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) {
        r.event_id = sqlite3_column_int64(st, 0);
        r.emitted_at.at_ms = sqlite3_column_int64(st, 1);
        r.emitted_at.emitted_by = column_text(st, 2);
        r.duplicate = true;
        rc = SQLITE_DONE;
      }
      sqlite3_reset(st);
      if (rc != SQLITE_DONE) return sqlite_error(db, rc, "append");
      rc = SQLITE_OK;
    }
    if (!r.duplicate) {
      auto st = chan_insert_->get();
      sqlite3_reset(st);
      bind(st, 1, a.name_resolved, rc);
      bind(st, 2, a.scope, rc);
      bind(st, 3, a.scope_id, rc);
      if (rc == SQLITE_OK)
        rc = a.id.empty() ? sqlite3_bind_null(st, 4)
                          : sqlite3_bind_text(st, 4, a.id.data(), static_cast<int>(a.id.size()),
                                              SQLITE_STATIC);
      bind(st, 5, at, rc);
      bind(st, 6, a.emitted_by, rc);
      bind(st, 7, a.payload, rc);
      if (rc == SQLITE_OK) rc = sqlite3_step(st);
      sqlite3_reset(st);
      if (rc != SQLITE_DONE) return sqlite_error(db, rc, "append");
      r.event_id = sqlite3_last_insert_rowid(db);
      r.emitted_at.at_ms = at;
      r.emitted_at.emitted_by = a.emitted_by;
    }
    r.emitted_at.sig = detail::sign_receipt(key_, r);
    nlohmann::json audit = r;
    audit["kind"] = "append";
    auto text = audit.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    caf::error err;
    auto id = insert_event(channel_audit_topic, at, text, err);
    if (err) return err;
    if (subscribers_.count(channel_audit_topic) > 0)
      notes.push_back(event_record{id, channel_audit_topic, at, std::move(text)});
    return {};
  }

  void commit_group(std::vector<write>& group) {
    auto rows = std::exchange(pending_rows_, 0);
    auto db = db_.get();
    auto& receipts = receipts_; // kept between groups: no large allocation per group
    receipts.clear();
    receipts.reserve(rows);
    std::vector<event_record> notes; // the group's rows that have subscribers
    auto at = now_ms();
    auto fail = [&](caf::error err) {
      exec(db, "ROLLBACK", "rollback");
      ++metrics_.failures;
      for (auto& w : group)
        w.rp.deliver(err);
    };
    if (auto err = exec(db, "BEGIN IMMEDIATE", "begin")) {
      ++metrics_.failures;
      for (auto& w : group)
        w.rp.deliver(err);
      return;
    }
    for (auto& w : group) {
      caf::error err;
      if (w.kind == write::channel) {
        err = write_channel(w, at, notes);
      } else if (w.kind == write::pool) {
        err = pools_.save(db, w.topic, w.pool_rows, w.keep);
      } else {
        for (size_t i = 0; i < w.payloads.size(); ++i) {
          auto id = insert_event(w.topic, at, w.payloads[i], err);
          if (err) break;
          receipts.push_back(event_receipt{id, at});
        }
      }
      if (err) {
        fail(std::move(err));
        return;
      }
    }
    if (auto err = exec(db, "COMMIT", "commit")) {
      fail(std::move(err));
      return;
    }
    ++metrics_.transactions;
    metrics_.rows += rows;
    metrics_.largest_batch = std::max<uint64_t>(metrics_.largest_batch, rows);
    size_t next = 0;
    for (auto& w : group) {
      if (w.kind == write::channel) {
        w.rp.deliver(std::move(w.chan->out));
        continue;
      }
      if (w.kind == write::pool) {
        w.rp.deliver(static_cast<uint64_t>(w.pool_rows.size()));
        continue;
      }
      auto first = next;
      next += w.payloads.size();
      if (w.kind == write::many_events)
        w.rp.deliver(std::vector<event_receipt>(receipts.begin() + static_cast<ptrdiff_t>(first),
                                                receipts.begin() + static_cast<ptrdiff_t>(next)));
      else
        w.rp.deliver(receipts[first]);
      if (subscribers_.count(w.topic) != 0)
        for (size_t i = 0; i < w.payloads.size(); ++i)
          notes.push_back(event_record{receipts[first + i].event_id, w.topic, at,
                                       std::string{w.payloads[i]}});
    }
    // Subscribers get the group's rows in row order, whichever write made them (a channel
    // append's audit row and a direct append to the same topic interleave in one group).
    std::stable_sort(notes.begin(), notes.end(),
                     [](const event_record& a, const event_record& b) { return a.event_id < b.event_id; });
    for (auto& e : notes)
      if (auto s = subscribers_.find(e.topic); s != subscribers_.end())
        for (auto& who : s->second)
          caf::anon_send(who, st_event_atom::value, e);
  }

  /// Reserves every bucket or none, in one transaction. A bucket holds the reservations of
  /// the last window; one asking more than the limit is charged the whole limit (it needs an
  /// empty bucket). Not reserved: how long until the fullest bucket has room.
  caf::result<rate_attempt> rate_acquire(const std::vector<rate_bucket>& buckets) {
    if (auto err = check_buckets(buckets)) return err;
    auto db = db_.get();
    if (auto err = exec(db, "BEGIN IMMEDIATE", "begin")) return err;
    auto now = now_ms();
    auto fail = [&](int rc, const char* what) {
      auto err = sqlite_error(db, rc, what);
      exec(db, "ROLLBACK", "rollback");
      return err;
    };
    rate_attempt out{true, 0};
    for (auto& b : buckets) {
      int rc = SQLITE_OK;
      auto st = rate_expire_->get();
      sqlite3_reset(st);
      bind(st, 1, b.key, rc);
      bind(st, 2, now, rc);
      if (rc == SQLITE_OK) rc = sqlite3_step(st);
      sqlite3_reset(st);
      if (rc != SQLITE_DONE) return fail(rc, "rate limit");
      rc = SQLITE_OK;
      st = rate_held_->get();
      bind(st, 1, b.key, rc);
      std::vector<std::pair<int64_t, int64_t>> held; // (expires, units), soonest first
      int64_t used = 0;
      if (rc == SQLITE_OK)
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
          held.emplace_back(sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1));
          used += held.back().second;
        }
      sqlite3_reset(st);
      if (rc != SQLITE_DONE) return fail(rc, "rate limit");
      auto charge = std::min(b.units, b.limit);
      if (used + charge <= b.limit) continue;
      out.ok = false;
      auto free_at = now;
      for (auto& [expires, units] : held) { // the earliest moment enough has expired
        used -= units;
        free_at = expires;
        if (used + charge <= b.limit) break;
      }
      out.retry_after_ms = std::max(out.retry_after_ms, std::max<int64_t>(free_at - now, 1));
    }
    if (out.ok) {
      for (auto& b : buckets) {
        int rc = SQLITE_OK;
        auto st = rate_reserve_->get();
        sqlite3_reset(st);
        bind(st, 1, b.key, rc);
        bind(st, 2, now + b.window_ms, rc);
        bind(st, 3, std::min(b.units, b.limit), rc);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE) return fail(rc, "rate limit");
      }
    }
    if (auto err = exec(db, out.ok ? "COMMIT" : "ROLLBACK", "commit")) {
      exec(db, "ROLLBACK", "rollback");
      return err;
    }
    return out;
  }

  static constexpr size_t max_payload_bytes = size_t{64} << 20; // 64 MiB

  storage_config cfg_;
  db_ptr db_;
  std::string key_;
  std::unique_ptr<statement> insert_;
  std::unique_ptr<statement> read_;
  std::unique_ptr<statement> chan_insert_;
  std::unique_ptr<statement> chan_find_;
  std::unique_ptr<statement> chan_read_;
  std::unique_ptr<statement> rate_expire_;
  std::unique_ptr<statement> rate_held_;
  std::unique_ptr<statement> rate_reserve_;
  pool_store pools_;
  std::vector<write> pending_;
  std::vector<event_receipt> receipts_;
  size_t pending_rows_ = 0;
  bool marker_sent_ = false;
  std::unordered_map<std::string, std::vector<caf::actor>> subscribers_;
  storage_metrics metrics_;
};

} // namespace

caf::expected<caf::actor> spawn_storage(caf::actor_system& sys, storage_config cfg,
                                        std::string* signing_key) {
  int64_t version = 0;
  std::string key;
  auto db = open_database(cfg, version, key);
  if (!db) return std::move(db.error());
  if (signing_key != nullptr) *signing_key = key;
  if (cfg.detached)
    return caf::actor_cast<caf::actor>(sys.spawn<storage_actor, caf::detached>(
        std::move(cfg), std::move(*db), version, std::move(key)));
  return caf::actor_cast<caf::actor>(
      sys.spawn<storage_actor>(std::move(cfg), std::move(*db), version, std::move(key)));
}

} // namespace troupe
