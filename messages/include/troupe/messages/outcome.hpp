#pragma once

#include <memory>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/error.hpp>

namespace troupe {

/// Returns nothing: carries a task's value between actors of one process.
/// `value` points to a `T` known to both ends through the typed `task_handle<T>`
/// (null for `task<void>`); `err` is set when the task did not produce a value.
/// Local only: a task result never crosses the network in this form.
struct outcome_box {
  std::shared_ptr<void> value;
  caf::error err;
};

} // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::outcome_box)
