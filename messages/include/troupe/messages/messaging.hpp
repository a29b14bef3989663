#pragma once

// The protocols of troupe's messaging and shared-state primitives: channels and mailboxes
// (one queue actor serves both), the registry of named primitives, shared cells / maps /
// atomics, and the FIFO synchronisation primitives. Every primitive is an actor; a wait is
// a parked response promise.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>
#include <nlohmann/json.hpp>

#include "troupe/messages/json.hpp"
#include "troupe/messages/pool.hpp"
#include "troupe/messages/types.hpp"

namespace troupe {

/// Where a named mailbox or shared value lives: the same name in two scopes is two objects.
enum class scope_kind : uint8_t {
  task,       ///< private to one task (keyed by its id); dropped when the task ends
  task_group, ///< shared by the siblings of one group (keyed by the group id)
  process,    ///< one per runtime
  tenant,     ///< one per tenant (`tenant_id` required)
};

/// Returns "task", "task_group", "process" or "tenant".
std::string_view to_string(scope_kind x) noexcept;

/// Parses a scope name; nothing for an unknown one.
std::optional<scope_kind> parse_scope(std::string_view x) noexcept;

/// The counters of one channel or mailbox (`q_metrics_atom`).
struct queue_metrics {
  std::string name;
  int64_t depth = 0;         ///< values buffered now
  int64_t capacity = 0;      ///< the most values it buffers
  uint64_t sent = 0;         ///< values accepted
  uint64_t received = 0;     ///< values handed to receivers
  uint64_t failed_sends = 0; ///< sends refused (closed, wrong type)
  bool closed = false;
  uint64_t waiting_senders = 0;   ///< senders parked while full
  uint64_t waiting_receivers = 0; ///< receivers (and select cases) parked while empty
  /// Values handed to receivers beyond what their receives consumed (a receive batch): they
  /// count against the capacity with `depth`, so `depth + prefetched <= capacity`.
  int64_t prefetched = 0;
  /// Of `sent`, values a sender handed straight to a waiting receiver (one message instead
  /// of a hop through the queue actor; see docs/messaging.md).
  uint64_t direct = 0;
  friend bool operator==(const queue_metrics&, const queue_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, queue_metrics& x) {
  return f(caf::meta::type_name("troupe.queue_metrics"), x.name, x.depth, x.capacity, x.sent,
           x.received, x.failed_sends, x.closed, x.waiting_senders, x.waiting_receivers,
           x.prefetched, x.direct);
}

/// The counters of one shared cell, map or atomic (`sh_metrics_atom`).
struct shared_metrics {
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t cas_successes = 0;
  uint64_t cas_failures = 0;
  /// CAS calls whose snapshot version was older than the current one.
  uint64_t stale_reads = 0;
  /// The version now: it grows by one with every write.
  uint64_t version = 0;
  friend bool operator==(const shared_metrics&, const shared_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shared_metrics& x) {
  return f(caf::meta::type_name("troupe.shared_metrics"), x.reads, x.writes, x.cas_successes,
           x.cas_failures, x.stale_reads, x.version);
}

/// A value with the version it had when read (the version of a missing key is 0).
struct versioned {
  nlohmann::json value;
  uint64_t version = 0;
  bool present = false;
  friend bool operator==(const versioned&, const versioned&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, versioned& x) {
  return f(caf::meta::type_name("troupe.versioned"), x.value, x.version, x.present);
}

/// The synchronisation primitive kinds.
enum class sync_kind : uint8_t { mutex, rwlock, semaphore, gate };

/// Returns "mutex", "rwlock", "semaphore" or "gate".
std::string_view to_string(sync_kind x) noexcept;

/// The counters of one synchronisation primitive (`sy_metrics_atom`).
struct sync_metrics {
  sync_kind kind = sync_kind::mutex;
  std::string key;
  /// Permits taken into use (a grant whose acquirer gave up before it arrived is not one).
  uint64_t acquisitions = 0;
  uint64_t timeouts = 0;
  /// Waits given up (and grants taken back unused, see `acquisitions`).
  uint64_t cancellations = 0;
  uint64_t releases = 0;
  int64_t held_now = 0;    ///< permits held now (units for a weighted semaphore)
  int64_t queue_depth = 0; ///< waiters now
  int64_t max_queue_depth = 0;
  double total_wait_ms = 0; ///< summed over acquisitions (granted or timed out)
  double total_held_ms = 0; ///< summed over releases
  friend bool operator==(const sync_metrics&, const sync_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sync_metrics& x) {
  return f(caf::meta::type_name("troupe.sync_metrics"), x.kind, x.key, x.acquisitions, x.timeouts,
           x.cancellations, x.releases, x.held_now, x.queue_depth, x.max_queue_depth,
           x.total_wait_ms, x.total_held_ms);
}

/// Values a channel or mailbox hands over (or gets back), each with the sequence number the
/// queue gave it on arrival: a value given back goes exactly where it was, so order holds
/// whatever comes back when.
struct value_batch {
  /// The sequence numbers: `first`, `first + 1`, ... unless `seqs` lists them (a batch
  /// with gaps), so the common batch carries no second vector.
  uint64_t first = 0;
  std::vector<uint64_t> seqs;
  std::vector<caf::message> values;
  [[nodiscard]] uint64_t seq_at(size_t i) const noexcept {
    return seqs.empty() ? first + i : seqs[i];
  }
  /// Appends a value with its sequence number.
  void add(uint64_t seq, caf::message m) {
    if (values.empty()) {
      first = seq;
    } else if (seqs.empty() && seq != first + values.size()) {
      for (size_t i = 0; i < values.size(); ++i) // a gap: list them all from now on
        seqs.push_back(first + i);
    }
    if (!seqs.empty()) seqs.push_back(seq);
    values.push_back(std::move(m));
  }
  [[nodiscard]] size_t size() const noexcept { return values.size(); }
  [[nodiscard]] bool empty() const noexcept { return values.empty(); }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, value_batch& x) {
  // From another node: the listed sequence numbers must match the values one to one.
  auto check = caf::meta::load_callback([&]() -> caf::error {
    if (!x.seqs.empty() && x.seqs.size() != x.values.size()) return caf::sec::invalid_argument;
    return caf::none;
  });
  return f(caf::meta::type_name("troupe.value_batch"), x.first, x.seqs, x.values, check);
}

/// What a primitive's registry entry is.
enum class primitive_kind : uint8_t { channel, mailbox, cell, map, atomic, sync, pool };

/// Asks the registry to open (find or create) a primitive:
/// `(reg_open_atom, primitive_spec)` -> `caf::actor` | error.
struct primitive_spec {
  primitive_kind kind = primitive_kind::channel;
  /// The full key: kind, scope and name joined (see the registry).
  std::string key;
  /// The display name (metrics).
  std::string name;
  /// The value type of a typed channel (0: any).
  size_t type_hash = 0;
  std::string type_name;
  int64_t capacity = 0;
  /// sync: the kind; cell/map/atomic: unused.
  sync_kind sync = sync_kind::mutex;
  /// An owner whose end drops the entry (task scope); may be empty.
  caf::actor_addr owner;
  /// Create when absent (open) or only find (lookup).
  bool create = true;
  /// cell/map/atomic: the value the creation starts with (the first opener's wins).
  std::optional<nlohmann::json> initial;
  /// pool: its spec and its deterministic id (`pool_id_of`).
  std::optional<pool_spec> pool;
  std::string pool_id;
};

namespace detail {
struct job_ticket;
} // namespace detail

/// A job queued on its lane before its task exists (`sy_ticket`): what spawning the task
/// takes, shared by the submitter, the lane and the job's handle. Local-only.
struct job_ticket_ref {
  std::shared_ptr<detail::job_ticket> ticket;
};

/// Tickets for one lane in submission order: what one submitter queued on that lane since it
/// last sent any (one message per run of its body, not one per job).
struct job_ticket_batch {
  std::vector<std::shared_ptr<detail::job_ticket>> tickets;
};

} // namespace troupe

// The registry is one per runtime: its requests never leave the process.
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::primitive_spec)
// A ticket holds the job's body and its submitter's task-local values.
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::job_ticket_ref)
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::job_ticket_batch)

namespace troupe::atoms {

// -- channels and mailboxes (one queue actor) ---------------------------------------------

// A value travels as a message whose last element is the value (a `boxed<T>`); the queue
// stores such messages as they arrive, so a credited send costs one message allocation.

/// `(q_send, seq, message value, uint8 flags)` -> int64 credits granted | error:
/// answered when the value is buffered (at once while there is room). Flags: 1 = the
/// sender takes credits, 2 = the wait is bounded (timeout or deadline).
using q_send_atom = caf::atom_constant<caf::atom("q_send")>;
/// Flags of q_send / q_recv / q_offer (one byte).
/// q_recv, q_offer: park while the request cannot be served (a receive, a select case).
constexpr uint8_t q_flag_wait = 1;
/// q_send: the sender takes credits (room reserved for its one-way posts).
constexpr uint8_t q_flag_credit = 1;
/// All: a timeout or deadline ends the wait anyway (the deadlock detector ignores it).
constexpr uint8_t q_flag_bounded = 2;
/// `(q_post, boxed value)`, no reply: a send paid for by a credit (room reserved).
using q_post_atom = caf::atom_constant<caf::atom("q_post")>;
/// `(q_posts, vector<message>)`, no reply: several credited sends of one task, in order.
/// A post without credit (they were revoked meanwhile) is still accepted: it was sent.
using q_posts_atom = caf::atom_constant<caf::atom("q_posts")>;
/// `(q_recv, seq, uint64 max, size_t type_hash, uint8 flags, uint64 consumed)`: a grant of
/// up to `max` (`consumed`: the values of this queue the task has consumed in all)
/// values, answered by one-way `(q_values, seq, value_batch)` messages as values come (a
/// standing grant: the receiver asks again only once it is used up; empty when not waiting
/// and nothing is buffered) or `(q_fail, seq, error)`. Flags: 1 = wait while empty,
/// 2 = bounded. A new `q_recv` of the same task replaces its grant. One-way messages
/// instead of a request: no response handler per receive.
using q_recv_atom = caf::atom_constant<caf::atom("q_recv")>;
using q_values_atom = caf::atom_constant<caf::atom("q_values")>;
/// `(q_value, seq, uint64 value_seq, message value)`: `q_values` for one value (the common
/// case of a waiting receiver), without a batch to allocate. A channel's sender handing a
/// value straight to a waiting receiver (its slot armed, see queue_slot.hpp) sends it as
/// `(q_value, seq, uint64 value_seq, boxed<T>)`, sender the queue: the value is the last
/// element, as in every queue value, and the message is its only allocation.
using q_value_atom = caf::atom_constant<caf::atom("q_value")>;
using q_fail_atom = caf::atom_constant<caf::atom("q_fail")>;
/// `(q_withdraw, seq)`, no reply: the sender's wait `seq` (receive, send, select) is over.
using q_withdraw_atom = caf::atom_constant<caf::atom("q_withdraw")>;
/// `(q_close)` -> bool (true when this call closed it).
using q_close_atom = caf::atom_constant<caf::atom("q_close")>;
/// queue -> task: `(q_revoke, queue actor id)` -> int64 unused credits.
using q_revoke_atom = caf::atom_constant<caf::atom("q_revoke")>;
/// queue -> task: `(q_held, queue actor id)` -> `(uint64 consumed, int64 holds)`: how many
/// values of that queue the task has consumed in all, and how many it holds now (taken, not
/// consumed). A task that holds some asks again (`q_recv`) once it has consumed them,
/// instead of waiting on its standing grant: the queue counts values handed over and not
/// consumed against its capacity.
using q_held_atom = caf::atom_constant<caf::atom("q_held")>;
/// task -> queue: `(q_return, int64 credits, value_batch values, bool end_grant, uint64
/// consumed)`: gives back unused credits and values taken but not consumed (each goes back
/// to its place by sequence number), and with `end_grant` ends the task's receive grant;
/// `consumed`: the values of this queue the task has consumed in all (0: not said). As a request (a task that
/// ends) it is answered with `true` once done, so that nothing handed over meanwhile is lost.
using q_return_atom = caf::atom_constant<caf::atom("q_return")>;
/// task -> queue: `(q_offer, select_seq, uint64 index, uint8 flags)`: a select case (flags:
/// q_flag_wait, q_flag_bounded).
/// queue -> task: `(q_ready, select_seq, uint64 index, uint8 status)` (see select_status).
using q_offer_atom = caf::atom_constant<caf::atom("q_offer")>;
using q_ready_atom = caf::atom_constant<caf::atom("q_ready")>;
/// `(q_take, select_seq)` -> value_batch: takes the value reserved for the select.
using q_take_atom = caf::atom_constant<caf::atom("q_take")>;
/// `(q_metrics)` -> queue_metrics.
using q_metrics_atom = caf::atom_constant<caf::atom("q_metrics")>;
/// detector -> queue: `(deadlock_atom)`: fail every unbounded wait with `deadlock`.
using deadlock_atom = caf::atom_constant<caf::atom("deadlock")>;

/// The status of a select case in `q_ready`.
enum select_status : uint8_t {
  select_ready = 0,     ///< a value is reserved for the select
  select_closed = 1,    ///< the channel is closed and drained
  select_empty = 2,     ///< nothing now (non-blocking select)
  select_deadlock = 3,  ///< the deadlock detector failed the wait
  select_wrong_type = 4 ///< the head value is not of the expected type
};

// -- registry -----------------------------------------------------------------------------

/// `(reg_open, primitive_spec)` -> caf::actor | error (not_found when `create` is false).
using reg_open_atom = caf::atom_constant<caf::atom("reg_open")>;
/// `(reg_list, primitive_kind)` -> vector<caf::actor>: every live primitive of a kind.
using reg_list_atom = caf::atom_constant<caf::atom("reg_list")>;

// -- shared cells, maps, atomics ----------------------------------------------------------

/// `(sh_get, key)` -> versioned.
using sh_get_atom = caf::atom_constant<caf::atom("sh_get")>;
/// `(sh_set, key, json)` -> versioned (the previous value).
using sh_set_atom = caf::atom_constant<caf::atom("sh_set")>;
/// `(sh_cas, key, json expected, uint64 version, bool by_version, json value)` -> bool:
/// with `by_version`, the write happens when the key's version is still `version`; else
/// when its value equals `expected`.
using sh_cas_atom = caf::atom_constant<caf::atom("sh_cas")>;
/// `(sh_del, key)` -> bool (whether it existed).
using sh_del_atom = caf::atom_constant<caf::atom("sh_del")>;
/// `(sh_entries)` -> json object of every key.
using sh_entries_atom = caf::atom_constant<caf::atom("sh_entries")>;
/// `(sh_add, key, int64 delta)` -> int64 previous (atomics).
using sh_add_atom = caf::atom_constant<caf::atom("sh_add")>;
/// `(sh_casi, key, int64 expected, int64 desired)` -> bool (atomics: absent counts as 0;
/// `wrong_type` when the key holds no integer).
using sh_cas_int_atom = caf::atom_constant<caf::atom("sh_casi")>;
/// `(sh_metrics)` -> shared_metrics.
using sh_metrics_atom = caf::atom_constant<caf::atom("sh_metrics")>;

// -- synchronisation ----------------------------------------------------------------------

/// `(sy_acquire, seq, int64 units, bool bounded, int64 timeout_ns (<0: none))`
/// -> uint64 permit id (0: timed out) | error. `bounded`: the acquirer has a deadline, so
/// its wait ends anyway and is never taken for a deadlock (nor is one with a timeout).
/// An untimed wait that would close a wait-for cycle fails with `deadlock`.
using sy_acquire_atom = caf::atom_constant<caf::atom("sy_acq")>;
/// `(sy_release, permit id)` -> bool, also sent without awaiting the reply.
using sy_release_atom = caf::atom_constant<caf::atom("sy_rel")>;
/// `(sy_withdraw, seq)`, no reply: the acquirer no longer waits.
using sy_withdraw_atom = caf::atom_constant<caf::atom("sy_wdraw")>;
/// `(sy_metrics)` -> sync_metrics.
using sy_metrics_atom = caf::atom_constant<caf::atom("sy_metrics")>;
/// `(sy_timeout, uint64 waiter_id)`: internal timer of an acquire with a timeout (the id the
/// sync actor gave the waiter, not the acquirer's seq).
using sy_timeout_atom = caf::atom_constant<caf::atom("sy_tmo")>;
/// `(sy_close)` -> uint64: answers every waiter `cancelled` (the count) and refuses later
/// acquires the same way; holders keep their permits (a lane at the runtime's stop).
using sy_close_atom = caf::atom_constant<caf::atom("sy_close")>;
/// `(sy_reserve, actor_addr who, bool start)`, no reply: queues a one-permit wait for `who`
/// now (a job's submitter, before the job starts), so admission follows submission order.
/// `start` false: `who`'s next acquire claims it (answered at once when it was granted
/// meanwhile). `start` true: `who` is an idle job task, and the grant starts it:
/// `(start_atom, uint64 permit)` goes to it, so admission costs no acquire (a closed lane
/// sends `(start_atom, 0)`: the task starts and its acquire meets the refusal).
using sy_reserve_atom = caf::atom_constant<caf::atom("sy_resv")>;
/// `(sy_ticket, job_ticket_batch)`, no reply: queues a one-permit wait for each job whose
/// task does not exist yet (jobs submitted from a task, in submission order; the submitter
/// sends what it queued when its body suspends, or before anything else it sends, so a
/// submission it causes elsewhere comes after). Its grant admits a ticket: the task
/// is spawned, holding the permit, once its spawner's body has suspended too (by whichever
/// of the lane and the spawner comes second). A ticket withdrawn meanwhile (a cancel) gets
/// no task; its grant goes back unused. A closed lane fails the ticket's job.
using sy_ticket_atom = caf::atom_constant<caf::atom("sy_ticket")>;
/// `(sy_ticket_gone, job_ticket_ref, uint64 permit)`, no reply: the ticket was withdrawn
/// (cancelled) before its task existed; `permit` is the grant it held (0: it was queued).
/// Also from a job task that ends before its body ran, giving its permit back: the ticket
/// may be gone then (null; its owner ended), and the permit comes back unused all the same.
using sy_ticket_gone_atom = caf::atom_constant<caf::atom("sy_tgone")>;
/// `(sy_drained)` -> bool: answers once no permit is held (at once when none is).
using sy_drained_atom = caf::atom_constant<caf::atom("sy_drained")>;

} // namespace troupe::atoms
