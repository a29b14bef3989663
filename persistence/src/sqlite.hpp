#pragma once

// A thin RAII layer over SQLite for the storage actor: errors mapped to troupe's codes, a
// prepared statement that finalises itself, a database handle that closes itself.

#include <memory>
#include <string>

#include <caf/error.hpp>
#include <sqlite3.h>

#include "troupe/messages/errc.hpp"

namespace troupe::detail {

inline caf::error sqlite_error(sqlite3* db, int rc, const std::string& what) {
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

inline caf::error exec(sqlite3* db, const char* sql, const char* what) {
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

} // namespace troupe::detail
