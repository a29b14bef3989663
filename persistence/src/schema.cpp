#include "schema.hpp"

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "signing.hpp"

namespace troupe::detail {

namespace {

/// Reads the receipt-signing key, creating it on first use (another process may create it
/// at the same moment: the insert is `OR IGNORE` and the key is read back).
caf::expected<std::string> load_signing_key(sqlite3* db) {
  auto read = [&]() -> caf::expected<std::string> {
    statement st;
    if (auto err = st.prepare(db, "SELECT value FROM troupe_meta WHERE key = 'hmac_key'"))
      return err;
    auto rc = sqlite3_step(st.get());
    if (rc == SQLITE_ROW)
      return std::string{reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0)),
                         static_cast<size_t>(sqlite3_column_bytes(st.get(), 0))};
    if (rc == SQLITE_DONE) return std::string{};
    return sqlite_error(db, rc, "signing key");
  };
  auto key = read();
  if (!key || !key->empty()) return key;
  std::string fresh;
  try {
    fresh = detail::new_signing_key();
  } catch (const std::exception& e) {
    return make_error(errc::storage_failed, "signing key", e.what());
  }
  statement st;
  if (auto err =
          st.prepare(db, "INSERT OR IGNORE INTO troupe_meta(key, value) VALUES('hmac_key', ?)"))
    return err;
  sqlite3_bind_text(st.get(), 1, fresh.data(), static_cast<int>(fresh.size()), SQLITE_STATIC);
  if (auto rc = sqlite3_step(st.get()); rc != SQLITE_DONE)
    return sqlite_error(db, rc, "signing key");
  return read();
}

} // namespace

caf::expected<db_ptr> open_database(const storage_config& cfg, int64_t& version, std::string& key) {
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
  // Switching to WAL while another process opens the same file can answer SQLITE_BUSY
  // without consulting the busy handler: retried here, within the same bound.
  {
    auto deadline = std::chrono::steady_clock::now() + cfg.busy_timeout;
    for (;;) {
      auto err = exec(raw, "PRAGMA journal_mode=WAL", "journal_mode");
      if (!err) break;
      if (!is(err, errc::storage_busy) || std::chrono::steady_clock::now() >= deadline) return err;
      std::this_thread::sleep_for(std::chrono::milliseconds{2});
    }
  }
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
  for (auto sql :
       {sql_insert_event, sql_read_events, sql_insert_channel_event, sql_find_channel_event,
        sql_read_channel_events, sql_rate_expire, sql_rate_held, sql_rate_reserve}) {
    statement st;
    if (auto err = st.prepare(raw, sql))
      return make_error(errc::storage_unavailable, "path",
                        cfg.path + " is not a troupe database: " + detail_of(err));
  }
  auto k = load_signing_key(raw);
  if (!k) return std::move(k.error());
  key = std::move(*k);
  return db;
}

} // namespace troupe::detail
