#include "troupe/actors/context.hpp"

namespace troupe {

task_error::task_error(caf::error err) : err_(std::move(err)), what_(render(err_)) {}

namespace detail {

caf::error error_from_current_exception(const char* field) {
  try {
    throw;
  } catch (const task_cancelled&) {
    return make_error(errc::cancelled, "", "the task was cancelled and stopped at an await");
  } catch (const task_error& e) {
    return e.error();
  } catch (const std::exception& e) {
    return make_error(errc::task_failed, field, e.what());
  } catch (...) {
    return make_error(errc::task_failed, field, "a non-standard exception (not std::exception)");
  }
}

caf::error blocking_error_from_current_exception() {
  try {
    throw;
  } catch (const task_error& e) {
    return e.error();
  } catch (const std::exception& e) {
    return make_error(errc::blocking_failed, "fn", e.what());
  } catch (...) {
    return make_error(errc::blocking_failed, "fn", "a non-standard exception (not std::exception)");
  }
}

caf::error task_gone_error() {
  return make_error(errc::cancelled, "handle",
                    "the task is gone: stopped by its owner or by the runtime");
}

caf::error check_handle(task_actor* self, const std::shared_ptr<handle_state>& st) {
  if (!st || (!st->actor && !st->ticket))
    return make_error(errc::invalid_handle, "handle", "the task handle is empty");
  if (st->runtime != &self->env())
    return make_error(errc::foreign_task, "handle",
                      "task " + st->id + " belongs to another runtime");
  return {};
}

} // namespace detail

// -- context ----------------------------------------------------------------------------------

const std::string& context::task_id() const noexcept {
  return self_->task_id();
}
std::string context::parent_task_id() const {
  return std::string{self_->parent_id()};
}
std::string context::root_task_id() const {
  return std::string{self_->root_id()};
}
std::string context::task_group_id() const {
  return self_->group_id();
}
std::string context::name() const {
  return std::string{self_->task_name()};
}
std::string context::new_group_id() {
  return self_->new_group_id();
}
bool context::is_cancelled() const noexcept {
  return self_->cancel_requested();
}
clock::time_point context::now() const noexcept {
  return self_->env().clock->now();
}
troupe::clock& context::clock() const noexcept {
  return *self_->env().clock;
}
caf::event_based_actor* context::self() const noexcept {
  return self_;
}
const task_locals& context::locals() const noexcept {
  return self_->locals();
}
void context::locals(task_locals x) {
  self_->locals(std::move(x));
}

std::optional<std::any> context::erase_local(std::string_view key) {
  auto& m = locals();
  if (!m) return std::nullopt;
  auto i = m->find(key);
  if (i == m->end()) return std::nullopt;
  std::optional<std::any> previous{i->second};
  auto copy = std::make_shared<std::remove_const_t<task_locals::element_type>>(*m);
  copy->erase(std::string{key});
  locals(std::move(copy));
  return previous;
}

} // namespace troupe
