#include "troupe/runtime/simulation.hpp"

#include <cstdio>
#include <map>
#include <mutex>
#include <random>

#include <caf/scheduled_actor.hpp>

#include "runtime_impl.hpp"

namespace troupe {

namespace {

uint64_t mix(uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_text(std::string_view x) noexcept {
  uint64_t h = 1469598103934665603ull; // FNV-1a
  for (unsigned char c : x)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

} // namespace

struct simulation::hooks final : detail::sim_hooks {
  explicit hooks(uint64_t s) : seed(s), picks(mix(s)) {}

  void trace(std::string_view kind, std::string_view subject, std::string_view detail) override {
    std::lock_guard<std::mutex> guard{mtx};
    entries.push_back({now_us(), std::string{kind}, std::string{subject}, std::string{detail}});
  }

  bool fault(std::string_view point, std::string_view subject) override {
    double p = 0;
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (point == "job.attempt")
        p = plan.job_attempt;
      else if (point == "service.exit")
        p = plan.service_exit;
      else if (point == "storage.write")
        p = plan.storage_write;
    }
    if (p <= 0) return false;
    uint64_t n = 0;
    {
      std::lock_guard<std::mutex> guard{mtx};
      n = counters[std::string{point}]++;
    }
    // A draw from (seed, point, occasion): the same seed fires the same faults.
    auto h = mix(seed ^ mix(hash_text(point) + n));
    auto u = static_cast<double>(h >> 11) * 0x1.0p-53;
    bool fires = u < p;
    if (fires) trace("fault", point, subject);
    return fires;
  }

  int64_t now_us() const noexcept {
    if (clock == nullptr) return 0;
    return std::chrono::duration_cast<std::chrono::microseconds>(clock->now().time_since_epoch())
        .count();
  }

  uint64_t seed;
  std::mt19937_64 picks;
  troupe::clock* clock = nullptr;
  mutable std::mutex mtx;
  fault_plan plan;
  std::map<std::string, uint64_t> counters;
  std::vector<trace_entry> entries;
  bool steps = true;
};

simulation::simulation(uint64_t seed, runtime::builder b) : hooks_(std::make_unique<hooks>(seed)) {
  auto rt = b.virtual_time(true).build();
  if (!rt) {
    err_ = std::move(rt.error());
    return;
  }
  rt_.emplace(std::move(*rt));
  auto& impl = *rt_->impl_;
  hooks_->clock = &impl.clk();
  impl.env.sim = hooks_.get();
  auto* h = hooks_.get();
  impl.services->write_fault = [h] { return h->fault("storage.write", "storage"); };
  impl.pick = [h](size_t n) -> size_t { return n <= 1 ? 0 : static_cast<size_t>(h->picks() % n); };
  impl.on_step = [h](caf::resumable* r) {
    if (!h->steps) return;
    auto* a = dynamic_cast<caf::scheduled_actor*>(r);
    if (a == nullptr) return;
    h->trace("run", std::string{a->name()} + "#" + std::to_string(a->id()), {});
  };
}

simulation::~simulation() {
  if (rt_) rt_->stop(); // while the hooks still exist
}

uint64_t simulation::seed() const noexcept {
  return hooks_->seed;
}

void simulation::faults(fault_plan p) {
  std::lock_guard<std::mutex> guard{hooks_->mtx};
  hooks_->plan = p;
}

void simulation::trace_steps(bool on) {
  hooks_->steps = on;
}

size_t simulation::run_for(clock::duration d) {
  if (!rt_) return 0;
  return rt_->advance(d);
}

void simulation::mark(std::string subject, std::string detail) {
  hooks_->trace("mark", subject, detail);
}

std::vector<trace_entry> simulation::trace() const {
  std::lock_guard<std::mutex> guard{hooks_->mtx};
  return hooks_->entries;
}

std::vector<trace_entry> simulation::events() const {
  std::vector<trace_entry> out;
  std::lock_guard<std::mutex> guard{hooks_->mtx};
  for (auto& e : hooks_->entries)
    if (e.kind != "run") out.push_back(e);
  return out;
}

std::string simulation::render(const std::vector<trace_entry>& xs) {
  std::string out;
  char buf[64];
  for (auto& e : xs) {
    std::snprintf(buf, sizeof(buf), "%+12.3fms ", static_cast<double>(e.at_us) / 1000.0);
    out += buf;
    out += e.kind;
    out += ' ';
    out += e.subject;
    if (!e.detail.empty()) {
      out += ' ';
      out += e.detail;
    }
    out += '\n';
  }
  return out;
}

} // namespace troupe
