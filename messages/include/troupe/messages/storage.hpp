#pragma once

// The protocol of the storage actor: one actor owns one SQLite file; every durable write in
// troupe is a message to it, answered only after the transaction holding it has committed.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/none.hpp>
#include <caf/sec.hpp>

#include "troupe/messages/pool.hpp"
#include <caf/meta/type_name.hpp>

namespace troupe {

/// What an append answers: the event's id (its cursor) and when it was recorded.
struct event_receipt {
  int64_t event_id = 0;
  int64_t at_ms = 0;
  friend bool operator==(const event_receipt&, const event_receipt&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, event_receipt& x) {
  return f(caf::meta::type_name("troupe.event_receipt"), x.event_id, x.at_ms);
}

/// One event of the log.
struct event_record {
  int64_t event_id = 0;
  std::string topic;
  int64_t at_ms = 0;
  /// The payload as JSON text.
  std::string payload;
  friend bool operator==(const event_record&, const event_record&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, event_record& x) {
  return f(caf::meta::type_name("troupe.event_record"), x.event_id, x.topic, x.at_ms, x.payload);
}

/// Several payloads (JSON texts) packed in one buffer: one allocation for a whole window of
/// appends instead of one per payload, on the writer's side and the storage actor's.
class payload_batch {
 public:
  /// Appends one payload.
  void push_back(std::string_view text) {
    data_.append(text);
    ends_.push_back(data_.size());
  }
  [[nodiscard]] size_t size() const noexcept { return ends_.size(); }
  [[nodiscard]] bool empty() const noexcept { return ends_.empty(); }
  [[nodiscard]] std::string_view operator[](size_t i) const noexcept {
    auto first = i == 0 ? size_t{0} : ends_[i - 1];
    return std::string_view{data_}.substr(first, ends_[i] - first);
  }
  void reserve(size_t payloads, size_t bytes) {
    ends_.reserve(payloads);
    data_.reserve(bytes);
  }

 private:
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, payload_batch& x) {
    // A batch from another node is checked as it loads: ends that run backwards or past
    // the text would make operator[] read out of bounds.
    auto check = caf::meta::load_callback([&]() -> caf::error {
      size_t prev = 0;
      for (auto end : x.ends_) {
        if (end < prev || end > x.data_.size()) return caf::sec::invalid_argument;
        prev = end;
      }
      return caf::none;
    });
    return f(caf::meta::type_name("troupe.payload_batch"), x.data_, x.ends_, check);
  }

  std::string data_;
  std::vector<uint64_t> ends_;
};

/// The event-log topic that receives the events of every supervisor the runtime starts
/// (`{supervisor, at_ms, kind, child, reason}`) while its storage is open.
constexpr const char* supervisor_lifecycle_topic = "supervisor.lifecycle";

/// The storage actor's counters (`st_metrics_atom`).
struct storage_metrics {
  uint64_t transactions = 0; ///< commits
  uint64_t rows = 0;         ///< rows written by them
  uint64_t largest_batch = 0;
  uint64_t failures = 0; ///< transactions rolled back (their writers got the error)
  int64_t schema_version = 0;
  friend bool operator==(const storage_metrics&, const storage_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, storage_metrics& x) {
  return f(caf::meta::type_name("troupe.storage_metrics"), x.transactions, x.rows, x.largest_batch,
           x.failures, x.schema_version);
}

/// Checks a topic: non-empty, at most 200 bytes, no empty `.`/`:`-separated segment
/// (`invalid_topic`).
[[nodiscard]] caf::error check_topic(const std::string& topic);

} // namespace troupe


namespace troupe::atoms {

/// `(st_append, topic, payload JSON text)` -> event_receipt | error, after commit.
using st_append_atom = caf::atom_constant<caf::atom("st_append")>;
/// `(st_append_many, topic, payload_batch)` -> vector<event_receipt> | error: several
/// appends in one message (one writer's window), each acknowledged only after its commit.
using st_append_many_atom = caf::atom_constant<caf::atom("st_appendn")>;
/// `(st_read, topic, int64 after_cursor, int64 limit)` -> vector<event_record>, oldest first.
using st_read_atom = caf::atom_constant<caf::atom("st_read")>;
/// `(st_subscribe, topic, int64 from_cursor, actor subscriber)` -> bool: the subscriber gets
/// `(st_event, event_record)` for every event after the cursor, backlog first, then live,
/// each once and in order. `(st_unsubscribe, topic, actor)` -> bool.
using st_subscribe_atom = caf::atom_constant<caf::atom("st_sub")>;
using st_unsubscribe_atom = caf::atom_constant<caf::atom("st_unsub")>;
using st_event_atom = caf::atom_constant<caf::atom("st_event")>;
/// To a subscriber: `(st_ended, topic, error)`: the storage it subscribed through went away
/// (another node's storage whose node went down or left); no event follows.
using st_ended_atom = caf::atom_constant<caf::atom("st_ended")>;
/// `(st_metrics)` -> storage_metrics.
using st_metrics_atom = caf::atom_constant<caf::atom("st_metrics")>;
/// `(st_pool_save, std::string pool_id, std::vector<pool_row>, int64 keep)` -> uint64 rows,
/// after commit: upserts a durable pool's records; `keep` > 0 also deletes the terminal
/// records of that pool past the newest `keep` (compaction).
using st_pool_save_atom = caf::atom_constant<caf::atom("st_psave")>;
/// `(st_pool_load, std::string pool_id)` -> std::vector<pool_row>: every record of a
/// durable pool, by task id.
using st_pool_load_atom = caf::atom_constant<caf::atom("st_pload")>;
/// Internal: closes the current group of writes (`st_commit`).
using st_commit_atom = caf::atom_constant<caf::atom("st_commit")>;

} // namespace troupe::atoms
