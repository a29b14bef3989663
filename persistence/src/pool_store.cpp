#include "pool_store.hpp"

#include "schema.hpp"

namespace troupe::detail {

namespace {

void bind_text(sqlite3_stmt* st, int i, const std::string& x, int& rc) {
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, i, x.data(), static_cast<int>(x.size()), SQLITE_STATIC);
}

void bind_int(sqlite3_stmt* st, int i, int64_t x, int& rc) {
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, i, x);
}

} // namespace

caf::error pool_store::prepare(sqlite3* db) {
  std::pair<std::unique_ptr<statement>*, const char*> all[] = {
      {&upsert_, sql_pool_upsert}, {&compact_, sql_pool_compact}, {&load_, sql_pool_load}};
  for (auto& [st, sql] : all) {
    *st = std::make_unique<statement>();
    if (auto err = (*st)->prepare(db, sql)) return err;
  }
  return {};
}

caf::error pool_store::save(sqlite3* db, const std::string& pool_id,
                            const std::vector<pool_row>& rows, int64_t keep) {
  auto st = upsert_->get();
  for (auto& r : rows) { // (rows with `encode` were encoded when the storage accepted them)
    sqlite3_reset(st);
    int rc = SQLITE_OK;
    bind_text(st, 1, pool_id, rc);
    bind_int(st, 2, static_cast<int64_t>(r.task_id), rc);
    bind_int(st, 3, static_cast<int64_t>(r.status), rc);
    bind_text(st, 4, r.record, rc);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return sqlite_error(db, rc, "pool save");
  }
  if (keep > 0) {
    auto c = compact_->get();
    sqlite3_reset(c);
    int rc = SQLITE_OK;
    bind_text(c, 1, pool_id, rc);
    bind_int(c, 2, keep, rc);
    if (rc == SQLITE_OK) rc = sqlite3_step(c);
    sqlite3_reset(c);
    if (rc != SQLITE_DONE) return sqlite_error(db, rc, "pool compaction");
  }
  return {};
}

caf::error pool_store::load(sqlite3* db, const std::string& pool_id, std::vector<pool_row>& out) {
  auto st = load_->get();
  sqlite3_reset(st);
  int rc = SQLITE_OK;
  bind_text(st, 1, pool_id, rc);
  if (rc != SQLITE_OK) return sqlite_error(db, rc, "pool load");
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    pool_row r;
    r.task_id = static_cast<uint64_t>(sqlite3_column_int64(st, 0));
    r.status = static_cast<pool_task_status>(sqlite3_column_int64(st, 1));
    auto text = reinterpret_cast<const char*>(sqlite3_column_text(st, 2));
    if (text != nullptr) r.record.assign(text, static_cast<size_t>(sqlite3_column_bytes(st, 2)));
    out.push_back(std::move(r));
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) return sqlite_error(db, rc, "pool load");
  return {};
}

void pool_store::reset() noexcept {
  upsert_.reset();
  compact_.reset();
  load_.reset();
}

} // namespace troupe::detail
