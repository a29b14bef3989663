#pragma once

// The vocabulary of the runtime's stop choreography and of OS signals.

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <string>

#include "troupe/actors/context.hpp"

namespace troupe {

/// Something an operator should know about the runtime, e.g. a stop step that overran its
/// bound: `kind` ("stop.lanes", "stop.services", "stop.participant", "stop.durability",
/// "interrupt.handler"), `subject` (what: a lane, a participant's name) and `detail` (what
/// still holds it).
struct runtime_notice {
  std::string kind;
  std::string subject;
  std::string detail;
};

/// What an interrupt handler asks for once it has run.
enum class interrupt_action : uint8_t {
  /// Go on: once every handler ran, the stop choreography starts (the default).
  stop,
  /// The signal is absorbed (a SIGHUP that reloads): no stop, unless another handler asks.
  resume,
};

/// Which signals a handler listens to (a bit set).
enum interrupt_signal : unsigned {
  on_sigint = 1u << 0,
  on_sigterm = 1u << 1,
  on_sighup = 1u << 2,
  on_any_signal = on_sigint | on_sigterm | on_sighup,
};

/// Options of `runtime::on_interrupt`.
struct interrupt_options {
  /// The signals this handler runs for.
  unsigned signals = on_any_signal;
  /// Run for the first matching signal only, then unregister.
  bool once = false;
  /// How long the handler may run; past it, it is cancelled, named in `notices()`, and
  /// counts as `interrupt_action::stop`.
  std::chrono::milliseconds graceful_timeout{5000};
};

/// An interrupt handler: runs on a task (never inside the OS signal handler) with the signal
/// number, and says whether the stop choreography should follow.
using interrupt_handler = std::function<task<interrupt_action>(context&, int)>;

/// A stop participant: a body the stop choreography runs and awaits (step 4) within its grace.
using stop_body = std::function<task<void>(context&)>;

} // namespace troupe
