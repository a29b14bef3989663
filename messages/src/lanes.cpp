#include "troupe/messages/lanes.hpp"

#include <set>

#include "troupe/messages/errc.hpp"

namespace troupe {

std::string_view to_string(lane_kind x) noexcept {
  switch (x) {
    case lane_kind::serial:
      return "serial";
    case lane_kind::concurrent:
      return "concurrent";
    case lane_kind::unbounded:
      return "unbounded";
  }
  return "unknown";
}

caf::error validate_lanes(const std::vector<lane_decl>& lanes) {
  if (lanes.empty()) return {};
  std::set<std::string, std::less<>> names;
  std::optional<size_t> default_at;
  for (size_t i = 0; i < lanes.size(); ++i) {
    auto& l = lanes[i];
    auto field = "lanes[" + std::to_string(i) + "]";
    if (l.name.empty()) return make_error(errc::invalid_lane, field, "a lane needs a name");
    auto quoted = "lane \"" + l.name + "\"";
    if (!names.insert(l.name).second)
      return make_error(errc::invalid_lane, field, quoted + " is declared twice");
    switch (l.kind) {
      case lane_kind::serial:
        if (l.width != 1)
          return make_error(errc::invalid_lane, field, quoted + ": a serial lane has width 1");
        break;
      case lane_kind::concurrent:
        if (l.width < 1)
          return make_error(errc::invalid_lane, field,
                            quoted + ": width " + std::to_string(l.width) +
                                "; concurrent(n) needs n >= 1");
        break;
      case lane_kind::unbounded:
        if (l.width != 0)
          return make_error(errc::invalid_lane, field, quoted + ": an unbounded lane has no width");
        break;
      default:
        return make_error(errc::invalid_lane, field, quoted + ": unknown lane kind");
    }
    if (l.is_default) {
      if (default_at)
        return make_error(errc::invalid_lane, field,
                          quoted + " is a second default lane (the first is \"" +
                              lanes[*default_at].name + "\")");
      if (l.kind != lane_kind::unbounded)
        return make_error(errc::invalid_lane, field,
                          quoted + ": the default lane is always unbounded");
      default_at = i;
    }
  }
  if (!default_at)
    return make_error(errc::invalid_lane, "lanes",
                      "no default lane: declare exactly one (lane_decl::default_lane)");
  return {};
}

caf::error validate(const job_policy& p) {
  using namespace std::chrono;
  if (p.backoff_base.count() < 0)
    return make_error(errc::undeclarable_pacing, "backoff_base", "the backoff base is negative");
  if (p.backoff_cap.count() <= 0)
    return make_error(errc::undeclarable_pacing, "backoff_cap", "a backoff cap of zero or less");
  if (p.backoff_cap < p.backoff_base)
    return make_error(errc::undeclarable_pacing, "backoff_cap",
                      "the cap (" + std::to_string(duration_cast<milliseconds>(p.backoff_cap).count()) +
                          " ms) is below the base (" +
                          std::to_string(duration_cast<milliseconds>(p.backoff_base).count()) +
                          " ms)");
  if (p.timeout.count() <= 0)
    return make_error(errc::undeclarable_pacing, "timeout", "an attempt timeout of zero or less");
  return {};
}

uint32_t backoff_jitter_permille(uint32_t index) noexcept {
  // splitmix64 of index + 1: a fixed, well-spread hash; no random source.
  uint64_t z = static_cast<uint64_t>(index) + 1 + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z % 100);
}

clock::duration backoff_delay(const job_policy& p, uint32_t index) noexcept {
  using rep = clock::duration::rep;
  auto cap = p.backoff_cap.count();
  rep d = p.backoff_base.count();
  for (uint32_t i = 0; i < index && d < cap; ++i)
    d = d > cap / 2 ? cap : d * 2; // saturates at the cap, never overflows
  d = std::min(d, cap);
  auto j = static_cast<rep>(backoff_jitter_permille(index));
  auto extra = d / 1000 * j + (d % 1000) * j / 1000;
  auto max = std::numeric_limits<rep>::max();
  return clock::duration{d > max - extra ? max : d + extra};
}

} // namespace troupe
