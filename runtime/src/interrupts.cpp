// OS signals: a self-pipe written by the signal handler, one watcher thread per process that
// fans each signal out to the listening runtimes, and per runtime a thread that runs its
// interrupt handlers (as tasks) and the stop choreography. Nothing but `write` (or `_exit`,
// for a second signal while stopping) runs inside the signal handler.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

#include "runtime_impl.hpp"

namespace troupe {

namespace detail {

namespace {

int g_pipe[2] = {-1, -1};
/// While positive, a runtime that listens to signals is stopping: a signal ends the process.
std::atomic<int> g_stopping{0};
std::mutex g_mtx;
/// The listening runtimes, by their state's address.
std::vector<std::pair<const void*, std::function<void(int)>>> g_listeners;
bool g_installed = false;

extern "C" void on_os_signal(int sig) {
  if (g_stopping.load() > 0) _exit(128 + sig);
  int saved = errno;
  auto c = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(g_pipe[1], &c, 1);
  errno = saved;
}

void watch_signals() {
  for (;;) {
    unsigned char c = 0;
    auto n = ::read(g_pipe[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard<std::mutex> guard{g_mtx};
    for (auto& l : g_listeners)
      l.second(static_cast<int>(c));
  }
}

constexpr int g_signals[] = {SIGINT, SIGTERM, SIGHUP};
/// The actions troupe replaced (given back when no runtime listens any more).
struct sigaction g_previous[3];

/// Installs troupe's handler for SIGINT, SIGTERM and SIGHUP (keeping the actions it
/// replaces), or gives the previous actions back.
void set_handlers(bool on) {
  for (int i = 0; i < 3; ++i) {
    if (on) {
      struct sigaction sa {};
      sa.sa_handler = on_os_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      ::sigaction(g_signals[i], &sa, &g_previous[i]);
    } else {
      ::sigaction(g_signals[i], &g_previous[i], nullptr);
    }
  }
}

/// Installs the pipe and the watcher once per process, and the handlers while a runtime
/// listens. Requires g_mtx.
bool install_locked() {
  if (!g_installed) {
    if (::pipe2(g_pipe, O_CLOEXEC) != 0) return false;
    std::thread{watch_signals}.detach(); // lives as long as the process
    g_installed = true;
  }
  if (g_listeners.empty()) set_handlers(true);
  return true;
}

unsigned bit_of(int signo) noexcept {
  switch (signo) {
    case SIGINT:
      return on_sigint;
    case SIGTERM:
      return on_sigterm;
    case SIGHUP:
      return on_sighup;
    default:
      return 0;
  }
}

} // namespace

void signals_stopping(int delta) noexcept {
  g_stopping.fetch_add(delta);
}

} // namespace detail

void runtime::impl::listen() {
  {
    std::lock_guard<std::mutex> g{interrupt_mtx};
    if (listening || sched != nullptr) return; // virtual time: `interrupt(signo)` only
    listening = true;
  }
  {
    std::lock_guard<std::mutex> guard{detail::g_mtx};
    if (!detail::install_locked()) {
      note("interrupt.install", "signals", "the signal pipe could not be created");
      return;
    }
    detail::g_listeners.emplace_back(this, [this](int sig) {
      {
        std::lock_guard<std::mutex> g{interrupt_mtx};
        pending_signals.push_back(sig);
      }
      interrupt_cv.notify_all();
    });
  }
  interrupt_thread = std::thread{[this] {
    detail::helper_thread_of = this;
    for (;;) {
      int sig = 0;
      {
        std::unique_lock<std::mutex> lock{interrupt_mtx};
        interrupt_cv.wait(lock, [this] { return interrupt_exit || !pending_signals.empty(); });
        if (interrupt_exit) break;
        sig = pending_signals.front();
        pending_signals.pop_front();
      }
      if (handle_interrupt(sig)) break;
    }
    std::lock_guard<std::mutex> guard{detail::g_mtx};
    std::erase_if(detail::g_listeners, [this](const auto& l) { return l.first == this; });
    // The last listening runtime is gone: the process gets its previous actions back.
    if (detail::g_listeners.empty()) detail::set_handlers(false);
  }};
}

bool runtime::impl::handle_interrupt(int signo) {
  was_interrupted = true;
  if (stopped.load()) return true;
  // The handlers for this signal, most recent first.
  std::vector<interrupt_entry> run;
  {
    std::lock_guard<std::mutex> g{interrupt_mtx};
    auto bit = detail::bit_of(signo);
    for (auto i = handlers.rbegin(); i != handlers.rend(); ++i)
      if ((i->opts.signals & bit) != 0 || bit == 0) run.push_back(*i);
    std::erase_if(handlers, [&](const interrupt_entry& e) {
      return e.opts.once && ((e.opts.signals & bit) != 0 || bit == 0);
    });
  }
  bool resume = false;
  for (auto& h : run) {
    auto slot = std::make_shared<detail::root_slot>();
    auto handler = h.handler;
    auto r = detail::make_runner([handler, signo](context& cx) -> task<interrupt_action> {
      return handler(cx, signo);
    });
    caf::expected<std::shared_ptr<detail::handle_state>> st{
        make_error(errc::runtime_stopped, "runtime", "the runtime is stopping")};
    {
      std::lock_guard<std::mutex> guard{lifecycle_mtx};
      if (!stopped.load())
        st = detail::task_actor::spawn_root(*sys, &env, std::move(r),
                                            {.name = "interrupt." + std::to_string(h.id)}, slot);
    }
    detail::release_caf_logger_here(); // the spawn made this thread hold CAF's logger
    if (!st) return true;
    bool ok = wait_for([&] { return slot->done; }, slot->mtx, slot->cv,
                       detail::bound_of(h.opts.graceful_timeout));
    if (!ok) {
      note("interrupt.handler", std::to_string(h.id),
           "did not finish within its graceful_timeout of " +
               std::to_string(h.opts.graceful_timeout.count()) + " ms (task " + (*st)->id +
               "); cancelled");
      caf::anon_send((*st)->actor, atoms::cancel_atom::value, cancel_mode::force());
      continue;
    }
    outcome_box out;
    {
      std::lock_guard<std::mutex> g{slot->mtx};
      out = std::move(slot->out);
    }
    auto action = detail::unbox<interrupt_action>(std::move(out));
    if (!action)
      note("interrupt.handler", std::to_string(h.id), "failed: " + render(action.error()));
    else if (*action == interrupt_action::resume)
      resume = true;
  }
  if (resume) return false;
  stop_all();
  return true;
}

uint64_t runtime::on_interrupt(interrupt_handler handler, interrupt_options opts) {
  if (!impl_) return 0;
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> g{impl_->interrupt_mtx};
    id = ++impl_->next_handler;
    impl_->handlers.push_back({id, std::move(handler), opts});
  }
  impl_->listen();
  return id;
}

bool runtime::remove_interrupt(uint64_t id) {
  if (!impl_) return false;
  std::lock_guard<std::mutex> g{impl_->interrupt_mtx};
  return std::erase_if(impl_->handlers, [id](const auto& e) { return e.id == id; }) > 0;
}

bool runtime::interrupted() const noexcept {
  return impl_ && impl_->was_interrupted.load();
}

bool runtime::interrupt(int signo) {
  if (!impl_) return false;
  if (impl_->stopped.load()) { // stopped or stopping already: this call runs no stop
    impl_->was_interrupted = true;
    return false;
  }
  return impl_->handle_interrupt(signo);
}

} // namespace troupe
