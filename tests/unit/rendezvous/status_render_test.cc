// Status snapshot rendering (JSON, table) and the HTTP routes, pure.

#include "rendezvous/status/status_render.h"

#include <gtest/gtest.h>

#include "rendezvous/status/status_http.h"
#include "rendezvous/status/status_proto.h"

namespace meshrun::rdzv {
namespace {

StatusSnapshot Example() {
  StatusSnapshot snapshot;
  snapshot.now_unix_ms = 1700000000000;
  RunStatusRecord& run = snapshot.runs.emplace_back();
  run.run_id = "job42";
  run.state = "active";
  run.round = 2;
  run.restart_count = 1;
  run.max_restarts = 3;
  run.min_nodes = 2;
  run.max_nodes = 2;
  run.world_size = 4;
  run.nodes.push_back({"node-a", "10.0.0.1", "participant", 0, 2, 0, 1200});
  run.nodes.push_back({"node-b", "10.0.0.2", "participant", 1, 2, 2, 300});
  FailureStatusRecord& failure = run.last_failure.emplace();
  failure.round = 1;
  failure.node_id = "node-b";
  failure.host = "10.0.0.2";
  failure.detail = "[3]:\n  rank : 3";
  FailureCauseRecord& cause = failure.cause.emplace();
  cause.exit = {1, 3, 7, 0, 1700000000123};
  cause.message = "ValueError: bad \"batch\"";
  cause.traceback = "Traceback:\n  File \"train.py\", line 3\nValueError";
  NodeExitsRecord& exits = run.worker_exits.emplace_back();
  exits.node_id = "node-b";
  exits.host = "10.0.0.2";
  exits.round = 1;
  exits.exits.push_back({0, 2, -1, 15, 1700000000200});
  exits.exits.push_back({1, 3, 7, 0, 1700000000123});
  run.stragglers.push_back({1, 31.25, 29.0, 120, 117});
  run.slow_ranks.push_back({3, "node-b", "10.0.0.2", 0.0314, 2.5, 40});
  return snapshot;
}

TEST(StatusRenderTest, Json) {
  EXPECT_EQ(
      RenderStatusJson(Example()),
      R"({"now_unix_ms":1700000000000,"runs":[{"run_id":"job42","state":"active",)"
      R"("outcome":"","closed_reason":"","round":2,"restart_count":1,"max_restarts":3,)"
      R"("min_nodes":2,"max_nodes":2,"world_size":4,"nodes":[)"
      R"({"node_id":"node-a","host":"10.0.0.1","state":"participant","group_rank":0,)"
      R"("nproc":2,"rank_base":0,"ranks":[0,1],"heartbeat_age_ms":1200},)"
      R"({"node_id":"node-b","host":"10.0.0.2","state":"participant","group_rank":1,)"
      R"("nproc":2,"rank_base":2,"ranks":[2,3],"heartbeat_age_ms":300}],)"
      R"("last_failure":{"round":1,"node_id":"node-b","host":"10.0.0.2","root_cause":)"
      R"({"exit":{"local_rank":1,"global_rank":3,"exit_code":7,"signal":0,)"
      R"("description":"exit 7","time_unix_ms":1700000000123},)"
      R"("message":"ValueError: bad \"batch\"",)"
      R"("traceback":"Traceback:\n  File \"train.py\", line 3\nValueError"},)"
      R"("detail":"[3]:\n  rank : 3"},"worker_exits":[{"node_id":"node-b",)"
      R"("host":"10.0.0.2","round":1,"exits":[{"local_rank":0,"global_rank":2,)"
      R"("exit_code":-1,"signal":15,"description":"SIGTERM","time_unix_ms":1700000000200},)"
      R"({"local_rank":1,"global_rank":3,"exit_code":7,"signal":0,"description":"exit 7",)"
      R"("time_unix_ms":1700000000123}]}],"stragglers":[{"replica":1,"mean_lag_ms":31.3,)"
      R"("last_lag_ms":29,"quorums":120,"slowest":117}],)"
      R"("slow_ranks":[{"rank":3,"node_id":"node-b","host":"10.0.0.2","mean_step_ms":31.4,)"
      R"("times_median":2.5,"steps":40}]}]})");
}

// The daemon's build, when it names one, beside the time.
TEST(StatusRenderTest, JsonCarriesTheDaemonsVersion) {
  StatusSnapshot snapshot;
  snapshot.now_unix_ms = 5;
  snapshot.version = "0.1.0";
  snapshot.commit = "0123456789ab-dirty";
  EXPECT_EQ(
      RenderStatusJson(snapshot),
      R"({"now_unix_ms":5,"version":"0.1.0","commit":"0123456789ab-dirty","runs":[]})");
}

// A daemon replica on etcd says its term and whether etcd answers, in the
// JSON, the table and through the Status RPC's proto.
TEST(StatusRenderTest, EtcdLeadershipInJsonTableAndProto) {
  StatusSnapshot snapshot;
  snapshot.now_unix_ms = 5;
  snapshot.etcd = EtcdStatusRecord{7, false, "10.0.0.1:2379"};
  EXPECT_EQ(RenderStatusJson(snapshot),
            R"({"now_unix_ms":5,"etcd":{"leader_term":7,"reachable":false,)"
            R"("member":"10.0.0.1:2379"},"runs":[]})");
  EXPECT_EQ(RenderStatusTable(snapshot),
            "etcd: UNREACHABLE (leading in term 7, last member 10.0.0.1:2379): runs keep "
            "their round; no new round and no store write is acknowledged until it is "
            "back\nno runs\n");
  const StatusSnapshot back = FromProto(ToProto(snapshot));
  ASSERT_TRUE(back.etcd.has_value());
  EXPECT_EQ(back.etcd->leader_term, 7u);
  EXPECT_FALSE(back.etcd->reachable);
  EXPECT_EQ(back.etcd->member, "10.0.0.1:2379");

  snapshot.etcd->reachable = true;
  snapshot.runs = Example().runs;
  const std::string table = RenderStatusTable(snapshot);
  EXPECT_EQ(table.rfind("etcd: leading in term 7, member 10.0.0.1:2379\nrun ", 0), 0u)
      << table;
  EXPECT_FALSE(FromProto(ToProto(StatusSnapshot{})).etcd.has_value());
}

