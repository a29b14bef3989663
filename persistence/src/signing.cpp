#include "signing.hpp"

#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace troupe::detail {

namespace {

std::string hex(const unsigned char* data, size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 0xf]);
  }
  return out;
}

void field(std::string& out, const std::string& x) {
  out += std::to_string(x.size());
  out += ':';
  out += x;
}

} // namespace

std::string new_signing_key() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof(raw)) != 1)
    throw std::runtime_error("RAND_bytes failed: no signing key");
  return hex(raw, sizeof(raw));
}

std::string sign_receipt(const std::string& key, const channel_receipt& r) {
  std::string msg;
  msg.reserve(64 + r.name_resolved.size() + r.emitted_at.scope.size() +
              r.emitted_at.scope_id.size() + r.emitted_at.emitted_by.size());
  field(msg, std::to_string(r.emitted_at.at_ms));
  field(msg, std::to_string(r.event_id));
  field(msg, r.name_resolved);
  field(msg, r.emitted_at.scope);
  field(msg, r.emitted_at.scope_id);
  field(msg, r.emitted_at.emitted_by);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len) == nullptr)
    throw std::runtime_error("HMAC-SHA-256 failed");
  return hex(mac, len);
}

bool verify_receipt(const std::string& key, const channel_receipt& r) {
  auto expected = sign_receipt(key, r);
  auto& got = r.emitted_at.sig;
  return got.size() == expected.size() &&
         CRYPTO_memcmp(got.data(), expected.data(), expected.size()) == 0;
}

} // namespace troupe::detail
