#include "troupe/messages/types.hpp"

#include <caf/actor_system_config.hpp>

#include "troupe/messages/abort.hpp"
#include "troupe/messages/cancel.hpp"
#include "troupe/messages/cluster.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/durable.hpp"
#include "troupe/messages/json.hpp"
#include "troupe/messages/lanes.hpp"
#include "troupe/messages/messaging.hpp"
#include "troupe/messages/outcome.hpp"
#include "troupe/messages/pool.hpp"
#include "troupe/messages/storage.hpp"
#include "troupe/messages/supervision.hpp"

namespace troupe {

namespace {

/// Calls `add(type_tag<T>, name)` for every payload that may cross a node: the one list.
template <class F>
void for_each_remote_type(F add) {
  // tasks and combinators
  add.template operator()<abort_reason>("troupe.abort_reason");
  add.template operator()<abort_state>("troupe.abort_state");
  add.template operator()<remote_outcome>("troupe.remote_outcome");
  add.template operator()<cancel_mode>("troupe.cancel_mode");
  // messaging and shared state
  add.template operator()<nlohmann::json>("troupe.json");
  // an error's causes (errors_of: all_failed, start_failed) travel in its context
  add.template operator()<std::vector<caf::error>>("std::vector<caf.error>");
  add.template operator()<scope_kind>("troupe.scope_kind");
  add.template operator()<queue_metrics>("troupe.queue_metrics");
  add.template operator()<shared_metrics>("troupe.shared_metrics");
  add.template operator()<versioned>("troupe.versioned");
  add.template operator()<sync_kind>("troupe.sync_kind");
  add.template operator()<sync_metrics>("troupe.sync_metrics");
  // lanes and jobs
  add.template operator()<lane_kind>("troupe.lane_kind");
  add.template operator()<lane_decl>("troupe.lane_decl");
  add.template operator()<lane_metrics>("troupe.lane_metrics");
  add.template operator()<value_batch>("troupe.value_batch");
  add.template operator()<primitive_kind>("troupe.primitive_kind");
  // supervision
  add.template operator()<child_kind>("troupe.child_kind");
  add.template operator()<child_status>("troupe.child_status");
  add.template operator()<child_state>("troupe.child_state");
  add.template operator()<std::vector<child_state>>("std::vector<troupe.child_state>");
  add.template operator()<child_counts>("troupe.child_counts");
  add.template operator()<supervisor_metrics>("troupe.supervisor_metrics");
  add.template operator()<supervisor_status>("troupe.supervisor_status");
  add.template operator()<supervisor_state>("troupe.supervisor_state");
  add.template operator()<supervisor_event_kind>("troupe.supervisor_event_kind");
  add.template operator()<supervisor_event>("troupe.supervisor_event");
  add.template operator()<std::vector<supervisor_event>>("std::vector<troupe.supervisor_event>");
  // storage and durable work
  add.template operator()<runtime_service>("troupe.runtime_service");
  add.template operator()<event_receipt>("troupe.event_receipt");
  add.template operator()<std::vector<event_receipt>>("std::vector<troupe.event_receipt>");
  add.template operator()<event_record>("troupe.event_record");
  add.template operator()<std::vector<event_record>>("std::vector<troupe.event_record>");
  add.template operator()<payload_batch>("troupe.payload_batch");
  add.template operator()<storage_metrics>("troupe.storage_metrics");
  add.template operator()<emitted_at>("troupe.emitted_at");
  add.template operator()<channel_receipt>("troupe.channel_receipt");
  add.template operator()<channel_event>("troupe.channel_event");
  add.template operator()<std::vector<channel_event>>("std::vector<troupe.channel_event>");
  add.template operator()<channel_write>("troupe.channel_write");
  add.template operator()<channel_binding>("troupe.channel_binding");
  add.template operator()<channel_match>("troupe.channel_match");
  add.template operator()<channel_metrics>("troupe.channel_metrics");
  add.template operator()<rate_bucket>("troupe.rate_bucket");
  add.template operator()<std::vector<rate_bucket>>("std::vector<troupe.rate_bucket>");
  add.template operator()<rate_attempt>("troupe.rate_attempt");
  // worker pools
  add.template operator()<pool_queue_kind>("troupe.pool_queue_kind");
  add.template operator()<pool_backpressure_kind>("troupe.pool_backpressure_kind");
  add.template operator()<pool_on_full>("troupe.pool_on_full");
  add.template operator()<pool_scope>("troupe.pool_scope");
  add.template operator()<pool_audit>("troupe.pool_audit");
  add.template operator()<pool_task_status>("troupe.pool_task_status");
  add.template operator()<pool_queue_spec>("troupe.pool_queue_spec");
  add.template operator()<pool_backpressure_spec>("troupe.pool_backpressure_spec");
  add.template operator()<pool_spec>("troupe.pool_spec");
  add.template operator()<pool_task_snapshot>("troupe.pool_task_snapshot");
  add.template operator()<pool_snapshot>("troupe.pool_snapshot");
  add.template operator()<pool_row>("troupe.pool_row");
  add.template operator()<pool_restart>("troupe.pool_restart");
  add.template operator()<runner_lifecycle>("troupe.runner_lifecycle");
  add.template operator()<pool_runners_spec>("troupe.pool_runners_spec");
  add.template operator()<pool_remote_spec>("troupe.pool_remote_spec");
  add.template operator()<runner_slot_state>("troupe.runner_slot_state");
  add.template operator()<runner_state>("troupe.runner_state");
  add.template operator()<std::vector<pool_row>>("std::vector<troupe.pool_row>");
  // clusters
  add.template operator()<member_status>("troupe.member_status");
  add.template operator()<member_info>("troupe.member_info");
  add.template operator()<member_state>("troupe.member_state");
  add.template operator()<cluster_event_kind>("troupe.cluster_event_kind");
  add.template operator()<cluster_event>("troupe.cluster_event");
  add.template operator()<global_name>("troupe.global_name");
  add.template operator()<join_reply>("troupe.join_reply");
  add.template operator()<std::vector<member_info>>("std::vector<troupe.member_info>");
  add.template operator()<std::vector<member_state>>("std::vector<troupe.member_state>");
  add.template operator()<std::vector<cluster_event>>("std::vector<troupe.cluster_event>");
  add.template operator()<std::vector<global_name>>("std::vector<troupe.global_name>");
}

} // namespace

void add_message_types(caf::actor_system_config& cfg) {
  for_each_remote_type([&cfg]<class T>(const char* name) {
    static_assert(!is_local_only_v<T>, "a local-only type cannot be registered for remote use");
    cfg.add_message_type<T>(name);
  });
}

const std::vector<std::string>& remote_type_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for_each_remote_type([&out]<class T>(const char* name) { out.emplace_back(name); });
    return out;
  }();
  return names;
}

} // namespace troupe
