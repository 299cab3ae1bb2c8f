// WorkerEnv: torchrun's and meshrun's worker variables, parsed and validated
// (pure: an environment map in, a value or one clear error out).

#include "worker_lib/env/worker_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>

namespace meshrun::worker {
namespace {

using Env = std::map<std::string, std::string>;

// What meshrun gives worker 5 of 8 (two nodes of four), as in
// tests/integration/launcher_test.cc.
Env MeshrunEnv() {
  return {
      {"LOCAL_RANK", "1"},
      {"RANK", "5"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_RANK", "5"},
      {"ROLE_NAME", "default"},
      {"ROLE_WORLD_SIZE", "8"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"WORLD_SIZE", "8"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29500"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "job42"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCHELASTIC_ERROR_FILE", "/tmp/logs/job42/attempt_2/1/error.json"},
      {"OMP_NUM_THREADS", "1"},
      {"MESHRUN_STORE_ENDPOINT", "127.0.0.1:40321"},
      {"MESHRUN_STORE_PREFIX", "job42/r3"},
  };
}

Env Without(Env env, std::initializer_list<const char*> names) {
  for (const char* name : names) env.erase(name);
  return env;
}

Env With(Env env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}

std::string ErrorOf(const Env& env) {
  auto parsed = ParseWorkerEnv(env);
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(WorkerEnvTest, ParsesEverythingMeshrunSets) {
  auto parsed = ParseWorkerEnv(MeshrunEnv());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const WorkerEnv& env = *parsed;
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.group_world_size, 2);
  EXPECT_EQ(env.role_rank, 5);
  EXPECT_EQ(env.role_name, "default");
  EXPECT_EQ(env.role_world_size, 8);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.max_restarts, 3);
  EXPECT_EQ(env.run_id, "job42");
  EXPECT_FALSE(env.use_agent_store);
  EXPECT_EQ(env.error_file, "/tmp/logs/job42/attempt_2/1/error.json");
  EXPECT_EQ(env.store_endpoint, "127.0.0.1:40321");
  EXPECT_EQ(env.store_prefix, "job42/r3");
  EXPECT_TRUE(env.has_meshrun_store());
}

TEST(WorkerEnvTest, TorchrunEnvironmentHasNoMeshrunStore) {
  auto parsed = ParseWorkerEnv(
      Without(MeshrunEnv(), {"MESHRUN_STORE_ENDPOINT", "MESHRUN_STORE_PREFIX"}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->has_meshrun_store());
  EXPECT_FALSE(parsed->store_prefix.has_value());
}

TEST(WorkerEnvTest, MinimalEnvDefaultsTheOptionalParts) {
  Env minimal{{"RANK", "0"},
              {"WORLD_SIZE", "1"},
              {"LOCAL_RANK", "0"},
              {"MASTER_ADDR", "localhost"},
              {"MASTER_PORT", "1234"}};
  auto parsed = ParseWorkerEnv(minimal);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->local_world_size.has_value());
  EXPECT_FALSE(parsed->group_rank.has_value());
  EXPECT_FALSE(parsed->role_name.has_value());
  EXPECT_FALSE(parsed->run_id.has_value());
  EXPECT_FALSE(parsed->error_file.has_value());
  EXPECT_EQ(parsed->restart_count, 0);
  EXPECT_EQ(parsed->max_restarts, 0);
  EXPECT_FALSE(parsed->has_meshrun_store());
}

TEST(WorkerEnvTest, OutsideALauncherNamesEveryMissingVariable) {
  auto parsed = ParseWorkerEnv({{"PATH", "/usr/bin"}});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(parsed.status().message(),
            "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set: start "
            "this program with meshrun (or torchrun)");
}

TEST(WorkerEnvTest, OneMissingVariableIsNamedAlone) {
  EXPECT_EQ(ErrorOf(Without(MeshrunEnv(), {"RANK"})),
            "RANK is not set: start this program with meshrun (or torchrun)");
  EXPECT_EQ(ErrorOf(Without(MeshrunEnv(), {"MASTER_PORT"})),
            "MASTER_PORT is not set: start this program with meshrun (or torchrun)");
}

struct BadValue {
  const char* name;
  const char* value;
  const char* message;
};

class WorkerEnvBadValue : public ::testing::TestWithParam<BadValue> {};

TEST_P(WorkerEnvBadValue, IsNamedWithItsValueAndRule) {
  const BadValue& bad = GetParam();
  auto parsed = ParseWorkerEnv(With(MeshrunEnv(), bad.name, bad.value));
  ASSERT_FALSE(parsed.ok()) << bad.name << "=" << bad.value;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), bad.message);
}