TEST(StatusRenderTest, JsonEscapesControlBytesAndInvalidUtf8) {
  StatusSnapshot snapshot;
  RunStatusRecord& run = snapshot.runs.emplace_back();
  run.run_id = std::string("a\x01z\xff") + "\xc3\xa9" + "\xe2\x82";  // é, then cut
  std::string json = RenderStatusJson(snapshot);
  EXPECT_NE(json.find(R"("run_id":"a\u0001z\ufffd)"
                      "\xc3\xa9"
                      R"(\ufffd\ufffd")"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("nodes":[],"last_failure":null,"worker_exits":[])"),
            std::string::npos);
}

TEST(StatusRenderTest, Table) {
  const std::string table = RenderStatusTable(Example(), /*max_traceback_lines=*/2);
  EXPECT_EQ(
      table,
      "run job42: active, round 2, restarts 1/3, nodes 2..2, world size 4\n"
      "  NODE    HOST      STATE        GROUP_RANK  RANKS  NPROC  HEARTBEAT_AGE\n"
      "  node-a  10.0.0.1  participant  0           0-1    2      1.2s\n"
      "  node-b  10.0.0.2  participant  1           2-3    2      0.3s\n"
      "  last failure: round 1, node node-b on 10.0.0.2: rank 3 (local 1) exit 7 at "
      "2023-11-14 22:13:20.123 UTC\n"
      "    message: ValueError: bad \"batch\"\n"
      "    traceback (last 2 lines):\n"
      "        File \"train.py\", line 3\n"
      "      ValueError\n"
      "  worker exits, round 1, node-b: rank 2 SIGTERM, rank 3 exit 7\n"
      "  replica group 1: 31.2 ms behind the first at the step quorum (mean), last at "
      "117 "
      "of 120\n"
      "  slow rank 3 on node-b: 31.4 ms a step, 2.50x the median\n");
  EXPECT_EQ(RenderStatusTable(StatusSnapshot{}), "no runs\n");
}

TEST(StatusRenderTest, TableOfAbandonedAndClosedRunsWithoutNodes) {
  StatusSnapshot snapshot;
  RunStatusRecord& abandoned = snapshot.runs.emplace_back();
  abandoned.run_id = "left";
  abandoned.state = "abandoned";
  abandoned.round = 2;
  abandoned.min_nodes = abandoned.max_nodes = 1;
  RunStatusRecord& closed = snapshot.runs.emplace_back();
  closed.run_id = "gone";
  closed.state = "closed";
  closed.outcome = "aborted";
  closed.closed_reason = "no live node for 15000ms: every node left or expired";
  closed.round = 2;
  closed.min_nodes = closed.max_nodes = 1;
  EXPECT_EQ(
      RenderStatusTable(snapshot),
      "run left: abandoned, round 2, restarts 0/0, nodes 1..1, world size 0\n"
      "  (no live nodes: the run ends as aborted unless a node joins within one "
      "lease)\n"
      "\n"
      "run gone: closed (aborted), round 2, restarts 0/0, nodes 1..1, world size 0\n"
      "  closed: no live node for 15000ms: every node left or expired\n"
      "  (no nodes)\n");
}

StatusRoutes Routes() {
  StatusRoutes routes;
  routes.metrics_text = [] { return std::string("m 1\n"); };
  routes.status_json = [](const std::string& run_id) {
    return run_id == "gone" ? std::string() : "{\"run\":\"" + run_id + "\"}";
  };
  return routes;
}

TEST(StatusRoutesTest, PathsMethodsAndContentTypes) {
  HttpReply metrics = RouteStatusRequest(Routes(), "GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.body, "m 1\n");
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");

  HttpReply status = RouteStatusRequest(Routes(), "GET", "/api/status?run=a%2Fb+c&x=1");
  EXPECT_EQ(status.status, 200);
  EXPECT_EQ(status.content_type, "application/json");
  EXPECT_EQ(status.body, "{\"run\":\"a/b c\"}");
  EXPECT_EQ(RouteStatusRequest(Routes(), "GET", "/api/status?run=gone").status, 404);

  HttpReply page = RouteStatusRequest(Routes(), "HEAD", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("/api/status"), std::string::npos);
  // Self-contained: nothing loaded from elsewhere.
  EXPECT_EQ(page.body.find("http://"), std::string::npos);
  EXPECT_EQ(page.body.find("https://"), std::string::npos);
  EXPECT_EQ(page.body.find("innerHTML"), std::string::npos);

  EXPECT_EQ(RouteStatusRequest(Routes(), "GET", "/nope").status, 404);
  EXPECT_EQ(RouteStatusRequest(Routes(), "GET", "/metrics/").status, 404);
  HttpReply post = RouteStatusRequest(Routes(), "POST", "/metrics");
  EXPECT_EQ(post.status, 405);
  ASSERT_EQ(post.headers.size(), 1u);
  EXPECT_EQ(post.headers[0].first, "Allow");
  EXPECT_EQ(RouteStatusRequest(Routes(), "DELETE", "/api/status").status, 405);
  EXPECT_EQ(RouteStatusRequest(Routes(), "POST", "/nope").status, 404);
}

}  // namespace
}  // namespace meshrun::rdzv
