#pragma once

/// The whole public API of troupe.

#include "troupe/actors/channel.hpp"
#include "troupe/actors/context.hpp"
#include "troupe/actors/mailbox.hpp"
#include "troupe/actors/pool.hpp"
#include "troupe/actors/shared.hpp"
#include "troupe/actors/sync.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/actors/task_child.hpp"
#include "troupe/actors/task_handle.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/runtime/clocks.hpp"
#include "troupe/runtime/config.hpp"
#include "troupe/durable/channels.hpp"
#include "troupe/durable/event_log.hpp"
#include "troupe/durable/pool_triggers.hpp"
#include "troupe/durable/rate_limit.hpp"
#include "troupe/runtime/runtime.hpp"
#include "troupe/runtime/supervision.hpp"
#include "troupe/actors/service.hpp"
