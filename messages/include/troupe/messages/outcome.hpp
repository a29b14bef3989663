#pragma once

#include <memory>
#include <type_traits>

#include <caf/error.hpp>
#include <caf/sec.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>

#include "troupe/messages/types.hpp"

namespace troupe {

/// Returns nothing: carries a task's value between actors of one process.
/// `value` points to a `T` known to both ends through the typed `task_handle<T>`
/// (null for `task<void>`); `err` is set when the task did not produce a value.
/// Local only: a task result never crosses the network in this form.
struct outcome_box {
  std::shared_ptr<void> value;
  caf::error err;
};

/// A task's outcome in a form that crosses nodes: the value inside a `caf::message` (its
/// type registered with `add_message_type` on both nodes; empty for `task<void>`), or the
/// error. `to_remote_outcome<T>` / `from_remote_outcome<T>` convert from and to the local box.
struct remote_outcome {
  caf::message value;
  caf::error err;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, remote_outcome& x) {
  return f(caf::meta::type_name("troupe.remote_outcome"), x.value, x.err);
}

/// Returns `box` (holding a `T`, or nothing for void) as a remote outcome.
template <class T>
[[nodiscard]] remote_outcome to_remote_outcome(const outcome_box& box) {
  remote_outcome out;
  out.err = box.err;
  if constexpr (!std::is_void_v<T>) {
    if (!box.err && box.value) out.value = caf::make_message(*static_cast<T*>(box.value.get()));
  }
  return out;
}

/// Returns the local box of a remote outcome that should hold a `T`: a value of another
/// type is the error `caf::sec::unexpected_response`.
template <class T>
[[nodiscard]] outcome_box from_remote_outcome(const remote_outcome& x) {
  outcome_box out;
  out.err = x.err;
  if constexpr (!std::is_void_v<T>) {
    if (!x.err) {
      if (x.value.match_elements<T>())
        out.value = std::make_shared<T>(x.value.get_as<T>(0));
      else
        out.err = caf::make_error(caf::sec::unexpected_response);
    }
  }
  return out;
}

} // namespace troupe

// Points into this process's memory: remote_outcome is its serialisable form.
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::outcome_box)
