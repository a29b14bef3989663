#pragma once

// SQLite helpers of the persistence tests: they look at a database behind troupe's back.

#include <cstdio>
#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <sqlite3.h>

namespace troupe_test {

/// Returns what `PRAGMA integrity_check` says of `db` ("ok" when intact). With `recover`,
/// the file is opened for writing, so that SQLite can roll back a hot journal first (as the
/// next writer would) -- a process killed mid-transaction leaves one.
inline std::string integrity_of(const std::string& db, bool recover = false) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open_v2(db.c_str(), &raw, recover ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY,
                          nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  std::string out{reinterpret_cast<const char*>(sqlite3_column_text(st, 0))};
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return out;
}

/// Returns the single integer `sql` selects from `db`.
inline int64_t select_int(const std::string& db, const std::string& sql) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  auto n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return n;
}

/// Parses a helper's acknowledgements, one "<event_id> <n>" per complete line.
inline std::map<int64_t, int64_t> parse_acks(const std::string& text) {
  std::map<int64_t, int64_t> out;
  for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    long long id = 0;
    long long n = 0;
    if (std::sscanf(text.c_str() + pos, "%lld %lld", &id, &n) == 2) out[id] = n;
  }
  return out;
}

} // namespace troupe_test
