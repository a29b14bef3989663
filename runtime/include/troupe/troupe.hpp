#pragma once

/// The whole public API of troupe.

#include "troupe/actors/channel.hpp"
#include "troupe/actors/context.hpp"
#include "troupe/actors/mailbox.hpp"
#include "troupe/actors/shared.hpp"
#include "troupe/actors/sync.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/actors/task_child.hpp"
#include "troupe/actors/task_handle.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/runtime/clocks.hpp"
#include "troupe/runtime/config.hpp"
#include "troupe/runtime/channels.hpp"
#include "troupe/runtime/event_log.hpp"
#include "troupe/runtime/rate_limit.hpp"
#include "troupe/runtime/runtime.hpp"
#include "troupe/runtime/supervision.hpp"
#include "troupe/supervision/service.hpp"
