#pragma once

// The typed interfaces of troupe's service actors: each lists every message the actor
// handles and the reply it gives, so a client's request is checked by the compiler (wrong
// arguments or a wrong reply type do not compile) and a typed server must implement all of
// it. A service is found as a `caf::actor` (the directory, messages/directory.hpp) and
// viewed through its interface with `caf::actor_cast<Interface>(a)`.
//
// Internal messages (a self-sent commit marker, a timer) are part of an interface too: a
// typed actor can only receive what its interface lists. They are marked internal in
// docs/protocols.md.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "troupe/messages/directory.hpp"
#include "troupe/messages/durable.hpp"
#include "troupe/messages/messaging.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe {

/// The storage actor (one per SQLite file): the event log, durable channels' rows and the
/// rate limiter's reservations. Every write is answered after the transaction holding it
/// has committed.
using storage_actor_type = caf::typed_actor<
    caf::replies_to<atoms::st_append_atom, std::string, std::string>::with<event_receipt>,
    caf::replies_to<atoms::st_append_many_atom, std::string,
                    payload_batch>::with<std::vector<event_receipt>>,
    caf::replies_to<atoms::st_chan_append_atom, channel_write>::with<channel_receipt>,
    caf::reacts_to<atoms::st_commit_atom>,
    caf::replies_to<atoms::st_read_atom, std::string, int64_t,
                    int64_t>::with<std::vector<event_record>>,
    caf::replies_to<atoms::st_chan_read_atom, std::string, int64_t,
                    int64_t>::with<std::vector<channel_event>>,
    caf::replies_to<atoms::st_chan_verify_atom, channel_receipt>::with<bool>,
    caf::replies_to<atoms::st_rate_acquire_atom, std::vector<rate_bucket>,
                    int64_t>::with<rate_attempt>,
    caf::replies_to<atoms::st_subscribe_atom, std::string, int64_t, caf::actor>::with<bool>,
    caf::replies_to<atoms::st_unsubscribe_atom, std::string, caf::actor>::with<bool>,
    caf::replies_to<atoms::st_pool_save_atom, std::string, std::vector<pool_row>,
                    int64_t>::with<uint64_t>,
    caf::replies_to<atoms::st_pool_load_atom, std::string>::with<std::vector<pool_row>>,
    caf::replies_to<atoms::st_metrics_atom>::with<storage_metrics>>;

/// The channel hub: durable channels' appends and reads, receipts, trigger bindings with
/// batch windows, session channels.
using channel_hub_type = caf::typed_actor<
    caf::replies_to<atoms::ch_append_atom, channel_write>::with<channel_receipt>,
    caf::replies_to<atoms::ch_events_atom, std::string, std::string, int64_t,
                    int64_t>::with<std::vector<channel_event>>,
    caf::replies_to<atoms::ch_verify_atom, channel_receipt>::with<bool>,
    caf::replies_to<atoms::ch_bind_atom, channel_binding>::with<uint64_t>,
    caf::replies_to<atoms::ch_unbind_atom, uint64_t>::with<bool>,
    caf::replies_to<atoms::ch_flush_atom>::with<uint64_t>,
    caf::reacts_to<atoms::ch_window_atom, uint64_t, std::string, uint64_t>,
    caf::reacts_to<atoms::ch_storage_atom, caf::actor>,
    caf::replies_to<atoms::ch_metrics_atom>::with<channel_metrics>>;

/// A shared cell, map or atomic counter (one actor each): versioned values, compare-and-set.
/// A cell or an atomic uses the empty key.
using shared_actor_type = caf::typed_actor<
    caf::replies_to<atoms::sh_get_atom, std::string>::with<versioned>,
    caf::replies_to<atoms::sh_set_atom, std::string, nlohmann::json>::with<versioned>,
    caf::replies_to<atoms::sh_cas_atom, std::string, nlohmann::json, uint64_t, bool,
                    nlohmann::json>::with<bool>,
    caf::replies_to<atoms::sh_del_atom, std::string>::with<bool>,
    caf::replies_to<atoms::sh_entries_atom>::with<nlohmann::json>,
    caf::replies_to<atoms::sh_add_atom, std::string, int64_t>::with<int64_t>,
    caf::replies_to<atoms::sh_cas_int_atom, std::string, int64_t, int64_t>::with<bool>,
    caf::replies_to<atoms::sh_metrics_atom>::with<shared_metrics>>;

