#include "troupe/runtime/clocks.hpp"

#include <caf/actor_cast.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message_id.hpp>

namespace troupe {

namespace detail {

clock::timer_id timer_queue::add(clock::time_point due, caf::actor target, caf::message msg) {
  auto id = ++next_id_;
  by_due_.emplace(key{due, id}, entry{id, std::move(target), std::move(msg)});
  due_of_.emplace(id, due);
  return id;
}

bool timer_queue::remove(clock::timer_id id) noexcept {
  auto i = due_of_.find(id);
  if (i == due_of_.end()) return false;
  by_due_.erase(key{i->second, id});
  due_of_.erase(i);
  return true;
}

std::optional<std::pair<clock::time_point, timer_queue::entry>>
timer_queue::pop_due(clock::time_point now) {
  if (by_due_.empty() || by_due_.begin()->first.first > now) return std::nullopt;
  auto node = by_due_.extract(by_due_.begin());
  due_of_.erase(node.key().second);
  return std::make_pair(node.key().first, std::move(node.mapped()));
}

std::optional<clock::time_point> timer_queue::next_due() const {
  if (by_due_.empty()) return std::nullopt;
  return by_due_.begin()->first.first;
}

void timer_queue::clear() noexcept {
  by_due_.clear();
  due_of_.clear();
}

void deliver(const caf::actor& target, caf::message msg) {
  if (!target) return;
  target->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(msg)),
                  nullptr);
}

} // namespace detail

// -- real_clock -------------------------------------------------------------------------------

real_clock::real_clock() : thread_([this] { run(); }) {}

real_clock::~real_clock() {
  stop();
}

clock::time_point real_clock::now() const noexcept {
  return std::chrono::time_point_cast<duration>(std::chrono::steady_clock::now());
}

int64_t real_clock::wall_ms() const noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

clock::timer_id real_clock::schedule(time_point due, caf::actor target, caf::message msg) {
  timer_id id;
  bool earliest = false;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (stopping_) return 0;
    earliest = due < wake_at_;
    id = queue_.add(due, std::move(target), std::move(msg));
  }
  // Wake the timer thread only when it sleeps past this timer (a wake-up per schedule
  // costs a context switch on the hot path of every sleep and kill timer). While awake it
  // looks at the queue again before it sleeps.
  if (earliest) cv_.notify_one();
  return id;
}

bool real_clock::cancel(timer_id id) noexcept {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_.remove(id);
}

size_t real_clock::pending() const noexcept {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_.size();
}

void real_clock::stop() noexcept {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> guard{mtx_};
  queue_.clear();
}

void real_clock::run() {
  std::unique_lock<std::mutex> lock{mtx_};
  while (!stopping_) {
    if (auto due = queue_.pop_due(now())) {
      lock.unlock();
      detail::deliver(due->second.target, std::move(due->second.msg));
      lock.lock();
      continue;
    }
    auto next = queue_.next_due();
    wake_at_ = next ? *next : time_point::max();
    if (next)
      cv_.wait_until(lock, std::chrono::steady_clock::time_point{next->time_since_epoch()});
    else
      cv_.wait(lock);
    wake_at_ = time_point::min(); // awake: a schedule needs no notification
  }
}

// -- virtual_clock ----------------------------------------------------------------------------

clock::time_point virtual_clock::now() const noexcept {
  std::lock_guard<std::mutex> guard{mtx_};
  return now_;
}

clock::timer_id virtual_clock::schedule(time_point due, caf::actor target, caf::message msg) {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_.add(due, std::move(target), std::move(msg));
}

bool virtual_clock::cancel(timer_id id) noexcept {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_.remove(id);
}

size_t virtual_clock::pending() const noexcept {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_.size();
}

std::optional<clock::time_point> virtual_clock::next_due() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_.next_due();
}

size_t virtual_clock::fire_until(time_point target) {
  size_t fired = 0;
  for (;;) {
    std::optional<std::pair<time_point, detail::timer_queue::entry>> due;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      due = queue_.pop_due(target);
      if (!due) {
        if (now_ < target) now_ = target;
        return fired;
      }
      if (now_ < due->first) now_ = due->first;
    }
    detail::deliver(due->second.target, std::move(due->second.msg));
    ++fired;
    if (on_fire_) on_fire_();
  }
}

size_t virtual_clock::advance(duration d) {
  if (d.count() < 0) d = duration::zero();
  return fire_until(now() + d);
}

bool virtual_clock::advance_to_next() {
  auto next = next_due();
  if (!next) return false;
  fire_until(*next);
  return true;
}

void virtual_clock::clear() noexcept {
  std::lock_guard<std::mutex> guard{mtx_};
  queue_.clear();
}

} // namespace troupe
