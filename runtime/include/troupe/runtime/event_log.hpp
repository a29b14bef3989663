#pragma once

// Moved: the durable-work clients are the durable/ module now. This forwarding header stays
// for one release.
#warning "<troupe/runtime/event_log.hpp> moved to <troupe/durable/event_log.hpp>"

#include "troupe/durable/event_log.hpp"
