#pragma once

// Moved: the durable-work clients are the durable/ module now. This forwarding header stays
// for one release.
#warning "<troupe/runtime/rate_limit.hpp> moved to <troupe/durable/rate_limit.hpp>"

#include "troupe/durable/rate_limit.hpp"
