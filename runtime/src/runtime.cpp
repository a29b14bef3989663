#include "troupe/runtime/runtime.hpp"

#include <atomic>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <unistd.h>

#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/logger.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "troupe/actors/detail/primitives.hpp"
#include "troupe/actors/detail/spawner.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/types.hpp"
#include "troupe/runtime/remote_queue.hpp"
#include "troupe/runtime/scheduler.hpp"
#include "runtime_impl.hpp"

namespace troupe {

namespace {

/// Returns 16 random hex digits: a process-wide random salt (read from the OS once) plus a
/// count, mixed (splitmix64's finalizer, a bijection: ids never repeat in a process), with
/// the process id in the salt (a forked child inherits the salt and the count). A
/// `std::random_device` per runtime cost 7% of building one (a simulation builds one per
/// run).
std::string new_session_id() {
  static const uint64_t salt = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> count{0};
  auto x = (salt ^ (static_cast<uint64_t>(::getpid()) << 40)) +
           0x9e3779b97f4a7c15ULL * (count.fetch_add(1, std::memory_order_relaxed) + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (auto& c : out) {
    c = digits[x & 0xf];
    x >>= 4;
  }
  return out;
}

} // namespace

runtime::runtime(std::unique_ptr<impl> p) noexcept : impl_(std::move(p)) {}
runtime::runtime(runtime&&) noexcept = default;
runtime& runtime::operator=(runtime&& other) noexcept {
  if (this != &other) {
    stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
runtime::~runtime() {
  stop();
}

troupe::clock& runtime::clock() noexcept {
  return impl_->clk();
}
virtual_clock* runtime::virtual_time() noexcept {
  return impl_->virt.get();
}
caf::actor_system& runtime::system() noexcept {
  return *impl_->sys;
}
const runtime_config& runtime::config() const noexcept {
  return impl_->cfg;
}
bool runtime::stopped() const noexcept {
  return !impl_ || impl_->stopped.load();
}
size_t runtime::drain() {
  if (!impl_) return 0;
  auto n = impl_->drain();
  impl_->run_requested_stop();
  return n;
}

size_t runtime::advance(clock::duration d) {
  if (!impl_ || !impl_->virt || !impl_->sys) return 0; // closed by stop(): nothing runs
  impl_->drain();
  impl_->run_requested_stop();
  if (!impl_->sys) return 0;
  auto n = impl_->virt->advance(d);
  impl_->run_requested_stop();
  return n;
}

caf::expected<std::shared_ptr<detail::handle_state>>
runtime::spawn_root(std::unique_ptr<detail::runner_base> r, spawn_options opts,
                    std::shared_ptr<detail::root_slot> slot) {
  std::lock_guard<std::mutex> guard{impl_->lifecycle_mtx};
  if (stopped())
    return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
  auto st = detail::task_actor::spawn_root(*impl_->sys, &impl_->env, std::move(r),
                                           std::move(opts), std::move(slot));
  detail::release_caf_logger_here();
  return st;
}

caf::expected<outcome_box> runtime::run_root(std::unique_ptr<detail::runner_base> r,
                                             spawn_options opts) {
  auto slot = std::make_shared<detail::root_slot>();
  auto st = spawn_root(std::move(r), std::move(opts), slot);
  if (!st) return std::move(st.error());
  if (impl_->sched == nullptr) {
    std::unique_lock<std::mutex> lock{slot->mtx};
    slot->cv.wait(lock, [&] { return slot->done; });
    return std::move(slot->out);
  }
  // Virtual time: this thread drives the deterministic scheduler.
  for (;;) {
    impl_->drain();
    impl_->run_requested_stop(); // the body (or another task) called stop()
    {
      std::lock_guard<std::mutex> guard{slot->mtx};
      if (slot->done) return std::move(slot->out);
    }
    if (!impl_->sys) // closed (its stop answered every root): not reached in practice
      return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
    if (impl_->virt->advance_to_next()) continue;
    // Nothing runnable, no timer pending, the body still waits: it never will finish.
    caf::anon_send((*st)->actor, atoms::cancel_atom::value, cancel_mode::join());
    impl_->drain();
    return make_error(errc::stalled, "body",
                      "task " + (*st)->id +
                          " waits, but nothing can run and no timer is pending (virtual time)");
  }
}

caf::expected<std::shared_ptr<detail::handle_state>>
runtime::spawn_job_root(std::unique_ptr<detail::runner_base> r, std::string name,
                        const detail::lane_catalog::entry& lane) {
  std::lock_guard<std::mutex> guard{impl_->lifecycle_mtx};
  if (stopped())
    return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
  // Idle until its lane starts it (holding its first permit): the reservation goes out now.
  auto st = detail::task_actor::spawn_root_job(*impl_->sys, &impl_->env, std::move(r),
                                               {.name = std::move(name)}, lane.actor);
  detail::task_actor::turn_spawner_key(st->actor); // nothing to wait for but the lane
  detail::reserve_lane(lane, st->actor, true);
  detail::release_caf_logger_here();
  return st;
}

detail::task_env& runtime::env() noexcept {
  return impl_->env;
}

std::vector<lane_decl> runtime::lanes() const {
  std::vector<lane_decl> out;
  if (impl_ && impl_->env.lanes)
    for (auto& e : impl_->env.lanes->entries())
      out.push_back(e.decl);
  return out;
}

caf::expected<lane_metrics> runtime::lane_metrics_of(std::string name) {
  auto r = run([name](context& cx) -> task<caf::expected<lane_metrics>> {
    co_return co_await troupe::lane_metrics_of(cx, name);
  }, {.name = "runtime.lanes"});
  if (!r) return std::move(r.error());
  return std::move(*r);
}

caf::expected<std::vector<lane_metrics>> runtime::lane_metrics_of() {
  auto r = run([](context& cx) -> task<caf::expected<std::vector<lane_metrics>>> {
    co_return co_await troupe::lane_metrics_of(cx);
  }, {.name = "runtime.lanes"});
  if (!r) return std::move(r.error());
  return std::move(*r);
}

const std::string& runtime::node_name() const noexcept {
  static const std::string none;
  return impl_ && impl_->directory ? impl_->cfg.cluster.node : none;
}

uint16_t runtime::cluster_port() const noexcept {
  return impl_ ? impl_->cluster_port : 0;
}

const std::string& runtime::session_id() const noexcept {
  static const std::string none;
  return impl_ ? impl_->env.session_id : none;
}

caf::expected<caf::actor> runtime::storage() {
  if (!impl_) return make_error(errc::runtime_stopped, "runtime", "the runtime was moved from");
  {
    std::lock_guard<std::mutex> guard{impl_->lifecycle_mtx};
    if (impl_->stopped.load())
      return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
    ++impl_->opens_in_flight;
  }
  auto result = impl_->services->open_storage();
  {
    std::lock_guard<std::mutex> guard{impl_->lifecycle_mtx};
    --impl_->opens_in_flight;
  }
  impl_->opens_done.notify_all();
  return result;
}

// -- supervision ------------------------------------------------------------------------------
// From main: each call runs the task form (runtime/supervision.hpp) and blocks until it answers.

caf::expected<supervisor_ref> runtime::supervise(supervisor_spec spec) {
  if (!impl_) return make_error(errc::runtime_stopped, "runtime", "the runtime was moved from");
  supervisor_ref ref;
  ref.final = std::make_shared<supervisor_final>();
  auto name = spec.name;
  caf::error start_error;
  caf::actor stopping;
  {
    // Checked, spawned and recorded under the lifecycle lock: stop() cannot slip between
    // (it would miss this supervisor and wait for it forever).
    std::lock_guard<std::mutex> lifecycle{impl_->lifecycle_mtx};
    if (stopped())
      return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
    // The children start before this answers: a start failure is the error here.
    auto sup = detail::spawn_supervisor_or_stopping(system(), clock(), std::move(spec),
                                                    ref.final, stopping);
    if (sup) {
      ref.actor = *sup;
      impl_->record_supervisor(ref.actor, name);
    } else {
      start_error = std::move(sup.error());
    }
  }
  if (start_error) {
    // OTP's start_link: the answer comes once the children started before the failure
    // have stopped (each per its shutdown). Outside the lock: the stop may take a while.
    if (stopping)
      (void)run([stopping](context& cx) -> task<int> {
        (void)co_await cx.request<supervisor_state>(stopping, atoms::sup_wait_atom::value);
        co_return 0;
      }, {.name = "runtime.supervise"});
    return start_error;
  }
  impl_->services->watch_lifecycle(ref.actor, std::move(name));
  return ref;
}

namespace {

template <class T, class F>
caf::expected<T> blocking(runtime& rt, F call) {
  auto r = rt.run([call](context& cx) -> task<caf::expected<T>> { co_return co_await call(cx); },
                  {.name = "runtime.supervision"});
  if (!r) return std::move(r.error());
  return std::move(*r);
}

} // namespace

caf::expected<std::vector<member_state>> runtime::cluster_state() {
  return blocking<std::vector<member_state>>(*this, [](context& cx) {
    return troupe::cluster_state(cx);
  });
}

caf::expected<std::vector<cluster_event>> runtime::cluster_next_events(uint64_t after) {
  return blocking<std::vector<cluster_event>>(*this, [after](context& cx) {
    return troupe::cluster_next_events(cx, after);
  });
}

caf::expected<member_state> runtime::await_member(std::string node, member_status status,
                                                  std::optional<std::chrono::milliseconds> timeout) {
  return blocking<member_state>(*this, [node, status, timeout](context& cx) {
    return troupe::await_member(cx, node, status, timeout);
  });
}

caf::expected<bool> runtime::subscribe_cluster(caf::actor who, bool replay) {
  return blocking<bool>(*this, [who, replay](context& cx) {
    return troupe::subscribe_cluster(cx, who, replay);
  });
}

caf::expected<bool> runtime::unsubscribe_cluster(caf::actor_addr who) {
  return blocking<bool>(*this, [who](context& cx) { return troupe::unsubscribe_cluster(cx, who); });
}

caf::expected<bool> runtime::join_cluster(std::string host, uint16_t port) {
  return blocking<bool>(*this, [host, port](context& cx) {
    return troupe::join_cluster(cx, host, port);
  });
}

caf::expected<bool> runtime::leave_cluster() {
  return blocking<bool>(*this, [](context& cx) { return troupe::leave_cluster(cx); });
}

caf::expected<bool> runtime::register_global(std::string name, caf::actor actor) {
  return blocking<bool>(*this, [name, actor](context& cx) {
    return troupe::register_global(cx, name, actor);
  });
}

caf::expected<bool> runtime::unregister_global(std::string name) {
  return blocking<bool>(*this, [name](context& cx) { return troupe::unregister_global(cx, name); });
}

caf::expected<caf::actor> runtime::whereis(std::string name) {
  return blocking<caf::actor>(*this, [name](context& cx) { return troupe::whereis(cx, name); });
}

caf::expected<supervisor_state> runtime::supervisor_state_of(const supervisor_ref& sup) {
  return blocking<supervisor_state>(*this, [sup](context& cx) {
    return troupe::supervisor_state_of(cx, sup);
  });
}

caf::expected<child_state> runtime::start_child(const supervisor_ref& sup, child_spec child) {
  return blocking<child_state>(*this, [sup, child](context& cx) {
    return troupe::start_child(cx, sup, child);
  });
}

caf::expected<child_state> runtime::start_child(const supervisor_ref& sup, caf::message args) {
  return blocking<child_state>(*this, [sup, args](context& cx) {
    return troupe::start_child(cx, sup, args);
  });
}

caf::expected<bool> runtime::terminate_child(const supervisor_ref& sup, std::string name) {
  return blocking<bool>(*this, [sup, name](context& cx) {
    return troupe::terminate_child(cx, sup, name);
  });
}

caf::expected<child_state> runtime::restart_child(const supervisor_ref& sup, std::string name) {
  return blocking<child_state>(*this, [sup, name](context& cx) {
    return troupe::restart_child(cx, sup, name);
  });
}

caf::expected<bool> runtime::delete_child(const supervisor_ref& sup, std::string name) {
  return blocking<bool>(*this, [sup, name](context& cx) {
    return troupe::delete_child(cx, sup, name);
  });
}

caf::expected<std::vector<child_state>> runtime::which_children(const supervisor_ref& sup) {
  return blocking<std::vector<child_state>>(*this, [sup](context& cx) {
    return troupe::which_children(cx, sup);
  });
}

caf::expected<child_counts> runtime::count_children(const supervisor_ref& sup) {
  return blocking<child_counts>(*this, [sup](context& cx) {
    return troupe::count_children(cx, sup);
  });
}

caf::expected<supervisor_metrics> runtime::supervisor_metrics_of(const supervisor_ref& sup) {
  return blocking<supervisor_metrics>(*this, [sup](context& cx) {
    return troupe::supervisor_metrics_of(cx, sup);
  });
}

caf::expected<supervisor_state> runtime::supervisor_state_of(const caf::actor& sup) {
  return supervisor_state_of(supervisor_ref{sup, nullptr});
}

caf::expected<std::vector<supervisor_event>> runtime::supervisor_events(const supervisor_ref& sup) {
  return blocking<std::vector<supervisor_event>>(*this, [sup](context& cx) {
    return troupe::supervisor_events(cx, sup);
  });
}

caf::expected<supervisor_state> runtime::supervisor_wait(const supervisor_ref& sup) {
  return blocking<supervisor_state>(*this, [sup](context& cx) {
    return troupe::supervisor_wait(cx, sup);
  });
}

caf::expected<supervisor_state> runtime::supervisor_stop(const supervisor_ref& sup,
                                                         std::chrono::milliseconds timeout) {
  return blocking<supervisor_state>(*this, [sup, timeout](context& cx) {
    return troupe::supervisor_stop(cx, sup, timeout);
  });
}

// -- builder ----------------------------------------------------------------------------------

caf::expected<runtime_config> runtime::builder::resolve() const {
  runtime_config cfg;
  if (config_file_) {
    auto res = runtime_config::from_file(*config_file_, cfg);
    if (!res) return res.error();
    cfg = std::move(*res);
  }
  if (config_json_) {
    auto res = runtime_config::from_json(*config_json_, cfg);
    if (!res) return res.error();
    cfg = std::move(*res);
  }
  if (threads_) cfg.threads = *threads_;
  if (policy_) cfg.policy = *policy_;
  if (max_throughput_) cfg.max_throughput = *max_throughput_;
  if (blocking_threads_) cfg.blocking_threads = *blocking_threads_;
  if (virtual_time_) cfg.virtual_time = *virtual_time_;
  if (storage_) cfg.storage = *storage_;
  if (stop_timeout_) cfg.stop_timeout = *stop_timeout_;
  if (deadlock_check_) cfg.deadlock_check = *deadlock_check_;
  if (cluster_) cfg.cluster = *cluster_;
  if (auto err = cfg.validate()) return err;
  return cfg;
}

caf::expected<runtime> runtime::builder::build() const {
  auto cfg = resolve();
  if (!cfg) return cfg.error();
  if (auto err = validate_lanes(lanes_)) return err; // before anything starts
  if (bodies_ && bodies_->find("") != nullptr)
    return make_error(errc::invalid_argument, "bodies", "a body is registered under an empty name");
  auto p = std::make_unique<impl>();
  p->cfg = std::move(*cfg);
  auto& sc = p->sys_cfg;
  sc.add_error_category(error_category(),
                        [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                          return render_error_context(code, ctx);
                        });
  add_message_types(sc); // every payload that may cross a node, under its stable name
  for (auto& add : type_adders_)
    add(sc); // the application's own
  auto& cl = p->cfg.cluster;
  if (!cl.node.empty()) {
    sc.load<caf::io::middleman>();
    if (cl.tls()) {
      sc.load<caf::openssl::manager>();
      sc.set("openssl.certificate", cl.tls_certificate);
      sc.set("openssl.key", cl.tls_key);
      sc.set("openssl.cafile", cl.tls_cafile);
    }
  }
  if (p->cfg.virtual_time) {
    sc.set("scheduler.policy", caf::atom("testing"));
    p->virt = std::make_unique<virtual_clock>();
    p->manual = std::make_unique<detail::manual_executor>();
    p->env.clock = p->virt.get();
    p->env.blocking = p->manual.get();
  } else {
    if (p->cfg.policy == scheduler_policy::troupe) {
      load_troupe_scheduler(sc);
      p->env.notices_go_home = true;
    } else
      sc.set("scheduler.policy", p->cfg.policy == scheduler_policy::sharing
                                     ? caf::atom("sharing")
                                     : caf::atom("stealing"));
    sc.set("scheduler.max-threads", static_cast<caf::config_value::integer>(p->cfg.threads));
    if (p->cfg.max_throughput > 0)
      sc.set("scheduler.max-throughput",
             static_cast<caf::config_value::integer>(p->cfg.max_throughput));
    p->real = std::make_unique<real_clock>();
    p->pool = std::make_unique<detail::thread_pool_executor>(p->cfg.blocking_threads);
    p->env.clock = p->real.get();
    p->env.blocking = p->pool.get();
  }
  auto* raw = p.get();
  p->sys_cfg.env = &p->env;
  p->env.owner = raw;
  try {
    p->services = std::make_unique<detail::service_provider>(p->cfg, &p->clk(), p->stopped);
    p->sys = std::make_unique<caf::actor_system>(p->sys_cfg);
    p->env.sys = p->sys.get();
    p->services->bind(*p->sys);
  } catch (const std::exception& e) {
    return make_error(errc::runtime_start_failed, "scheduler", e.what());
  }
  if (p->cfg.virtual_time) {
    p->sched = dynamic_cast<caf::scheduler::test_coordinator*>(&p->sys->scheduler());
    if (p->sched == nullptr)
      return make_error(errc::runtime_start_failed, "virtual_time",
                        "the deterministic scheduler is not available");
    p->virt->on_fire([raw] { raw->drain(); });
  }
  auto lanes = detail::open_lanes(*p->sys, &p->clk(), lanes_);
  if (!lanes) return lanes.error(); // validated above: does not happen
  p->env.lanes = std::move(*lanes);
  p->env.resources = resources_;
  p->env.bodies = bodies_;
  if (!cl.node.empty()) { // the bodies that serve shared channels and mailboxes
    auto reg = bodies_ ? std::make_shared<detail::body_registry>(*bodies_)
                       : std::make_shared<detail::body_registry>();
    detail::add_queue_bodies(*reg);
    p->env.bodies = std::move(reg);
  }
  p->env.node = cl.node;
  p->env.registry = detail::spawn_registry(*p->sys, &p->clk(), p->services->spawn_provider());
  p->env.session_id = new_session_id();
  if (p->cfg.deadlock_check.count() > 0)
    p->env.census.detector =
        detail::spawn_deadlock_detector(*p->sys, &p->env, p->cfg.deadlock_check);
  if (signals_) p->listen(); // real time only (virtual time: `interrupt(signo)`)
  runtime rt{std::move(p)};
  if (!cl.node.empty()) {
    auto& s = *rt.impl_;
    // The spawner runs registered bodies for other nodes; they find it by cluster name.
    // It is registered before the node joins anyone: its name travels in the join, so a
    // member that sees this node up can reach its spawner at once.
    auto start_services = [&s, &cl](const directory_actor& dir) -> caf::error {
      s.spawner = detail::spawn_spawner(*s.sys, &s.env, dir);
      caf::scoped_actor self{*s.sys};
      caf::error err;
      self->request(dir, std::chrono::seconds{10}, atoms::cl_register_atom::value,
                    spawner_name(cl.node), caf::actor_cast<caf::actor>(s.spawner))
          .receive([](bool) {}, [&](caf::error& e) { err = std::move(e); });
      if (err) return err;
      // Set before any member can reach this node (a body run for it may open the
      // storage).
      if (!cl.remote_storage.empty())
        s.services->find_remote_storage =
            [sys = s.sys.get(), weak = caf::actor_cast<caf::weak_actor_ptr>(dir),
             shared = cl.remote_storage]() -> caf::expected<storage_link_config> {
          auto d = caf::actor_cast<directory_actor>(weak.lock());
          if (!d) return make_error(errc::runtime_stopped, "cluster", "the directory has stopped");
          caf::scoped_actor self{*sys};
          caf::expected<storage_link_config> out{
              make_error(errc::storage_unavailable, "cluster.remote_storage",
                         "no member shares a storage named \"" + shared + "\" (is its node up?)")};
          self->request(d, std::chrono::seconds{10}, atoms::cl_names_atom::value)
              .receive(
                  [&](std::vector<global_name>& names) {
                    for (auto& n : names)
                      if (n.name == shared_storage_name(shared) && n.actor)
                        out = storage_link_config{n.actor, shared, n.node,
                                                  caf::actor_cast<caf::actor>(d), nullptr};
                  },
                  [&](caf::error& e) { out = std::move(e); });
          return out;
        };
      if (cl.share_storage.empty()) return {};
      // A shared storage opens now and is registered before the join too, so the
      // members learn its name with this node (and again whenever it opens anew).
      s.services->storage_opened =
          [sys = s.sys.get(), weak = caf::actor_cast<caf::weak_actor_ptr>(dir),
           name = shared_storage_name(cl.share_storage)](const caf::actor& st) -> caf::error {
        auto d = caf::actor_cast<directory_actor>(weak.lock());
        if (!d) return make_error(errc::runtime_stopped, "cluster", "the directory has stopped");
        caf::scoped_actor self{*sys};
        caf::error err;
        self->request(d, std::chrono::seconds{10}, atoms::cl_register_atom::value, name, st)
            .receive([](bool) {}, [&](caf::error& e) { err = std::move(e); });
        return err;
      };
      auto st = s.services->open_storage();
      return st ? caf::error{} : std::move(st.error());
    };
    // Step 4 of the stop: the members hear goodbye (member_left), not a broken connection.
    // Registered first, so a hook's participant cannot take its name; a build that fails
    // runs it against a directory that is gone (cluster_unavailable at once).
    (void)rt.on_stop(
        "troupe.cluster",
        [](context& cx) -> task<void> { (void)co_await troupe::leave_cluster(cx); },
        std::chrono::seconds{2});
    {
      std::lock_guard<std::mutex> guard{s.build_mtx};
      s.building = true;
    }
    auto node = detail::start_cluster_node(
        *s.sys, cl, &s.clk(),
        [this, &rt, &s, &start_services](const directory_actor& dir, uint16_t port) -> caf::error {
          if (auto err = start_services(dir)) return err;
          if (before_join_.empty()) return {};
          // The application's own names, registered before the join like the spawner's.
          // The runtime is a node for them already (node_name, cluster_port, whereis).
          s.directory = dir;
          s.cluster_port = port;
          auto run_hooks = [&]() -> caf::error {
            for (auto& fn : before_join_) {
              try {
                if (auto err = fn(rt)) return err;
                if (s.stop_asked_while_building()) // the next hooks do not run, no join
                  return make_error(errc::runtime_stopped, "runtime",
                                    "a stop was asked for while the before_join hooks ran");
              } catch (const std::exception& e) {
                return make_error(errc::runtime_start_failed, "before_join", e.what());
              } catch (...) {
                return make_error(errc::runtime_start_failed, "before_join",
                                  "a before_join hook threw a non-standard exception");
              }
            }
            return {};
          };
          auto err = run_hooks();
          if (err) { // the directory is killed: this runtime is no node after all
            s.directory = nullptr;
            s.cluster_port = 0;
          }
          return err;
        });
    if (!node) {
      s.end_building();
      rt.stop(); // what started stops in order
      return node.error();
    }
    s.directory = node->directory;
    s.cluster_port = node->port;
    if (cl.tls()) {
      // A refused peer (another CA, a rogue certificate, a plain client) is logged: on
      // stderr and in `notices()`.
      auto* raw_impl = rt.impl_.get();
      auto port = node->port;
      auto name = cl.node;
      s.tls_sink = detail::add_tls_refusal_sink(
          [raw_impl, port, name](uint16_t local, const std::string& peer, const std::string& why) {
            if (local != port) return; // another node of this process
            std::fprintf(stderr, "troupe: node %s refused a TLS connection from %s: %s\n",
                         name.c_str(), peer.c_str(), why.c_str());
            raw_impl->note("cluster", "refused " + peer, why);
          });
    }
    if (cl.insecure && !cl.tls())
      s.note("cluster", cl.node,
             "plain TCP without TLS (insecure: true): members are not authenticated");
    if (s.end_building()) {
      rt.stop();
      return make_error(errc::runtime_stopped, "runtime",
                        "a stop was asked for while build() started the cluster node (a "
                        "before_join hook called stop(), or a signal came)");
    }
  }
  detail::release_caf_logger_here();
  return rt;
}

} // namespace troupe
