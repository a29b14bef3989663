#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

namespace troupe::detail {

/// Returns the length of the UTF-8 sequence at `x[i]`, or 0 when it is not valid UTF-8
/// (a bad lead byte, a truncated or overlong sequence, a surrogate, above U+10FFFF).
inline size_t utf8_sequence(std::string_view x, size_t i) noexcept {
  auto c = static_cast<unsigned char>(x[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > x.size()) return 0;
  uint32_t cp = n == 1 ? c : c & (0x7fu >> n);
  for (size_t k = 1; k < n; ++k) {
    auto d = static_cast<unsigned char>(x[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3fu);
  }
  static constexpr uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

/// Returns whether `x` is valid UTF-8.
inline bool valid_utf8(std::string_view x) noexcept {
  for (size_t i = 0; i < x.size();) {
    auto n = utf8_sequence(x, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// Returns whether every string and key in `j` is valid UTF-8 (so `dump()` cannot throw for
/// it): a walk, much cheaper than serialising.
inline bool json_utf8(const nlohmann::json& j) {
  if (j.is_string()) return valid_utf8(j.get_ref<const std::string&>());
  if (j.is_object()) {
    for (auto& [k, v] : j.items())
      if (!valid_utf8(k) || !json_utf8(v)) return false;
    return true;
  }
  if (j.is_array()) {
    for (auto& v : j)
      if (!json_utf8(v)) return false;
  }
  return true;
}

} // namespace troupe::detail
