#include <map>

#include <caf/all.hpp>

#include "primitive_actors.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::atoms;

/// A shared cell (one entry under the empty key), map, or atomic counter: JSON values, each
/// with the version of its last write. Versions come from one counter that grows with every
/// write, so a snapshot's version identifies exactly the write it saw.
class shared_actor final : public shared_actor_type::base {
 public:
  shared_actor(caf::actor_config& cfg, primitive_kind kind, std::string name,
               std::optional<nlohmann::json> initial)
      : shared_actor_type::base(cfg), name_(std::move(name)) {
    // One engine for all three kinds: a cell uses the empty key, an atomic adds to it.
    // An initial value is written at creation, atomically with it (checked by the opener).
    if (!initial) return;
    if (kind == primitive_kind::map) {
      for (auto& [k, v] : initial->items())
        write(k, v);
    } else {
      write(std::string{}, std::move(*initial));
    }
  }

  const char* name() const override { return "troupe.shared"; }

  behavior_type make_behavior() override {
    return {
        [this](sh_get_atom, const std::string& key) {
          ++m_.reads;
          return read(key);
        },
        [this](sh_set_atom, const std::string& key, nlohmann::json& value) {
          auto prev = read(key);
          write(key, std::move(value));
          return prev;
        },
        [this](sh_cas_atom, const std::string& key, const nlohmann::json& expected,
               uint64_t version, bool by_version, nlohmann::json& value) {
          auto cur = read(key);
          bool ok;
          if (by_version) {
            ok = cur.version == version;
            if (!ok) ++m_.stale_reads;
          } else {
            ok = cur.present ? cur.value == expected : expected.is_null();
          }
          if (ok) {
            ++m_.cas_successes;
            write(key, std::move(value));
          } else {
            ++m_.cas_failures;
          }
          return ok;
        },
        [this](sh_del_atom, const std::string& key) {
          auto i = entries_.find(key);
          if (i == entries_.end() || !i->second.present) return false;
          // A tombstone keeps the delete's version: a snapshot from before it is stale.
          ++m_.writes;
          i->second.value = nullptr;
          i->second.present = false;
          i->second.version = ++m_.version;
          return true;
        },
        [this](sh_entries_atom) {
          ++m_.reads;
          auto out = nlohmann::json::object();
          for (auto& kvp : entries_)
            if (kvp.second.present) out[kvp.first] = kvp.second.value;
          return out;
        },
        [this](sh_add_atom, const std::string& key, int64_t delta) -> caf::result<int64_t> {
          auto prev = read_int(key);
          if (!prev) return std::move(prev.error());
          int64_t next = 0;
          if (__builtin_add_overflow(*prev, delta, &next)) // refused, the value unchanged
            return make_error(errc::invalid_argument, "delta",
                              "adding " + std::to_string(delta) + " to " +
                                  std::to_string(*prev) + " overflows a 64-bit integer");
          write(key, next);
          return *prev;
        },
        [this](sh_cas_int_atom, const std::string& key, int64_t expected,
               int64_t desired) -> caf::result<bool> {
          auto now = read_int(key);
          if (!now) return std::move(now.error());
          if (*now != expected) {
            ++m_.cas_failures;
            return false;
          }
          ++m_.cas_successes;
          write(key, desired);
          return true;
        },
        [this](sh_metrics_atom) { return m_; },
    };
  }

 private:
  struct entry {
    nlohmann::json value;
    uint64_t version = 0;
    bool present = true; // false: a tombstone
  };

  versioned read(const std::string& key) const {
    auto i = entries_.find(key);
    if (i == entries_.end()) return versioned{nullptr, 0, false};
    return versioned{i->second.value, i->second.version, i->second.present};
  }

  /// Returns an atomic's integer (0 when absent), or `wrong_type`.
  caf::expected<int64_t> read_int(const std::string& key) const {
    auto cur = read(key);
    if (!cur.present) return int64_t{0};
    if (!cur.value.is_number_integer() ||
        (cur.value.is_number_unsigned() &&
         cur.value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
      return make_error(errc::wrong_type, "key",
                        "\"" + key + "\" of \"" + name_ + "\" does not hold a 64-bit signed integer");
    return cur.value.get<int64_t>();
  }

  void write(const std::string& key, nlohmann::json value) {
    ++m_.writes;
    auto& e = entries_[key];
    e.value = std::move(value);
    e.present = true;
    e.version = ++m_.version;
  }

  std::string name_;
  std::map<std::string, entry, std::less<>> entries_;
  shared_metrics m_;
};

} // namespace

caf::actor spawn_shared(caf::actor_system& sys, primitive_kind kind, std::string name,
                        std::optional<nlohmann::json> initial) {
  return caf::actor_cast<caf::actor>(sys.spawn<shared_actor>(kind, std::move(name), std::move(initial)));
}

} // namespace troupe::detail
