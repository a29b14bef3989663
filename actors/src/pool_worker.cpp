// A pool worker: a task whose loop body takes a batch of jobs from its pool and runs them
// one by one as sub-routines of its own task, leaving each outcome in the job's cell.

#include "pool_actor.hpp"

#include "troupe/messages/errc.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

caf::error pool_deadline_error() {
  return make_error(errc::deadline_exceeded, "deadline",
                    "the submitter's deadline passed before the task finished");
}

/// The loop body of a worker: pull a batch, run its jobs in order, pull again.
task<void> pool_worker_loop(context& cx, caf::actor pool, uint32_t slot) {
  auto* self = access::impl(cx);
  constexpr int64_t report_every_ns = 1'000'000; // a long batch reports every millisecond
  for (;;) {
    auto batch = co_await cx.request<pool_batch>(pool, pool_pull_atom::value, slot);
    if (!batch) co_return; // the pool is gone or stops this worker
    // One clock read per job: a job starts when the one before it ended.
    auto now_ns = cx.now().time_since_epoch().count();
    auto last_report = now_ns;
    for (size_t i = 0; i < batch->jobs.size(); ++i) {
      auto& a = batch->jobs[i];
      auto& cell = *a.cell;
      uint8_t expected = pool_job_cell::queued;
      if (!cell.state.compare_exchange_strong(expected, pool_job_cell::started))
        continue; // withdrawn by the pool (a cancel, a deadline): it answered for it
      cell.started_ns = now_ns;
      if (a.deadline_ns >= 0 && cell.started_ns >= a.deadline_ns) {
        cell.out.err = pool_deadline_error();
      } else {
        self->locals(std::static_pointer_cast<const task_locals::element_type>(a.locals));
        if (a.deadline_ns >= 0)
          self->deadline(clock::time_point{clock::duration{a.deadline_ns}});
        else
          self->deadline(std::nullopt);
        try {
          cell.out = co_await a.body->run(cx);
        } catch (const task_cancelled&) {
          throw; // the worker itself is being stopped (the runtime stops)
        } catch (...) {
          cell.out.err = error_from_current_exception("body");
        }
      }
      cell.ended_ns = now_ns = cx.now().time_since_epoch().count();
      a.body.reset(); // what the body captured goes now, not with the batch
      a.locals.reset();
      if (self->locals()) self->locals(task_locals{}); // the submitter's values go with its job
      cell.state.store(pool_job_cell::finished, std::memory_order_release);
      if (i + 1 < batch->jobs.size() && cell.ended_ns - last_report >= report_every_ns) {
        last_report = cell.ended_ns;
        self->send(pool, pool_report_atom::value, slot);
      }
    }
  }
}

} // namespace troupe::detail
