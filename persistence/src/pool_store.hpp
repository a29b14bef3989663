#pragma once

// The durable pools' rows in the storage actor's database: the statements and the two
// operations (a save inside the group's transaction, a load).

#include <memory>
#include <string>
#include <vector>

#include <caf/error.hpp>

#include "sqlite.hpp"
#include "troupe/messages/pool.hpp"

namespace troupe::detail {

/// A pool's prepared statements.
class pool_store {
 public:
  /// Prepares the statements on `db`.
  caf::error prepare(sqlite3* db);
  /// Upserts `rows` of pool `pool_id`, then keeps its newest `keep` terminal records when
  /// `keep` > 0. Runs inside the caller's transaction.
  caf::error save(sqlite3* db, const std::string& pool_id, const std::vector<pool_row>& rows,
                  int64_t keep);
  /// Reads every record of pool `pool_id`, by task id.
  caf::error load(sqlite3* db, const std::string& pool_id, std::vector<pool_row>& out);
  /// Finalises the statements (before the database closes).
  void reset() noexcept;

 private:
  std::unique_ptr<statement> upsert_;
  std::unique_ptr<statement> compact_;
  std::unique_ptr<statement> load_;
};

} // namespace troupe::detail
