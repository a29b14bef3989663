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

#include "troupe/messages/errc.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::event_record>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::event_receipt>)

namespace troupe {

namespace {

using namespace troupe::atoms;

caf::error sqlite_error(sqlite3* db, int rc, const std::string& what) {
  std::string msg = what + ": " + (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)) +
                    " (SQLite " + std::to_string(rc) + ")";
  auto primary = rc & 0xff;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
    return make_error(errc::storage_busy, what, msg);
  if (primary == SQLITE_CANTOPEN || primary == SQLITE_NOTADB || primary == SQLITE_PERM ||
      primary == SQLITE_AUTH)
    return make_error(errc::storage_unavailable, what, msg);
  return make_error(errc::storage_failed, what, msg);
}

/// A prepared statement, finalized on scope exit.
class statement {
 public:
  statement() = default;
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;
  ~statement() { sqlite3_finalize(stmt_); }
  caf::error prepare(sqlite3* db, const char* sql) {
    auto rc = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
    return rc == SQLITE_OK ? caf::error{} : sqlite_error(db, rc, "prepare");
  }
  sqlite3_stmt* get() const noexcept { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

caf::error exec(sqlite3* db, const char* sql, const char* what) {
  char* err = nullptr;
  auto rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return {};
  sqlite3_free(err);
  return sqlite_error(db, rc, what);
}

struct db_closer {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
using db_ptr = std::unique_ptr<sqlite3, db_closer>;

/// Forward migrations: migrations[v] takes a database from version v to v + 1.
const char* const migrations[] = {
    // 0 -> 1: meta and the event log.
    "CREATE TABLE IF NOT EXISTS troupe_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " topic TEXT NOT NULL, at_ms INTEGER NOT NULL, payload TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS events_by_topic ON events(topic, id);",
};

caf::expected<db_ptr> open_database(const storage_config& cfg, int64_t& version) {
  std::error_code ec;
  auto dir = std::filesystem::path{cfg.path}.parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec)
      return make_error(errc::storage_unavailable, "path",
                        "cannot create " + dir.string() + ": " + ec.message());
  }
  sqlite3* raw = nullptr;
  auto rc =
      sqlite3_open_v2(cfg.path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  db_ptr db{raw};
  if (rc != SQLITE_OK) {
    auto err = sqlite_error(raw, rc, "open");
    return make_error(errc::storage_unavailable, "path", cfg.path + ": " + detail_of(err));
  }
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, static_cast<int>(cfg.busy_timeout.count()));
  // Reading the version first: a newer database is refused before anything is written.
  {
    statement st;
    if (auto err = st.prepare(raw, "PRAGMA user_version"))
      return make_error(errc::storage_unavailable, "path", cfg.path + ": " + detail_of(err));
    if (sqlite3_step(st.get()) != SQLITE_ROW) {
      auto err = sqlite_error(raw, sqlite3_errcode(raw), "user_version");
      return make_error(errc::storage_unavailable, "path", cfg.path + ": " + detail_of(err));
    }
    version = sqlite3_column_int64(st.get(), 0);
  }
  if (version < 0)
    return make_error(errc::storage_unavailable, "path",
                      cfg.path + " has a negative schema version; not a troupe database");
  if (sqlite3_db_readonly(raw, "main") == 1)
    return make_error(errc::storage_unavailable, "path", cfg.path + " is read-only");
  if (version > storage_schema_version)
    return make_error(errc::schema_too_new, "path",
                      cfg.path + " has schema version " + std::to_string(version) +
                          "; this troupe writes version " + std::to_string(storage_schema_version));
  if (auto err = exec(raw, "PRAGMA journal_mode=WAL", "journal_mode")) return err;
  if (auto err = exec(
          raw, cfg.fsync_every_commit ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
          "synchronous"))
    return err;
  while (version < storage_schema_version) {
    if (auto err = exec(raw, "BEGIN IMMEDIATE", "migrate")) return err;
    { // another process may have migrated meanwhile: read the version under the lock
      statement st;
      if (auto err = st.prepare(raw, "PRAGMA user_version")) {
        exec(raw, "ROLLBACK", "rollback");
        return err;
      }
      if (sqlite3_step(st.get()) == SQLITE_ROW) version = sqlite3_column_int64(st.get(), 0);
    }
    if (version >= storage_schema_version) {
      exec(raw, "ROLLBACK", "rollback");
      break;
    }
    if (auto err = exec(raw, migrations[version], "migrate")) {
      exec(raw, "ROLLBACK", "rollback");
      return err;
    }
    auto set = "PRAGMA user_version=" + std::to_string(version + 1);
    if (auto err = exec(raw, set.c_str(), "migrate")) {
      exec(raw, "ROLLBACK", "rollback");
      return err;
    }
    if (auto err = exec(raw, "COMMIT", "migrate")) {
      exec(raw, "ROLLBACK", "rollback");
      return err;
    }
    ++version;
  }
  // The statements the actor uses must prepare here (a foreign `events` table fails now,
  // with a typed error, not later inside the actor).
  for (auto sql : {"INSERT INTO events(topic, at_ms, payload) VALUES(?, ?, ?)",
                   "SELECT id, at_ms, payload FROM events WHERE topic = ? AND id > ? ORDER BY id "
                   "LIMIT ?"}) {
    statement st;
    if (auto err = st.prepare(raw, sql))
      return make_error(errc::storage_unavailable, "path",
                        cfg.path + " is not a troupe database: " + detail_of(err));
  }
  return db;
}

/// One SQLite file's owner. Writes are grouped: an append joins the current group; the
/// first append of a group sends this actor a `st_commit` marker, which queues behind every
/// message that arrived before it; when the marker comes, the whole group is written in one
/// transaction and each writer is answered after the commit (or gets the error, nothing of
/// the group being kept).
class storage_actor final : public caf::event_based_actor {
 public:
  storage_actor(caf::actor_config& cfg, storage_config sc, db_ptr db, int64_t version)
      : caf::event_based_actor(cfg), cfg_(std::move(sc)), db_(std::move(db)) {
    metrics_.schema_version = version;
  }

