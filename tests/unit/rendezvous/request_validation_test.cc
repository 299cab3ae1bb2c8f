// Every field of every request: what is accepted, and the one-line reason
// naming the field and the limit when it is not.

#include "rendezvous/core/request_validation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "absl/strings/match.h"

namespace meshrun::rdzv {
namespace {

namespace v1 = meshrun::v1;

v1::JoinRequest GoodJoin() {
  v1::JoinRequest join;
  join.set_run_id("job-1");
  join.set_node_id("host_42_deadbeef");
  join.set_host("node01.cluster");
  join.set_nproc(8);
  join.set_node_rank_hint(-1);
  join.set_master_port(29500);
  auto* config = join.mutable_config();
  config->set_min_nodes(1);
  config->set_max_nodes(4);
  config->set_keep_alive_interval_ms(5000);
  config->set_keep_alive_max_attempt(3);
  return join;
}

std::string Message(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

const RequestLimits kLimits;

TEST(ValidateIdTest, PrintableAsciiWithinTheLimit) {
  EXPECT_TRUE(ValidateId("f", "a", kLimits).ok());
  EXPECT_TRUE(ValidateId("f", std::string(256, 'x'), kLimits).ok());
  EXPECT_EQ(Message(ValidateId("f", "", kLimits)), "f: must not be empty");
  EXPECT_EQ(Message(ValidateId("f", std::string(257, 'x'), kLimits)),
            "f: 257 bytes exceeds the limit of 256");
  EXPECT_EQ(
      Message(ValidateId("f", "a b", kLimits)),
      "f: byte 0x20 at offset 1 is not allowed (printable ASCII without spaces only)");
  EXPECT_FALSE(ValidateId("f", "a\nb", kLimits).ok());
  EXPECT_FALSE(ValidateId("f", std::string("a\0b", 3), kLimits).ok());
  EXPECT_FALSE(ValidateId("f", "caf\xc3\xa9", kLimits).ok());
  EXPECT_FALSE(ValidateId("f", "\x7f", kLimits).ok());
}

TEST(ValidateJoinTest, AcceptsAGoodJoin) {
  EXPECT_TRUE(ValidateJoin(GoodJoin(), kLimits).ok());
  auto join = GoodJoin();
  join.set_host("");  // not offered
  join.set_node_rank_hint(3);
  join.set_master_port(0);
  EXPECT_TRUE(ValidateJoin(join, kLimits).ok());
}

TEST(ValidateJoinTest, NamesEachBadField) {
  struct Case {
    std::function<void(v1::JoinRequest&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j.set_run_id(""); }, "join.run_id: must not be empty"},
      {[](auto& j) { j.set_node_id(std::string(300, 'n')); },
       "join.node_id: 300 bytes exceeds the limit of 256"},
      {[](auto& j) { j.set_host(std::string(254, 'h')); },
       "join.host: 254 bytes exceeds the limit of 253"},
      {[](auto& j) { j.set_host("evil\nMASTER_PORT=1"); },
       "join.host: byte 0x0a at offset 4 is not allowed (printable ASCII without spaces "
       "only)"},
      {[](auto& j) { j.set_nproc(0); }, "join.nproc: must be at least 1"},
      {[](auto& j) { j.set_nproc(65537); }, "join.nproc: 65537 is above 65536"},
      {[](auto& j) { j.set_node_rank_hint(-2); },
       "join.node_rank_hint: -2 is below -1 (none)"},
      {[](auto& j) { j.set_node_rank_hint(4); },
       "join.node_rank_hint: 4 is not below max_nodes (4)"},
      {[](auto& j) { j.clear_config(); }, "join.config: is required"},
      {[](auto& j) { j.mutable_config()->set_min_nodes(0); },
       "join.config.min_nodes: must be at least 1"},
      {[](auto& j) { j.mutable_config()->set_max_nodes(0); },
       "join.config.max_nodes: must be at least 1"},
      {[](auto& j) { j.mutable_config()->set_min_nodes(5); },
       "join.config.min_nodes: 5 is above max_nodes (4)"},
      {[](auto& j) { j.mutable_config()->set_max_nodes(100001); },
       "join.config.max_nodes: 100001 is above 100000"},
      {[](auto& j) { j.mutable_config()->set_max_restarts(UINT32_MAX); },
       "join.config.max_restarts: 4294967295 is above 1000000"},
      {[](auto& j) { j.mutable_config()->set_keep_alive_max_attempt(UINT32_MAX); },
       "join.config.keep_alive_max_attempt: 4294967295 is above 1000000"},
      {[](auto& j) {
         j.mutable_config()->set_keep_alive_interval_ms(4000000000u);
         j.mutable_config()->set_keep_alive_max_attempt(1000);
       },
       "join.config.keep_alive_interval_ms: times keep_alive_max_attempt is "
       "4000000000000 "
       "ms, above the limit of 31622400000"},
      {[](auto& j) { j.set_master_port(65536); },
       "join.master_port: 65536 is above 65535"},
  };
  for (const Case& c : cases) {
    auto join = GoodJoin();
    c.change(join);
    EXPECT_EQ(Message(ValidateJoin(join, kLimits)), c.message);
  }
}

TEST(ValidateRendezvousTest, AKeepAlivesStepTimesAreFiniteAndAtMostANodesWorth) {
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_run_id("r");
  heartbeat.set_node_id("n");
  v1::RankStepTime* step = heartbeat.add_step_times();
  step->set_rank(3);
  step->set_mean_seconds(0.25);
  EXPECT_TRUE(ValidateHeartbeat(heartbeat, kLimits).ok());
  step->set_mean_seconds(std::nan(""));
  EXPECT_EQ(Message(ValidateHeartbeat(heartbeat, kLimits)),
            "heartbeat.step_times.mean_seconds: must be a finite number of seconds");
  step->set_mean_seconds(-1);
  EXPECT_FALSE(ValidateHeartbeat(heartbeat, kLimits).ok());
  step->set_mean_seconds(1);
  for (uint32_t i = 0; i < kLimits.max_nproc; ++i) *heartbeat.add_step_times() = *step;
  EXPECT_TRUE(absl::StartsWith(Message(ValidateHeartbeat(heartbeat, kLimits)),
                               "heartbeat.step_times: "));
}

TEST(ValidateRendezvousTest, AHealthReportIsBoundedAndNamesItsCheck) {
  v1::HealthReport report;
  report.set_run_id("r");
  report.set_node_id("n");
  report.set_host("node1");
  report.set_check("nvidia-smi");
  report.set_outcome("exit 9");
  report.set_output(std::string(16 << 10, 'o'));
  EXPECT_TRUE(ValidateHealthReport(report, kLimits).ok());
  report.set_output(std::string((16 << 10) + 1, 'o'));
  EXPECT_EQ(Message(ValidateHealthReport(report, kLimits)),
            "health.output: 16385 bytes exceeds the limit of 16384");
  report.set_output("");
  report.set_check("");
  EXPECT_EQ(Message(ValidateHealthReport(report, kLimits)),
            "health.check: must not be empty");
  report.set_check("true");
  report.set_node_id("");
  EXPECT_EQ(Message(ValidateHealthReport(report, kLimits)),
            "health.node_id: must not be empty");
}

TEST(ValidateRendezvousTest, OtherRequests) {
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_run_id("r");
  heartbeat.set_node_id("n");
  EXPECT_TRUE(ValidateHeartbeat(heartbeat, kLimits).ok());
  heartbeat.set_node_id("");
  EXPECT_EQ(Message(ValidateHeartbeat(heartbeat, kLimits)),
            "heartbeat.node_id: must not be empty");

  v1::FailureReport failure;
  failure.set_run_id("r");
  failure.set_node_id("n");
  failure.set_round(1);
  failure.set_detail(std::string(64 << 10, 't'));
  EXPECT_TRUE(ValidateFailureReport(failure, kLimits).ok());
  failure.set_detail(std::string((64 << 10) + 1, 't'));
  EXPECT_EQ(Message(ValidateFailureReport(failure, kLimits)),
            "failure.detail: 65537 bytes exceeds the limit of 65536");
  failure.set_detail("");
  failure.set_round(0);
  EXPECT_EQ(Message(ValidateFailureReport(failure, kLimits)),
            "failure.round: must be at least 1");
  failure.set_round(1);
  failure.set_replica_restarts(2);
  EXPECT_EQ(Message(ValidateFailureReport(failure, kLimits)),
            "failure.replica_restarts: is set without failure.replica");
  failure.set_replica(0);  // its bound (the world size) is the core's to check
  EXPECT_TRUE(ValidateFailureReport(failure, kLimits).ok());

  v1::SuccessReport success;
  success.set_run_id("r");
  success.set_node_id("n");
  EXPECT_EQ(Message(ValidateSuccessReport(success, kLimits)),
            "success.round: must be at least 1");
  success.set_round(7);
  EXPECT_TRUE(ValidateSuccessReport(success, kLimits).ok());

  v1::LeaveRequest leave;
  leave.set_run_id("r r");
  leave.set_node_id("n");
  EXPECT_FALSE(ValidateLeave(leave, kLimits).ok());

  v1::CloseRequest close;
  close.set_run_id("r");
  close.set_outcome(v1::OUTCOME_FAILED);
  EXPECT_TRUE(ValidateClose(close, kLimits).ok());
  close.set_outcome(v1::OUTCOME_UNSPECIFIED);
  EXPECT_EQ(Message(ValidateClose(close, kLimits)),
            "close.outcome: 0 is not one of SUCCEEDED (1), FAILED (2), ABORTED (3)");
  close.set_outcome(static_cast<v1::RunOutcome>(99));
  EXPECT_FALSE(ValidateClose(close, kLimits).ok());
}

TEST(ValidateStoreRequestTest, OperationNamespaceAndKeyCounts) {
  v1::StoreRequest request;
  request.set_ns("job/r1");
  EXPECT_EQ(Message(ValidateStoreRequest(request, kLimits)),
            "store.op: the request names no operation");
  request.mutable_set()->set_key("k");
  EXPECT_TRUE(ValidateStoreRequest(request, kLimits).ok());
  request.set_ns("");  // a namespace like any other
  EXPECT_TRUE(ValidateStoreRequest(request, kLimits).ok());
  request.set_ns(std::string(1025, 'n'));
  EXPECT_EQ(Message(ValidateStoreRequest(request, kLimits)),
            "store.ns: 1025 bytes exceeds the limit of 1024");
  request.set_ns(std::string("a\0b", 3));
  EXPECT_EQ(Message(ValidateStoreRequest(request, kLimits)),
            "store.ns: must not contain NUL bytes");
  request.set_ns("job");

  RequestLimits small;
  small.max_keys_per_request = 2;
  auto* wait = request.mutable_wait();
  EXPECT_TRUE(ValidateStoreRequest(request, small).ok());  // empty: answered at once
  for (int i = 0; i < 3; ++i) wait->add_keys("k");
  EXPECT_EQ(Message(ValidateStoreRequest(request, small)),
            "store.wait.keys: 3 is above 2");
  for (int i = 0; i < 3; ++i) request.mutable_check()->add_keys("k");
  EXPECT_EQ(Message(ValidateStoreRequest(request, small)),
            "store.check.keys: 3 is above 2");
  for (int i = 0; i < 3; ++i) request.mutable_multi_get()->add_keys("k");
  EXPECT_EQ(Message(ValidateStoreRequest(request, small)),
            "store.multi_get.keys: 3 is above 2");
  for (int i = 0; i < 3; ++i) request.mutable_multi_set()->add_entries()->set_key("k");
  EXPECT_EQ(Message(ValidateStoreRequest(request, small)),
            "store.multi_set.entries: 3 is above 2");
}

}  // namespace
}  // namespace meshrun::rdzv