/// A synchronisation primitive (mutex, rwlock, semaphore, gate: one FIFO permit engine); a
/// lane of the runtime's catalog is one too (a gate of the lane's width).
using sync_actor_type = caf::typed_actor<
    caf::replies_to<atoms::sy_acquire_atom, uint64_t, int64_t, bool, int64_t>::with<uint64_t>,
    caf::replies_to<atoms::sy_release_atom, uint64_t>::with<bool>,
    caf::reacts_to<atoms::sy_withdraw_atom, uint64_t>,
    caf::reacts_to<atoms::sy_timeout_atom, uint64_t>,
    caf::replies_to<atoms::sy_close_atom>::with<uint64_t>,
    caf::reacts_to<atoms::deadlock_atom>,
    caf::reacts_to<atoms::sy_reserve_atom, caf::actor_addr, bool>,
    caf::reacts_to<atoms::sy_ticket_atom, job_ticket_batch>,
    caf::reacts_to<atoms::sy_ticket_gone_atom, job_ticket_ref, uint64_t>,
    caf::replies_to<atoms::sy_drained_atom>::with<bool>,
    caf::replies_to<atoms::sy_metrics_atom>::with<sync_metrics>>;

/// A channel or a mailbox (one queue actor each). Its answers to a receive or a select
/// case are one-way messages to the asking task (`q_values`, `q_value`, `q_fail`,
/// `q_ready`), not replies. A credited post `(q_post, boxed<T>)` carries a value of any
/// type, so it is not listed: the actor takes it in its default handler, as it came.
using queue_actor_type = caf::typed_actor<
    caf::replies_to<atoms::q_send_atom, uint64_t, caf::message, uint8_t>::with<int64_t>,
    caf::reacts_to<atoms::q_posts_atom, std::vector<caf::message>>,
    caf::reacts_to<atoms::q_recv_atom, uint64_t, uint64_t, size_t, uint8_t, uint64_t>,
    caf::reacts_to<atoms::q_offer_atom, uint64_t, uint64_t, uint8_t>,
    caf::replies_to<atoms::q_take_atom, uint64_t>::with<value_batch>,
    caf::reacts_to<atoms::q_withdraw_atom, uint64_t>,
    caf::replies_to<atoms::q_return_atom, int64_t, value_batch, bool, uint64_t>::with<bool>,
    caf::replies_to<atoms::q_close_atom>::with<bool>,
    caf::replies_to<atoms::q_metrics_atom>::with<queue_metrics>,
    caf::reacts_to<atoms::deadlock_atom>>;

/// A worker pool: submits (a request, or a credited one-way post; credits come back with the
/// queue protocol's `q_return`, posts may come batched in `q_posts`), waits, cancels, views,
/// its workers' pulls and reports, runner scaling, and its own timers and flushes.
using pool_actor_type = caf::typed_actor<
    caf::replies_to<atoms::pool_submit_atom, pool_submission, bool>::with<pool_ack>,
    caf::reacts_to<atoms::pool_post_atom, uint64_t, pool_submission>,
    caf::reacts_to<atoms::pool_withdraw_atom>,
    caf::reacts_to<atoms::q_posts_atom, std::vector<caf::message>>,
    caf::replies_to<atoms::q_return_atom, int64_t, value_batch, bool, uint64_t>::with<bool>,
    caf::replies_to<atoms::pool_pull_atom, uint32_t>::with<pool_batch>,
    caf::reacts_to<atoms::pool_report_atom, uint32_t>,
    caf::replies_to<atoms::pool_await_atom, uint64_t>::with<pool_result_box>,
    caf::replies_to<atoms::pool_status_atom, uint64_t>::with<pool_task_snapshot>,
    caf::replies_to<atoms::pool_cancel_atom, uint64_t>::with<bool>,
    caf::replies_to<atoms::pool_stats_atom>::with<pool_snapshot>,
    caf::replies_to<atoms::pool_idle_atom>::with<pool_snapshot>,
    caf::replies_to<atoms::pool_close_atom>::with<bool>,
    caf::replies_to<atoms::pool_spec_atom>::with<pool_spec>,
    caf::replies_to<atoms::pool_scale_atom, int64_t>::with<runner_state>,
    caf::replies_to<atoms::pool_runners_atom>::with<runner_state>,
    caf::replies_to<atoms::pool_ready_atom>::with<bool>,
    caf::replies_to<atoms::pool_tasks_atom>::with<std::vector<pool_task_snapshot>>,
    caf::reacts_to<atoms::pool_tick_atom, uint64_t>,
    caf::reacts_to<atoms::pool_flush_atom>>;

/// The registry (one per runtime): named primitives, the deadlock sweep, and the service
/// directory (delegated to the runtime's provider).
using registry_type = caf::typed_actor<
    caf::replies_to<atoms::reg_open_atom, primitive_spec>::with<caf::actor>,
    caf::replies_to<atoms::reg_list_atom, primitive_kind>::with<std::vector<caf::actor>>,
    caf::reacts_to<atoms::deadlock_atom>,
    caf::replies_to<atoms::dir_find_atom, runtime_service, std::string, bool>::with<caf::actor>>;

} // namespace troupe
