#pragma once

// Internal: defines TROUPE_UNDER_ASAN in a build with AddressSanitizer (clang or GCC).
// troupe's own allocators (the recycler, the actor slab) step aside there, so ASan sees
// every block and every use after free.

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TROUPE_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(TROUPE_UNDER_ASAN)
#define TROUPE_UNDER_ASAN 1
#endif
