// pipeline_rest_for_one: producer -> transformer -> sink under rest_for_one. Killing the
// transformer restarts it and the sink (which depends on it), not the producer.
// Virtual time: the run is exact and instant.
#include <cstdio>
#include <string>

#include <troupe/troupe.hpp>

namespace {

/// A pipeline stage: a task body run as a supervised child (here it only idles).
troupe::child_spec stage_spec(std::string name) {
  troupe::child_spec c;
  c.name = std::move(name);
  c.start = troupe::task_child([](troupe::context& cx) -> troupe::task<void> {
    for (;;)
      co_await cx.sleep(std::chrono::hours(1));
  });
  return c;
}

void print(const char* title, const troupe::supervisor_state& st) {
  std::printf("%s\n", title);
  for (auto& c : st.children)
    std::printf("  %-12s %-8s restarts=%llu actor=%llu\n", c.name.c_str(),
                troupe::to_string(c.status), static_cast<unsigned long long>(c.restarts),
                static_cast<unsigned long long>(c.actor ? c.actor.id() : 0));
}

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) return 1;
  troupe::supervisor_spec spec;
  spec.name = "pipeline";
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 3;
  spec.children = {stage_spec("producer"), stage_spec("transformer"), stage_spec("sink")};
  auto sup = rt->supervise(spec);
  if (!sup) {
    std::printf("%s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  auto before = rt->supervisor_state_of(*sup);
  if (!before) return 1;
  print("before:", *before);
  std::printf("\nkilling the transformer...\n\n");
  caf::anon_send_exit(before->children[1].actor, caf::exit_reason::kill);
  rt->drain();
  auto after = rt->supervisor_state_of(*sup);
  if (!after) return 1;
  print("after:", *after);
  bool producer_kept = after->children[0].actor == before->children[0].actor;
  bool rest_restarted = after->children[1].actor != before->children[1].actor &&
                        after->children[2].actor != before->children[2].actor;
  std::printf("\nproducer untouched: %s; transformer and sink restarted: %s\n",
              producer_kept ? "yes" : "NO", rest_restarted ? "yes" : "NO");
  (void)rt->supervisor_stop(*sup, std::chrono::seconds(1));
  rt->stop();
  return producer_kept && rest_restarted ? 0 : 1;
}