  const char* name() const override { return "troupe.storage"; }

  caf::behavior make_behavior() override {
    if (auto err = prepare()) {
      quit(err);
      return {};
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
          std::vector<std::string> one;
          one.push_back(std::move(payload));
          add_write(write{std::move(topic), std::move(one), rp, false});
          return rp;
        },
        [this](st_append_many_atom, std::string& topic,
               std::vector<std::string>& payloads) -> caf::result<std::vector<event_receipt>> {
          if (auto err = check_topic(topic)) return err;
          auto rp = make_response_promise<std::vector<event_receipt>>();
          add_write(write{std::move(topic), std::move(payloads), rp, true});
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
          std::vector<event_record> out;
          if (auto err = read(topic, after, limit, out)) return err;
          return out;
        },
        [this](st_subscribe_atom, const std::string& topic, int64_t from,
               caf::actor& who) -> caf::result<bool> {
          if (auto err = check_topic(topic)) return err;
          // The backlog first, from this actor, then every commit: nothing missed, nothing twice.
          for (;;) {
            std::vector<event_record> batch;
            if (auto err = read(topic, from, 1000, batch)) return err;
            for (auto& e : batch) {
              from = e.event_id;
              send(who, st_event_atom::value, std::move(e));
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
        [this](st_metrics_atom) { return metrics_; },
    };
  }

  void on_exit() override {
    if (!pending_.empty()) commit(); // answer the writers: nothing is left unanswered
    subscribers_.clear();            // no reference cycle keeps this actor's thread alive
    insert_ = nullptr;
    read_ = nullptr;
    db_.reset();
  }

 private:
  /// One message's appends: one payload (`st_append`, answered with a receipt) or several
  /// (`st_append_many`, answered with their receipts in order).
  struct write {
    std::string topic;
    std::vector<std::string> payloads;
    caf::response_promise rp;
    bool many = false;
  };

  caf::error prepare() {
    insert_ = std::make_unique<statement>();
    if (auto err = insert_->prepare(db_.get(),
                                    "INSERT INTO events(topic, at_ms, payload) VALUES(?, ?, ?)"))
      return err;
    read_ = std::make_unique<statement>();
    return read_->prepare(db_.get(), "SELECT id, at_ms, payload FROM events WHERE topic = ? AND "
                                     "id > ? ORDER BY id LIMIT ?");
  }

  int64_t now_ms() const {
    if (cfg_.clock != nullptr) return cfg_.clock->now_ms();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  caf::error read(const std::string& topic, int64_t after, int64_t limit,
                  std::vector<event_record>& out) {
    auto st = read_->get();
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, topic.data(), static_cast<int>(topic.size()), SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int64(st, 3, limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      event_record e;
      e.event_id = sqlite3_column_int64(st, 0);
      e.topic = topic;
      e.at_ms = sqlite3_column_int64(st, 1);
      auto text = reinterpret_cast<const char*>(sqlite3_column_text(st, 2));
      e.payload.assign(text, static_cast<size_t>(sqlite3_column_bytes(st, 2)));
      out.push_back(std::move(e));
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return sqlite_error(db_.get(), rc, "read");
    return {};
  }

  void add_write(write w) {
    for (auto& p : w.payloads) {
      if (p.size() > max_payload_bytes) { // would fail (or wrap) in SQLite: refused alone
        w.rp.deliver(make_error(errc::invalid_payload, "payload",
                                "a payload has at most " + std::to_string(max_payload_bytes) +
                                    " bytes, got " + std::to_string(p.size())));
        return;
      }
    }
    pending_rows_ += w.payloads.size();
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
    try {
      commit_group(group);
    } catch (const std::exception& e) {
      exec(db_.get(), "ROLLBACK", "rollback");
      ++metrics_.failures;
      auto err = make_error(errc::storage_failed, "commit", e.what());
      for (auto& w : group)
        if (w.rp.pending()) w.rp.deliver(err);
    }
  }

  void commit_group(std::vector<write>& group) {
    auto rows = std::exchange(pending_rows_, 0);
    auto db = db_.get();
    std::vector<event_receipt> receipts;
    receipts.reserve(rows);
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
    auto st = insert_->get();
    for (auto& w : group) {
      for (auto& payload : w.payloads) {
        sqlite3_reset(st);
        auto rc = sqlite3_bind_text(st, 1, w.topic.data(), static_cast<int>(w.topic.size()),
                                    SQLITE_STATIC);
        if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, at);
        if (rc == SQLITE_OK)
          rc = sqlite3_bind_text(st, 3, payload.data(), static_cast<int>(payload.size()),
                                 SQLITE_STATIC);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        if (rc != SQLITE_DONE) {
          auto err = sqlite_error(db, rc, "append");
          sqlite3_reset(st);
          fail(std::move(err));
          return;
        }
        receipts.push_back(event_receipt{sqlite3_last_insert_rowid(db), at});
      }
    }
    sqlite3_reset(st);
    if (auto err = exec(db, "COMMIT", "commit")) {
      fail(std::move(err));
      return;
    }
    ++metrics_.transactions;
    metrics_.rows += rows;
    metrics_.largest_batch = std::max<uint64_t>(metrics_.largest_batch, rows);
    size_t next = 0;
    for (auto& w : group) {
      auto first = next;
      next += w.payloads.size();
      if (w.many)
        w.rp.deliver(std::vector<event_receipt>(receipts.begin() + static_cast<ptrdiff_t>(first),
                                                receipts.begin() + static_cast<ptrdiff_t>(next)));
      else
        w.rp.deliver(receipts[first]);
      if (auto s = subscribers_.find(w.topic); s != subscribers_.end())
        for (size_t i = 0; i < w.payloads.size(); ++i)
          for (auto& who : s->second)
            send(who, st_event_atom::value,
                 event_record{receipts[first + i].event_id, w.topic, at, w.payloads[i]});
    }
  }

  static constexpr size_t max_payload_bytes = size_t{64} << 20; // 64 MiB

  storage_config cfg_;
  db_ptr db_;
  std::unique_ptr<statement> insert_;
  std::unique_ptr<statement> read_;
  std::vector<write> pending_;
  size_t pending_rows_ = 0;
  bool marker_sent_ = false;
  std::unordered_map<std::string, std::vector<caf::actor>> subscribers_;
  storage_metrics metrics_;
};

} // namespace

caf::error check_topic(const std::string& topic) {
  if (topic.empty()) return make_error(errc::invalid_topic, "topic", "a topic cannot be empty");
  if (topic.size() > 200)
    return make_error(errc::invalid_topic, "topic",
                      "a topic has at most 200 bytes, got " + std::to_string(topic.size()));
  char prev = '.';
  for (auto c : topic) {
    bool sep = c == '.' || c == ':';
    if (sep && (prev == '.' || prev == ':'))
      return make_error(errc::invalid_topic, "topic", "\"" + topic + "\" has an empty segment");
    prev = c;
  }
  if (prev == '.' || prev == ':')
    return make_error(errc::invalid_topic, "topic", "\"" + topic + "\" has an empty segment");
  return {};
}

caf::expected<caf::actor> spawn_storage(caf::actor_system& sys, storage_config cfg) {
  int64_t version = 0;
  auto db = open_database(cfg, version);
  if (!db) return std::move(db.error());
  if (cfg.detached)
    return sys.spawn<storage_actor, caf::detached>(std::move(cfg), std::move(*db), version);
  return sys.spawn<storage_actor>(std::move(cfg), std::move(*db), version);
}

} // namespace troupe
