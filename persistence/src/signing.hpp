#pragma once

// Receipt signatures: HMAC-SHA-256 (OpenSSL's libcrypto) under a key kept in the database.

#include <string>

#include "troupe/messages/durable.hpp"

namespace troupe::detail {

/// Returns a fresh key: 32 random bytes (OpenSSL's CSPRNG), hex encoded. Throws
/// `std::runtime_error` when the generator fails.
std::string new_signing_key();

/// Returns the hex HMAC-SHA-256 under `key` of the receipt's signed fields (at_ms, event_id,
/// name_resolved, scope, scope_id, emitted_by), each length-prefixed so no two field lists
/// encode alike.
std::string sign_receipt(const std::string& key, const channel_receipt& r);

/// Returns whether `r.emitted_at.sig` is the signature of its fields (constant-time compare).
bool verify_receipt(const std::string& key, const channel_receipt& r);

} // namespace troupe::detail
