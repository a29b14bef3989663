// troupe's scheduler (runtime/src/scheduler.cpp) under plain CAF programs: bursts finish and
// spread over the workers, chains stay on one worker, work from outside threads is never lost
// (no wake-up missed: the safety timeout never has to rescue a sleeping worker), systems start
// and stop cleanly with work in flight. Real time, 2 threads.

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "troupe/runtime/runtime.hpp"
#include "troupe/runtime/scheduler.hpp"
#include "troupe/actors/detail/actor_slab.hpp"
#include "troupe/actors/detail/recycler.hpp"

namespace {

using t_go = caf::atom_constant<caf::atom("t_go")>;
using t_hi = caf::atom_constant<caf::atom("t_hi")>;
using t_ping = caf::atom_constant<caf::atom("t_ping")>;
using t_count = caf::atom_constant<caf::atom("t_count")>;

struct troupe_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  explicit troupe_system(size_t threads) {
    troupe::load_troupe_scheduler(cfg);
    cfg.set("scheduler.max-threads", static_cast<caf::config_value::integer>(threads));
    cfg.set("scheduler.max-throughput", caf::config_value::integer{100});
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  troupe::scheduler_counters counters() {
    troupe::scheduler_counters c;
    REQUIRE(troupe::read_scheduler_counters(*sys, c));
    return c;
  }
};

/// The stealing counters from `before` to `after`, for a failing check's message.
std::string steal_counts(const troupe::scheduler_counters& before,
                         const troupe::scheduler_counters& after) {
  return "steals " + std::to_string(after.steals - before.steals) + " stolen " +
         std::to_string(after.stolen - before.stolen) + " probes " +
         std::to_string(after.probes - before.probes) + " cheap " +
         std::to_string(after.cheap_probes - before.cheap_probes);
}

struct countdown {
  long left = 0;
  caf::response_promise done;
};

caf::behavior hello_and_quit(caf::event_based_actor* self, caf::actor parent) {
  self->send(parent, t_hi::value);
  self->quit();
  return {};
}

/// Spawns n children that each say hello once; answers go(n) when all have.
caf::behavior burst_parent(caf::stateful_actor<countdown>* self) {
  return {[self](t_go, long n) {
            self->state.left = n;
            self->state.done = self->make_response_promise();
            for (long i = 0; i < n; ++i) self->spawn(hello_and_quit, caf::actor{self});
            return self->state.done;
          },
          [self](t_hi) {
            if (--self->state.left == 0) self->state.done.deliver(true);
          }};
}

/// Sends `a` (t_go, n, more...), waits for its answer (at most 120 s), then stops it.
template <class... Ts>
bool ask_go(caf::actor_system& sys, const caf::actor& a, long n, Ts... more) {
  caf::scoped_actor self{sys};
  bool ok = false;
  self->request(a, std::chrono::seconds(120), t_go::value, n, more...)
      .receive([&](bool) { ok = true; }, [&](caf::error&) { ok = false; });
  self->send_exit(a, caf::exit_reason::user_shutdown);
  return ok;
}

} // namespace