INSTANTIATE_TEST_SUITE_P(
    Table, WorkerEnvBadValue,
    ::testing::Values(
        BadValue{"RANK", "abc", "RANK='abc' is not an integer"},
        BadValue{"RANK", "", "RANK='' is not an integer"},
        BadValue{"RANK", "3x", "RANK='3x' is not an integer"},
        BadValue{"RANK", "99999999999", "RANK='99999999999' is not an integer"},
        BadValue{"RANK", "8",
                 "RANK=8 is out of range: WORLD_SIZE is 8 (0 <= RANK < WORLD_SIZE)"},
        BadValue{"RANK", "-1",
                 "RANK=-1 is out of range: WORLD_SIZE is 8 (0 <= RANK < WORLD_SIZE)"},
        BadValue{"WORLD_SIZE", "0", "WORLD_SIZE=0 is invalid: it must be at least 1"},
        BadValue{"LOCAL_RANK", "4",
                 "LOCAL_RANK=4 is out of range: LOCAL_WORLD_SIZE is 4 (0 <= LOCAL_RANK < "
                 "LOCAL_WORLD_SIZE)"},
        BadValue{"LOCAL_WORLD_SIZE", "9",
                 "LOCAL_WORLD_SIZE=9 is larger than WORLD_SIZE=8"},
        BadValue{"GROUP_RANK", "2",
                 "GROUP_RANK=2 is out of range: GROUP_WORLD_SIZE is 2 (0 <= GROUP_RANK < "
                 "GROUP_WORLD_SIZE)"},
        BadValue{"ROLE_RANK", "8",
                 "ROLE_RANK=8 is out of range: ROLE_WORLD_SIZE is 8 (0 <= ROLE_RANK < "
                 "ROLE_WORLD_SIZE)"},
        BadValue{"MASTER_PORT", "70000", "MASTER_PORT=70000 is not a port (1..65535)"},
        BadValue{"MASTER_PORT", "0", "MASTER_PORT=0 is not a port (1..65535)"},
        BadValue{"MASTER_ADDR", " ",
                 "MASTER_ADDR is empty: start this program with meshrun (or torchrun)"},
        BadValue{"TORCHELASTIC_RESTART_COUNT", "-2",
                 "TORCHELASTIC_RESTART_COUNT=-2 is invalid: it must be at least 0"},
        BadValue{"TORCHELASTIC_USE_AGENT_STORE", "maybe",
                 "TORCHELASTIC_USE_AGENT_STORE='maybe' is not a boolean (True or False)"},
        BadValue{"MESHRUN_STORE_ENDPOINT", "127.0.0.1",
                 "MESHRUN_STORE_ENDPOINT='127.0.0.1' is not host:port or a list of them"},
        BadValue{"MESHRUN_STORE_ENDPOINT", "host:0",
                 "MESHRUN_STORE_ENDPOINT='host:0' is not host:port or a list of them"},
        BadValue{"MESHRUN_STORE_ENDPOINT", "a:1,,b:2",
                 "MESHRUN_STORE_ENDPOINT='a:1,,b:2' is not host:port or a list of them"},
        BadValue{"MESHRUN_STORE_PREFIX", "", "MESHRUN_STORE_PREFIX is empty"}));

TEST(WorkerEnvTest, MeshrunStoreVariablesComeTogether) {
  EXPECT_EQ(ErrorOf(Without(MeshrunEnv(), {"MESHRUN_STORE_PREFIX"})),
            "MESHRUN_STORE_ENDPOINT is set but MESHRUN_STORE_PREFIX is not: meshrun sets "
            "both");
  EXPECT_EQ(ErrorOf(Without(MeshrunEnv(), {"MESHRUN_STORE_ENDPOINT"})),
            "MESHRUN_STORE_PREFIX is set but MESHRUN_STORE_ENDPOINT is not: meshrun sets "
            "both");
}

TEST(WorkerEnvTest, AcceptsIpv6EndpointsAndSpacesAroundNumbers) {
  auto parsed = ParseWorkerEnv(
      With(With(MeshrunEnv(), "MESHRUN_STORE_ENDPOINT", "[::1]:29400"), "RANK", " 5 "));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->store_endpoint, "[::1]:29400");
  EXPECT_EQ(parsed->rank, 5);
}

// meshrun --rdzv-endpoint=A,B: the daemon replicas, as a list.
TEST(WorkerEnvTest, AcceptsAListOfDaemonReplicas) {
  auto parsed = ParseWorkerEnv(
      With(MeshrunEnv(), "MESHRUN_STORE_ENDPOINT", "10.0.0.1:29400,[::1]:29401,node2:1"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->store_endpoint, "10.0.0.1:29400,[::1]:29401,node2:1");
}

TEST(WorkerEnvTest, AgentStoreFlag) {
  auto parsed =
      ParseWorkerEnv(With(MeshrunEnv(), "TORCHELASTIC_USE_AGENT_STORE", "True"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->use_agent_store);
}

TEST(WorkerEnvTest, LocalRankWithoutLocalWorldSizeIsCheckedAgainstWorldSize) {
  Env env = Without(MeshrunEnv(), {"LOCAL_WORLD_SIZE"});
  EXPECT_TRUE(ParseWorkerEnv(With(env, "LOCAL_RANK", "7")).ok());
  EXPECT_EQ(
      ErrorOf(With(env, "LOCAL_RANK", "8")),
      "LOCAL_RANK=8 is out of range: WORLD_SIZE is 8 (0 <= LOCAL_RANK < WORLD_SIZE)");
}

TEST(WorkerEnvTest, FromProcessEnvironmentReadsEnviron) {
  for (const auto& [name, value] : MeshrunEnv()) setenv(name.c_str(), value.c_str(), 1);
  auto parsed = WorkerEnvFromProcessEnvironment();
  for (const auto& [name, value] : MeshrunEnv()) unsetenv(name.c_str());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rank, 5);
  EXPECT_EQ(parsed->store_prefix, "job42/r3");
}

TEST(WorkerEnvTest, Loopback) {
  for (const char* host : {"localhost", "127.0.0.1", "127.1.2.3", "::1"})
    EXPECT_TRUE(IsLoopbackAddress(host)) << host;
  for (const char* host : {"10.0.0.1", "node0", "128.0.0.1", ""})
    EXPECT_FALSE(IsLoopbackAddress(host)) << host;
}

}  // namespace
}  // namespace meshrun::worker
