#pragma once

// The storage actor's schema: forward migrations, the statements it prepares, and opening a
// database (creating it, migrating it forward, loading the receipt-signing key).

#include <cstdint>
#include <iterator>
#include <string>

#include <caf/expected.hpp>

#include "sqlite.hpp"
#include "troupe/persistence/storage.hpp"

namespace troupe::detail {

/// Forward migrations: migrations[v] takes a database from version v to v + 1.
inline const char* const migrations[] = {
    // 0 -> 1: meta and the event log.
    "CREATE TABLE IF NOT EXISTS troupe_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " topic TEXT NOT NULL, at_ms INTEGER NOT NULL, payload TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS events_by_topic ON events(topic, id);",
    // 1 -> 2: durable channels (an idempotency id is unique per resolved name) and the
    // rate limiter's reservations.
    "CREATE TABLE channel_events(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,"
    " scope TEXT NOT NULL, scope_id TEXT NOT NULL, ext_id TEXT, at_ms INTEGER NOT NULL,"
    " emitted_by TEXT NOT NULL, payload TEXT NOT NULL);"
    "CREATE UNIQUE INDEX channel_events_by_ext_id ON channel_events(name, ext_id)"
    " WHERE ext_id IS NOT NULL;"
    "CREATE INDEX channel_events_by_name ON channel_events(name, id);"
    "CREATE TABLE rate_reservations(key TEXT NOT NULL, expires_ms INTEGER NOT NULL,"
    " units INTEGER NOT NULL);"
    "CREATE INDEX rate_reservations_by_key ON rate_reservations(key, expires_ms);",
    // 2 -> 3: durable (pipeline) pools' task records.
    "CREATE TABLE pool_tasks(pool_id TEXT NOT NULL, task_id INTEGER NOT NULL,"
    " status INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY(pool_id, task_id))"
    " WITHOUT ROWID;",
};
static_assert(std::size(migrations) == storage_schema_version);

inline const char* const sql_insert_event = "INSERT INTO events(topic, at_ms, payload) VALUES(?, ?, ?)";
inline const char* const sql_read_events =
    "SELECT id, at_ms, payload FROM events WHERE topic = ? AND id > ? ORDER BY id LIMIT ?";
inline const char* const sql_insert_channel_event =
    "INSERT INTO channel_events(name, scope, scope_id, ext_id, at_ms, emitted_by, payload)"
    " VALUES(?, ?, ?, ?, ?, ?, ?)";
inline const char* const sql_find_channel_event =
    "SELECT id, at_ms, emitted_by FROM channel_events WHERE name = ? AND ext_id = ?";
inline const char* const sql_read_channel_events =
    "SELECT id, scope, scope_id, ext_id, at_ms, emitted_by, payload FROM channel_events"
    " WHERE name = ? AND id > ? ORDER BY id LIMIT ?";
inline const char* const sql_rate_expire =
    "DELETE FROM rate_reservations WHERE key = ? AND expires_ms <= ?";
inline const char* const sql_rate_held =
    "SELECT expires_ms, units FROM rate_reservations WHERE key = ? ORDER BY expires_ms";
inline const char* const sql_pool_upsert =
    "INSERT INTO pool_tasks(pool_id, task_id, status, record) VALUES(?, ?, ?, ?)"
    " ON CONFLICT(pool_id, task_id) DO UPDATE SET status = excluded.status,"
    " record = excluded.record";
/// Keeps a pool's newest `?2` terminal records (statuses from 2 on are terminal).
inline const char* const sql_pool_compact =
    "DELETE FROM pool_tasks WHERE pool_id = ?1 AND status >= 2 AND task_id < (SELECT task_id"
    " FROM pool_tasks WHERE pool_id = ?1 AND status >= 2 ORDER BY task_id DESC LIMIT 1"
    " OFFSET ?2 - 1)";
inline const char* const sql_pool_load =
    "SELECT task_id, status, record FROM pool_tasks WHERE pool_id = ? ORDER BY task_id";
inline const char* const sql_rate_reserve =
    "INSERT INTO rate_reservations(key, expires_ms, units) VALUES(?, ?, ?)";

/// Opens (creating, migrating forward) the database at `cfg.path`; yields its schema
/// version in `version` and the receipt-signing key in `key`. Errors:
/// `storage_unavailable`, `schema_too_new`, `storage_failed`.
caf::expected<db_ptr> open_database(const storage_config& cfg, int64_t& version,
                                    std::string& key);

} // namespace troupe::detail