TEST_CASE("troupe's scheduler: a burst of 50k spawned actors finishes, and the idle worker "
          "steals from the busy one") {
  troupe_system ts{2};
  REQUIRE(ts.sys->scheduler().num_workers() == 2);
  auto parent = ts.sys->spawn(burst_parent);
  CHECK(ask_go(*ts.sys, parent, 50'000));
  auto c = ts.counters();
  INFO("slot " << c.slot_runs << " local " << c.local_runs << " inject " << c.inject_runs << " steals " << c.steals << " parks " << c.parks << " wakes " << c.wakes);
  CHECK(c.steals >= 1);
  CHECK(c.stolen >= c.steals);
  CHECK(c.rescued == 0);
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TROUPE_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TROUPE_TEST_SANITIZED 1
#endif

namespace {

void spin_for(std::chrono::microseconds d) {
  auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

/// Spawns n children (each spins `child_us`, says hello and quits), then keeps its worker
/// busy for `busy_ms` in the same handler: the children wait in that worker's queue, where
/// only the other worker can take them.
caf::behavior spawn_then_spin(caf::stateful_actor<countdown>* self) {
  return {[self](t_go, long n, int child_us, int busy_ms) {
            self->state.left = n;
            self->state.done = self->make_response_promise();
            for (long i = 0; i < n; ++i)
              self->spawn([child_us](caf::event_based_actor* kid, caf::actor parent) -> caf::behavior {
                if (child_us > 0) spin_for(std::chrono::microseconds(child_us));
                kid->send(parent, t_hi::value);
                kid->quit();
                return {};
              }, caf::actor{self});
            spin_for(std::chrono::milliseconds(busy_ms));
            return self->state.done;
          },
          [self](t_hi) {
            if (--self->state.left == 0) self->state.done.deliver(true);
          }};
}

bool ask_spawn_then_spin(caf::actor_system& sys, long n, int child_us, int busy_ms) {
  return ask_go(sys, sys.spawn(spawn_then_spin), n, child_us, busy_ms);
}

} // namespace

TEST_CASE("troupe's scheduler: a backlog of cheap just-spawned actors behind a running job is "
          "stolen in bulk, without a back-off") {
  // 20k trivial children wait behind a handler that runs 30 ms. A queue that long is a
  // backlog (burst_backlog): the idle worker takes half of it instead of leaving it to the
  // spawner's worker. (With every cheap fresh steal on trial, spawn_await ran at 0.65x on
  // two workers.)
  troupe_system ts{2};
  constexpr long n = 20'000;
  auto before = ts.counters();
  CHECK(ask_spawn_then_spin(*ts.sys, n, 0, 30));
  auto after = ts.counters();
  INFO(steal_counts(before, after));
  CHECK(after.steals > before.steals);
  CHECK(after.probes - before.probes >= after.steals - before.steals - 1); // each steal probed
  // (Steals from the queue's last few hundred jobs are on trial again and may back off.)
  CHECK(after.stolen - before.stolen >= static_cast<uint64_t>(n / 4));
  CHECK(after.rescued == 0);
}

namespace {

struct window_state {
  long total = 0;
  long started = 0;
  long left = 0;
  caf::response_promise done;
};

/// Keeps `window` trivial children in flight until n have said hello (a dispatcher's loop,
/// as parallel_each with a small max_concurrent).
caf::behavior window_dispatcher(caf::stateful_actor<window_state>* self) {
  return {[self](t_go, long n, long window) {
            auto& st = self->state;
            st.total = st.left = n;
            st.done = self->make_response_promise();
            for (; st.started < std::min(n, window); ++st.started)
              self->spawn(hello_and_quit, caf::actor{self});
            return st.done;
          },
          [self](t_hi) {
            auto& st = self->state;
            if (st.started < st.total) {
              ++st.started;
              self->spawn(hello_and_quit, caf::actor{self});
            }
            if (--st.left == 0) st.done.deliver(true);
          }};
}

} // namespace

TEST_CASE("troupe's scheduler: a dispatcher keeping a few cheap children in flight stays on "
          "one worker: steals from its short queue are on trial and back off") {
  // A window of 8 children, 20k in all: stealing them moves each cheap child to the other
  // core and its hello back (a chain, fastest on one core: parallel_each ran 1.6x faster
  // once steals from a short queue were on trial). The idle worker takes a few, finds them
  // cheap, and waits (50 us, doubling up to 2 ms) before it tries again.
  troupe_system ts{2};
  constexpr long n = 20'000;
  auto before = ts.counters();
  CHECK(ask_go(*ts.sys, ts.sys->spawn(window_dispatcher), n, long{8}));
  auto after = ts.counters();
  INFO(steal_counts(before, after));
  CHECK(after.rescued == 0);
#ifndef TROUPE_TEST_SANITIZED
  // (Under a sanitizer a trivial actor's run takes several microseconds: the jobs are not
  // cheap there, and are stolen as dear ones.)
  CHECK(after.cheap_probes > before.cheap_probes);
  CHECK(after.stolen - before.stolen < static_cast<uint64_t>(n / 4));
#endif
}

TEST_CASE("troupe's scheduler: cheap messages to actors that ran before, queued behind a "
          "running job, are stolen in bulk") {
  // 20k actors that have run once (idle now) each get a message from one handler that then
  // runs 30 ms: moving them pays (their memory is not the sender's, and nothing comes back
  // to it but a count), so the idle worker takes them half a queue at a time.
  troupe_system ts{2};
  constexpr long n = 20'000;
  auto seen = std::make_shared<std::atomic<long>>(0);
  std::vector<caf::actor> idle;
  idle.reserve(n);
  for (long i = 0; i < n; ++i)
    idle.push_back(ts.sys->spawn([seen](caf::event_based_actor*) -> caf::behavior {
      return {[seen](t_hi) { seen->fetch_add(1); }};
    }));
  for (auto& a : idle) caf::anon_send(a, t_hi::value); // each runs once
  for (int i = 0; i < 6000 && seen->load() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(seen->load() == n);
  auto sender = ts.sys->spawn([&idle](caf::event_based_actor* self) -> caf::behavior {
    return {[self, &idle](t_go) {
      for (auto& a : idle) self->send(a, t_hi::value);
      spin_for(std::chrono::milliseconds(30));
      return true;
    }};
  });
  auto before = ts.counters();
  caf::scoped_actor self{*ts.sys};
  self->request(sender, std::chrono::seconds(60), t_go::value).receive([](bool) {}, [](caf::error&) {});
  for (int i = 0; i < 6000 && seen->load() < 2 * n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(seen->load() == 2 * n);
  auto after = ts.counters();
  INFO(steal_counts(before, after));
  CHECK(after.cheap_probes == before.cheap_probes);
  CHECK(after.stolen - before.stolen >= static_cast<uint64_t>(n / 4));
  CHECK(after.rescued == 0);
  self->send_exit(sender, caf::exit_reason::user_shutdown);
  for (auto& a : idle) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("troupe's scheduler: dear jobs queued behind a running job are stolen without a "
          "back-off, and the other worker runs a large share of them") {
  // 256 children of 200 us each (and a hello to their parent, a cheap job the child wakes:
  // timed with it) wait behind a 5 ms handler: every probe finds them dear, so stealing goes
  // on at once and, after two such probes, takes half of the queue at a time.
  troupe_system ts{2};
  constexpr long n = 256;
  auto before = ts.counters();
  CHECK(ask_spawn_then_spin(*ts.sys, n, 200, 5));
  auto after = ts.counters();
  INFO(steal_counts(before, after));
  CHECK(after.cheap_probes == before.cheap_probes);
  CHECK(after.stolen - before.stolen >= static_cast<uint64_t>(n / 4));
  CHECK(after.rescued == 0);
}

TEST_CASE("troupe's scheduler: an actor messaging the next runs it from the slot, on the same "
          "worker") {
  troupe_system ts{2};
  constexpr long rounds = 20'000;
  auto pong = ts.sys->spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {[self](t_ping, long k, caf::actor& from) { self->send(from, t_hi::value, k); }};
  });
  auto ping = ts.sys->spawn([pong](caf::stateful_actor<countdown>* self) -> caf::behavior {
    return {[self, pong](t_go, long n) {
              self->state.left = n;
              self->state.done = self->make_response_promise();
              self->send(pong, t_ping::value, 1L, caf::actor{self});
              return self->state.done;
            },
            [self, pong](t_hi, long k) {
              if (k >= self->state.left) {
                self->state.done.deliver(true);
                return;
              }
              self->send(pong, t_ping::value, k + 1, caf::actor{self});
            }};
  });
  auto before = ts.counters();
  CHECK(ask_go(*ts.sys, ping, rounds));
  caf::anon_send_exit(pong, caf::exit_reason::user_shutdown);
  auto after = ts.counters();
  // Each hop wakes the other actor from the running one: 2 slot runs per round. A few hops
  // may go through the queue (the streak limit lets other work in, an idle worker takes a
  // slot over): up to 1%. Without the slot, none of them would run from it. (The bound was
  // 100 of 40,000; under ThreadSanitizer with another suite beside it, 102 once.)
  CHECK(after.slot_runs - before.slot_runs >= static_cast<uint64_t>(2 * rounds - 2 * rounds / 100));
  CHECK(after.rescued == 0);
}

TEST_CASE("troupe's scheduler: an actor woken by a job that keeps running is taken over by "
          "an idle worker") {
  troupe_system ts{2};
  auto got = std::make_shared<std::atomic<bool>>(false);
  // The producer spawns the consumer and messages it, then keeps its worker busy until the
  // consumer has run (at most 10 s): the new consumer waits in the producer's slot, and only
  // another worker taking it from there lets it run. (A consumer spawned earlier could still
  // be finishing its last activation on the other worker and take the message there, with no
  // slot involved: the test failed that way once under load.)
  auto producer = ts.sys->spawn([got](caf::event_based_actor* self) -> caf::behavior {
    return {[self, got](t_go) {
      auto consumer = self->spawn([got](caf::event_based_actor* c) -> caf::behavior {
        return {[c, got](long) {
          got->store(true);
          c->quit();
        }};
      });
      self->send(consumer, 1L);
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!got->load() && std::chrono::steady_clock::now() < until) {
      }
      return got->load();
    }};
  });
  caf::scoped_actor self{*ts.sys};
  auto before = ts.counters();
  bool ran = false;
  self->request(producer, std::chrono::seconds(60), t_go::value)
      .receive([&](bool b) { ran = b; }, [](caf::error&) {});
  CHECK(ran);
  auto after = ts.counters();
  CHECK(after.slot_steals > before.slot_steals);
  CHECK(after.rescued == 0);
  self->send_exit(producer, caf::exit_reason::user_shutdown);
}

TEST_CASE("troupe's scheduler: messages from threads outside it reach their actors exactly "
          "once, while the actors message each other") {
  troupe_system ts{2};
  constexpr int senders = 4;
  constexpr long per_sender = 25'000;
  constexpr size_t actors = 8;
  // Each actor counts what reaches it and passes every 4th message on to the sink (so the
  // workers' slots and queues carry traffic of their own while the outside threads inject).
  auto sink = ts.sys->spawn([](caf::stateful_actor<long>* self) -> caf::behavior {
    return {[self](t_hi) { ++self->state; }, [self](t_count) { return self->state; }};
  });
  std::vector<caf::actor> ring;
  for (size_t i = 0; i < actors; ++i)
    ring.push_back(ts.sys->spawn([sink](caf::stateful_actor<long>* self) -> caf::behavior {
      return {[self, sink](t_ping, long k) {
                ++self->state;
                if (k % 4 == 0) self->send(sink, t_hi::value);
              },
              [self](t_count) { return self->state; }};
    }));
  std::vector<std::thread> threads;
  for (int s = 0; s < senders; ++s)
    threads.emplace_back([&, s] {
      for (long k = 0; k < per_sender; ++k)
        caf::anon_send(ring[static_cast<size_t>(k + s) % actors], t_ping::value, k);
    });
  for (auto& t : threads) t.join();
  // Every message is in its mailbox now; a request queues behind them, and each actor's
  // messages to the sink precede its answer, so the sink's answer comes after all of them.
  caf::scoped_actor self{*ts.sys};
  long received = 0;
  for (auto& a : ring)
    self->request(a, std::chrono::seconds(60), t_count::value)
        .receive([&](long n) { received += n; }, [](caf::error&) {});
  long relayed = -1;
  self->request(sink, std::chrono::seconds(60), t_count::value)
      .receive([&](long n) { relayed = n; }, [](caf::error&) {});
  CHECK(received == senders * per_sender);
  // k % 4 == 0 for k in 0..per_sender-1, from each sender
  CHECK(relayed == senders * ((per_sender + 3) / 4));
  for (auto& a : ring) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(sink, caf::exit_reason::user_shutdown);
  auto c = ts.counters();
  CHECK(c.inject_runs >= 1);
  CHECK(c.rescued == 0);
}

namespace {

std::atomic<long> tracked_made{0};
std::atomic<long> tracked_gone{0};

struct tracked {
  tracked() { ++tracked_made; }
  ~tracked() { ++tracked_gone; }
};

caf::behavior tracked_child(caf::stateful_actor<tracked>* self, caf::actor parent) {
  self->send(parent, t_hi::value);
  self->quit();
  return {};
}

} // namespace

TEST_CASE("troupe's scheduler: systems start and stop with work in flight, 30 times, and every "
          "actor spawned runs and is destroyed") {
  tracked_made = 0;
  tracked_gone = 0;
  constexpr long kids = 2'000;
  for (int round = 0; round < 30; ++round) {
    troupe_system ts{2};
    // The parent spawns its children and quits at once: their hellos and starts are still in
    // the slots and queues when the system begins to stop.
    auto parent = ts.sys->spawn([](caf::event_based_actor* self) -> caf::behavior {
      return {[self](t_go, long n) {
                for (long i = 0; i < n; ++i) self->spawn(tracked_child, caf::actor{self});
                self->quit();
              },
              [](t_hi) {}};
    });
    caf::anon_send(parent, t_go::value, kids); // not awaited
    auto c = ts.counters();
    CHECK(c.rescued == 0);
  } // each system's destructor waits for its actors: a lost job would hang here
  CHECK(tracked_made.load() == 30 * kids);
  CHECK(tracked_gone.load() == tracked_made.load());
}

struct held_promises {
  std::vector<caf::response_promise> rps;
};

/// Takes every ping and never answers it.
caf::behavior silent(caf::stateful_actor<held_promises>* self) {
  return {[self](t_ping) {
    auto rp = self->make_response_promise();
    self->state.rps.push_back(rp);
    return rp;
  }};
}

// A scoped actor ends in its destructor, on this thread: the counts below are exact.
TEST_CASE("troupe's scheduler: an actor's end costs the clock thread nothing unless the actor "
          "set a timeout, and timeouts still fire") {
  troupe_system ts{2};
  auto c0 = ts.counters();
  for (int i = 0; i < 100; ++i) {
    caf::scoped_actor a{*ts.sys};
  }
  auto c1 = ts.counters();
  CHECK(c1.ends_without_timer - c0.ends_without_timer == 100);
  CHECK(c1.ends_with_timer == c0.ends_with_timer);
  auto quiet = ts.sys->spawn(silent);
  {
    caf::scoped_actor a{*ts.sys};
    bool timed_out = false;
    a->request(quiet, std::chrono::milliseconds(20), t_ping::value)
        .receive([](int) {},
                 [&](caf::error& e) { timed_out = e == caf::sec::request_timeout; });
    CHECK(timed_out); // the request's timeout fired on the lean clock
  }
  auto c2 = ts.counters();
  CHECK(c2.ends_with_timer - c1.ends_with_timer == 1); // its end cancelled its timeouts
  CHECK(c2.ends_without_timer == c1.ends_without_timer);
  // Actors that end on the workers are counted there (a count of each worker's own, summed
  // by the reader), and the scoped actor waiting for them here as before. CAF cancels an
  // actor's timeouts just after it sends its down message: the count is awaited (bounded).
  auto c3 = ts.counters();
  {
    caf::scoped_actor self{*ts.sys};
    for (int i = 0; i < 100; ++i)
      self->spawn<caf::monitored>([](caf::event_based_actor* me) -> caf::behavior {
        me->quit();
        return {};
      });
    int downs = 0;
    self->receive_for(downs, 100)([](caf::down_msg&) {});
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto c4 = ts.counters();
  while (c4.ends_without_timer - c3.ends_without_timer < 101 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    c4 = ts.counters();
  }
  CHECK(c4.ends_without_timer - c3.ends_without_timer == 101);
  CHECK(c4.ends_with_timer == c2.ends_with_timer);
  caf::anon_send_exit(quiet, caf::exit_reason::user_shutdown);
}

// The cancellation still matters where a timeout is pending: CAF's clock keeps a strong
// reference to an actor whose request timeout has not fired yet. Skipping it would keep an
// ended actor allocated for the hour its timeout runs.
TEST_CASE("troupe's scheduler: an actor that ends with a timeout pending is released at once") {
  troupe_system ts{2};
  auto echo = ts.sys->spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  caf::weak_actor_ptr gone;
  {
    caf::scoped_actor a{*ts.sys};
    gone = caf::actor_cast<caf::weak_actor_ptr>(a.ptr());
    bool answered = false;
    a->request(echo, std::chrono::seconds(3600), 1)
        .receive([&](int) { answered = true; }, [](caf::error&) {});
    CHECK(answered);
  } // ends with its hour-long request timeout still pending in the clock
  {
    caf::scoped_actor b{*ts.sys};
    // echo answers in order: once it answers this, it has dropped a's request (and a with it)
    b->request(echo, caf::infinite, 2).receive([](int) {}, [](caf::error&) {});
    // the clock thread handles its events in order: once this delayed message arrives, a's
    // cancellation has been handled too
    b->delayed_send(b, std::chrono::milliseconds(1), 3);
    b->receive([](int) {});
  }
  CHECK_FALSE(gone.lock()); // nothing holds the ended actor any more
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE("troupe's scheduler: an idle worker lets the recycler and the actor slab give back "
          "what a burst left") {
  // With a zero interval every reap_idle begins a reaping interval: an idle worker's long
  // sleep times out (100 ms) and calls it. Nothing else here trades with the recycler's
  // depot or empties a slab chunk (a plain CAF system allocates nothing through them).
  namespace rc = troupe::detail::recycler;
  namespace sl = troupe::detail::actor_slab;
  if (!rc::enabled() || !sl::enabled()) {
    SUCCEED("the recycler and the slab are off in this build");
    return;
  }
  struct restore {
    std::chrono::nanoseconds old_rc, old_sl;
    ~restore() {
      rc::set_reap_interval(old_rc);
      sl::set_reap_interval(old_sl);
    }
  } restore_interval{rc::set_reap_interval(std::chrono::nanoseconds{0}),
                     sl::set_reap_interval(std::chrono::nanoseconds{0})};
  troupe_system ts{2};
  auto before = rc::stats().reaps;
  auto before_sl = sl::stats().reaps;
  // Real time by nature (the sleep's timeout is what is tested): polled, bounded.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
  while ((rc::stats().reaps == before || sl::stats().reaps == before_sl) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  CHECK(rc::stats().reaps > before);
  CHECK(sl::stats().reaps > before_sl);
}

TEST_CASE("troupe's scheduler: one thread runs everything (nothing to steal from)") {
  troupe_system ts{1};
  REQUIRE(ts.sys->scheduler().num_workers() == 1);
  auto parent = ts.sys->spawn(burst_parent);
  CHECK(ask_go(*ts.sys, parent, 20'000));
  auto c = ts.counters();
  CHECK(c.steals == 0);
  CHECK(c.rescued == 0);
}

TEST_CASE("troupe's scheduler: counters are refused for a system on CAF's own scheduler") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys{cfg};
  troupe::scheduler_counters c;
  CHECK_FALSE(troupe::read_scheduler_counters(sys, c));
}

TEST_CASE("a runtime configured with \"scheduler\": \"troupe\" runs on troupe's scheduler, and "
          "an unknown scheduler is refused naming the field") {
  auto cfg = troupe::runtime_config::from_json(R"({"scheduler": "troupe", "threads": 2})");
  REQUIRE(cfg);
  CHECK(cfg->policy == troupe::scheduler_policy::troupe);
  auto rt = troupe::runtime::builder{}.threads(2).scheduler(troupe::scheduler_policy::troupe).build();
  REQUIRE(rt);
  troupe::scheduler_counters c;
  CHECK(troupe::read_scheduler_counters(rt->system(), c));
  auto sharing = troupe::runtime::builder{}.scheduler(troupe::scheduler_policy::sharing).build();
  REQUIRE(sharing);
  CHECK_FALSE(troupe::read_scheduler_counters(sharing->system(), c));
  auto bad = troupe::runtime_config::from_json(R"({"scheduler": "fifo"})");
  REQUIRE_FALSE(bad);
  CHECK(troupe::is(bad.error(), troupe::errc::config_out_of_range));
  CHECK(troupe::render(bad.error()).find("scheduler") != std::string::npos);
}

TEST_CASE("troupe's scheduler: with CAF built quiet, its threads keep no per-thread logger, "
          "not even after a spawn (CAF's actor code then skips the logger's actor ids)") {
  // CAF's resume, launch and actor destruction write the current logger's per-thread actor
  // id (a map behind a shared spinlock) whenever a logger is installed on the thread.
  // CAF's spawn installs it on the spawning thread: a worker takes it off after the job.
  // One worker: every job runs on the thread that spawned. The checks are another actor's
  // jobs (an actor may take a message sent during its job in that same job).
  troupe_system ts{1};
  using t_probe = caf::atom_constant<caf::atom("t_probe")>;
  using t_spawn = caf::atom_constant<caf::atom("t_spawn")>;
  auto probe = ts.sys->spawn([]() -> caf::behavior {
    return {[](t_probe) { return caf::logger::current_logger() != nullptr; }};
  });
  auto spawner = ts.sys->spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {[self](t_spawn) {
      self->spawn([](caf::event_based_actor* c) -> caf::behavior {
        c->quit();
        return {};
      });
      return caf::logger::current_logger() != nullptr; // installed by the spawn
    }};
  });
  caf::scoped_actor self{*ts.sys};
  auto ask = [&](const caf::actor& who, auto what) {
    std::optional<bool> installed;
    self->request(who, std::chrono::seconds(30), what)
        .receive([&](bool b) { installed = b; }, [](caf::error&) {});
    REQUIRE(installed);
    return *installed;
  };
  auto first = ask(probe, t_probe::value);
  std::vector<bool> during, after;
  for (int i = 0; i < 20; ++i) {
    during.push_back(ask(spawner, t_spawn::value));
    after.push_back(ask(probe, t_probe::value)); // a job of its own, after the spawning one
  }
  CHECK(during == std::vector<bool>(20, true)); // CAF's spawn_impl installs it, whatever the build
#if CAF_LOG_LEVEL == CAF_LOG_LEVEL_QUIET
  CHECK_FALSE(first);
  CHECK(after == std::vector<bool>(20, false));
#else
  CHECK(first); // a CAF that logs gets its logger, as on CAF's own threads
  CHECK(after == std::vector<bool>(20, true));
#endif
  self->send_exit(spawner, caf::exit_reason::user_shutdown);
  self->send_exit(probe, caf::exit_reason::user_shutdown);
}
