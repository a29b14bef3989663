#pragma once

// Moved: the durable-work clients are the durable/ module now. This forwarding header stays
// for one release.
#warning "<troupe/runtime/channels.hpp> moved to <troupe/durable/channels.hpp>"

#include "troupe/durable/channels.hpp"
