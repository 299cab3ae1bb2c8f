#include "launcher/launch_config.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace meshrun::launcher {
namespace {

using std::chrono::milliseconds;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

constexpr char kRunId[] = "standalone-run-id";

HostProbe FakeHost(int cpus = 8, int gpus = 0) {
  HostProbe host;
  host.cpu_count = [cpus] { return cpus; };
  host.gpu_count = [gpus] { return gpus; };
  host.new_run_id = [] { return std::string(kRunId); };
  return host;
}

absl::StatusOr<LaunchConfig> Parse(const Args& args, const Env& env = {},
                                   const HostProbe& host = FakeHost()) {
  return ParseLaunchArgs(args, env, host);
}

// The config, or a failed expectation and a default config.
LaunchConfig MustParse(const Args& args, const Env& env = {},
                       const HostProbe& host = FakeHost()) {
  absl::StatusOr<LaunchConfig> config = Parse(args, env, host);
  EXPECT_TRUE(config.ok()) << absl::StrJoin(args, " ") << ": " << config.status();
  return config.ok() ? *config : LaunchConfig{};
}

// The error message, or "<ok>" when parsing succeeded.
std::string ErrorOf(const Args& args, const Env& env = {},
                    const HostProbe& host = FakeHost()) {
  absl::StatusOr<LaunchConfig> config = Parse(args, env, host);
  if (config.ok()) return "<ok>";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

Args With(Args flags, const Args& tail = {"train.py"}) {
  flags.insert(flags.end(), tail.begin(), tail.end());
  return flags;
}

std::string Underscored(const std::string& flag) {
  std::string out = flag;
  std::replace(out.begin() + 2, out.end(), '-', '_');
  return out;
}

std::string PetName(const std::string& flag) {
  return "PET_" + absl::AsciiStrToUpper(Underscored(flag).substr(2));
}

// --- Defaults ------------------------------------------------------------------

// torchrun 2 with no rendezvous flag on one node: static, no endpoint, no
// --master-port, so c10d on localhost:0 with a fresh run id (run.py's rule).
TEST(LaunchConfigTest, DefaultsMatchTorchrun) {
  LaunchConfig config = MustParse({"train.py"});
  EXPECT_TRUE(config.help_text.empty());
  EXPECT_EQ(config.min_nodes, 1);
  EXPECT_EQ(config.max_nodes, 1);
  EXPECT_EQ(config.nproc_per_node_spec, "1");
  EXPECT_EQ(config.nproc_per_node, 1);
  EXPECT_EQ(config.rdzv_backend, RdzvBackend::kDynamic);
  EXPECT_EQ(config.rdzv_endpoint, (HostPort{"localhost", 0}));
  EXPECT_FALSE(config.rdzv_endpoint_given);
  EXPECT_EQ(config.rdzv_id, kRunId);
  EXPECT_EQ(config.rdzv_conf.join_timeout, milliseconds(600000));
  EXPECT_EQ(config.rdzv_conf.last_call_timeout, milliseconds(30000));
  EXPECT_EQ(config.rdzv_conf.close_timeout, milliseconds(30000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_interval, milliseconds(5000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_max_attempt, 3);
  EXPECT_EQ(config.rdzv_conf.read_timeout, milliseconds(60000));
  EXPECT_FALSE(config.rdzv_conf.is_host.has_value());
  EXPECT_TRUE(config.standalone);
  EXPECT_EQ(config.max_restarts, 0);
  EXPECT_EQ(config.monitor_interval, milliseconds(100));
  EXPECT_EQ(config.role, "default");
  EXPECT_FALSE(config.module);
  EXPECT_FALSE(config.no_python);
  EXPECT_FALSE(config.run_path);
  EXPECT_EQ(config.log_dir, "");
  EXPECT_EQ(config.redirects, StdStreamsSpec{});
  EXPECT_EQ(config.tee, StdStreamsSpec{});
  EXPECT_TRUE(config.local_ranks_filter.empty());
  EXPECT_EQ(config.node_rank, -1);
  EXPECT_FALSE(config.node_rank_given);
  EXPECT_EQ(config.master_addr, "127.0.0.1");
  EXPECT_EQ(config.master_port, 29500);
  EXPECT_EQ(config.local_addr, "");
  EXPECT_EQ(config.shutdown_timeout, milliseconds(30000));
  EXPECT_EQ(config.signals_to_handle,
            (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(config.signals_to_handle_text, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_FALSE(config.virtual_local_rank);
  EXPECT_EQ(config.log_line_prefix_template, "[${role_name}${local_rank}]:");
  EXPECT_EQ(config.script, "train.py");
  EXPECT_TRUE(config.script_args.empty());
  EXPECT_EQ(config.worker_argv, (Args{"python3", "-u", "train.py"}));
  EXPECT_TRUE(config.notices.empty());
}

// --- Every flag: both spellings, "=" and separate value, PET_*, flag wins -----

struct FlagCase {
  std::string flag;         // dash spelling
  std::string value;        // empty for switches
  std::string other_value;  // a different valid value, to show the flag wins
  Args extra;               // other flags the case needs
  std::function<void(const LaunchConfig&)> check;
};

std::vector<FlagCase> FlagCases() {
  return {
      {"--nnodes",
       "2:4",
       "1:3",
       {"--rdzv-backend=c10d"},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.min_nodes, 2);
         EXPECT_EQ(c.max_nodes, 4);
       }},
      {"--nproc-per-node",
       "3",
       "5",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.nproc_per_node, 3); }},
      {"--rdzv-backend",
       "c10d",
       "static",
       {},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.rdzv_backend, RdzvBackend::kDynamic);
         EXPECT_FALSE(c.standalone);
       }},
      {"--rdzv-endpoint",
       "node0:1234",
       "other:1",
       {},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.rdzv_endpoint, (HostPort{"node0", 1234}));
         EXPECT_TRUE(c.rdzv_endpoint_given);
       }},
      {"--rdzv-id",
       "job7",
       "job8",
       {"--rdzv-backend=c10d"},
       [](const LaunchConfig& c) { EXPECT_EQ(c.rdzv_id, "job7"); }},
      {"--rdzv-conf",
       "join_timeout=5",
       "join_timeout=9",
       {},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.rdzv_conf.join_timeout, milliseconds(5000));
       }},
      {"--standalone",
       "",
       "",
       {},
       [](const LaunchConfig& c) { EXPECT_TRUE(c.standalone); }},
      {"--max-restarts",
       "3",
       "4",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.max_restarts, 3); }},
      {"--restart-scope",
       "replica",
       "job",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.restart_scope, RestartScope::kReplica); }},
      {"--replica-size",
       "2",
       "4",
       {"--restart-scope=replica", "--nproc-per-node=4"},
       [](const LaunchConfig& c) { EXPECT_EQ(c.replica_size, 2); }},
      {"--worker-store",
       "daemon",
       "agent",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.worker_store, WorkerStore::kDaemon); }},
      {"--monitor-interval",
       "0.5",
       "2",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.monitor_interval, milliseconds(500)); }},
      {"--event-log-handler",
       "null",
       "console",
       {},
       [](const LaunchConfig& c) { EXPECT_TRUE(c.notices.empty()); }},
      {"--start-method",
       "fork",
       "spawn",
       {},
       [](const LaunchConfig& c) {
         ASSERT_EQ(c.notices.size(), 1u);
         EXPECT_TRUE(absl::StartsWith(c.notices[0], "--start-method=fork: ignored"));
       }},
      {"--role",
       "trainer",
       "other",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.role, "trainer"); }},
      {"--module", "", "", {}, [](const LaunchConfig& c) { EXPECT_TRUE(c.module); }},
      {"--no-python",
       "",
       "",
       {},
       [](const LaunchConfig& c) { EXPECT_TRUE(c.no_python); }},
      {"--run-path", "", "", {}, [](const LaunchConfig& c) { EXPECT_TRUE(c.run_path); }},
      {"--log-dir",
       "/var/log/job",
       "/tmp",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.log_dir, "/var/log/job"); }},
      {"--redirects",
       "3",
       "1",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.redirects.all_ranks, StdStreams::kAll); }},
      {"--tee",
       "2",
       "1",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.tee.all_ranks, StdStreams::kErr); }},
      {"--local-ranks-filter",
       "0,2",
       "1",
       {},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.local_ranks_filter, (std::set<int>{0, 2}));
       }},
      {"--node-rank",
       "1",
       "0",
       {"--nnodes=2"},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.node_rank, 1);
         EXPECT_TRUE(c.node_rank_given);
       }},
      {"--master-addr",
       "10.0.0.1",
       "10.0.0.2",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.master_addr, "10.0.0.1"); }},
      {"--master-port",
       "1234",
       "4321",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.master_port, 1234); }},
      {"--local-addr",
       "node3",
       "node4",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.local_addr, "node3"); }},
      {"--shutdown-timeout",
       "2.5",
       "7",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.shutdown_timeout, milliseconds(2500)); }},
      {"--hang-timeout",
       "90",
       "7",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.hang_timeout, milliseconds(90000)); }},
      {"--signals-to-handle",
       "SIGUSR1",
       "SIGTERM",
       {},
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.signals_to_handle, (std::vector<int>{SIGUSR1}));
         EXPECT_EQ(c.signals_to_handle_text, "SIGUSR1");
       }},
      {"--log-line-prefix-template",
       "${rank}>",
       "${host}",
       {},
       [](const LaunchConfig& c) { EXPECT_EQ(c.log_line_prefix_template, "${rank}>"); }},
      {"--virtual-local-rank",
       "",
       "",
       {},
       [](const LaunchConfig& c) { EXPECT_TRUE(c.virtual_local_rank); }},
  };
}

TEST(LaunchConfigTest,
     HangTimeoutIsTorchsProcessGroupTimeoutUnlessGivenAndZeroTurnsItOff) {
  EXPECT_EQ(MustParse({"train.py"}).hang_timeout, milliseconds(1800 * 1000));
  EXPECT_EQ(MustParse({"--hang-timeout=0", "train.py"}).hang_timeout, milliseconds(0));
  EXPECT_EQ(MustParse({"--hang-timeout=2.5", "train.py"}).hang_timeout,
            milliseconds(2500));
  EXPECT_EQ(ErrorOf({"--hang-timeout=-1", "train.py"}),
            "--hang-timeout: expected a non-negative number of seconds, got '-1'");
  EXPECT_EQ(ErrorOf({"--hang-timeout=10m", "train.py"}),
            "--hang-timeout: expected a non-negative number of seconds, got '10m'");
}

TEST(LaunchConfigTest, EveryFlagInBothSpellingsAndBothValueForms) {
  for (const FlagCase& fc : FlagCases()) {
    for (const std::string& spelling : {fc.flag, Underscored(fc.flag)}) {
      std::vector<Args> forms;
      if (fc.value.empty()) {
        forms.push_back({spelling});
      } else {
        forms.push_back({spelling, fc.value});
        forms.push_back({spelling + "=" + fc.value});
      }
      for (Args flags : forms) {
        flags.insert(flags.begin(), fc.extra.begin(), fc.extra.end());
        SCOPED_TRACE(absl::StrJoin(flags, " "));
        fc.check(MustParse(With(flags)));
      }
    }
  }
}

TEST(LaunchConfigTest, EveryFlagDefaultsToItsPetVariable) {
  for (const FlagCase& fc : FlagCases()) {
    std::string pet = PetName(fc.flag);
    SCOPED_TRACE(pet);
    fc.check(MustParse(With(fc.extra), {{pet, fc.value.empty() ? "1" : fc.value}}));
  }
}

TEST(LaunchConfigTest, AnExplicitFlagWinsOverItsPetVariable) {
  for (const FlagCase& fc : FlagCases()) {
    std::string pet = PetName(fc.flag);
    SCOPED_TRACE(fc.flag);
    Args flags = fc.extra;
    if (fc.value.empty()) {
      flags.push_back(fc.flag);
      fc.check(MustParse(With(flags), {{pet, "0"}}));
    } else {
      flags.push_back(fc.flag + "=" + fc.value);
      fc.check(MustParse(With(flags), {{pet, fc.other_value}}));
    }
  }
}

TEST(LaunchConfigTest, PetNamesAreTorchruns) {
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_NPROC_PER_NODE", "4"}}).nproc_per_node, 4);
  EXPECT_EQ(
      MustParse({"--rdzv-backend=c10d", "train.py"}, {{"PET_NNODES", "3"}}).max_nodes, 3);
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_RDZV_ENDPOINT", "h:5"}}).rdzv_endpoint,
            (HostPort{"h", 5}));
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_MAX_RESTARTS", "2"}}).max_restarts, 2);
  EXPECT_TRUE(MustParse({"train.py"}, {{"PET_MODULE", "1"}}).module);
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_REDIRECTS", "3"}}).redirects.all_ranks,
            StdStreams::kAll);
  // An empty variable is as good as unset.
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_NNODES", ""}}).max_nodes, 1);
  // Other environment variables are not flags.
  EXPECT_EQ(MustParse({"train.py"}, {{"NPROC_PER_NODE", "4"}}).nproc_per_node, 1);
}

TEST(LaunchConfigTest, PetSwitchValues) {
  struct Case {
    std::string value;
    bool on;
  };
  for (const Case& c : std::vector<Case>{{"1", true},
                                         {"true", true},
                                         {"yes", true},
                                         {"2", true},
                                         {"0", false},
                                         {"false", false},
                                         {"FALSE", false},
                                         {"", false}}) {
    SCOPED_TRACE(c.value);
    EXPECT_EQ(
        MustParse({"--rdzv-backend=c10d", "train.py"}, {{"PET_STANDALONE", c.value}})
            .standalone,
        c.on);
  }
}

TEST(LaunchConfigTest, ErrorsFromPetVariablesNameTheVariable) {
  EXPECT_EQ(ErrorOf({"train.py"}, {{"PET_NNODES", "3:1"}}),
            "--nnodes: expected N or MIN:MAX, got '3:1' (from PET_NNODES)");
  EXPECT_EQ(ErrorOf({"train.py"}, {{"PET_MASTER_PORT", "x"}}),
            "--master-port: expected a port in 0..65535, got 'x' (from PET_MASTER_PORT)");
}

TEST(LaunchConfigTest, RepeatedFlagsKeepTheLast) {
  EXPECT_EQ(MustParse({"--rdzv-backend=c10d", "--nnodes", "2", "--nnodes=3", "train.py"})
                .max_nodes,
            3);
  EXPECT_EQ(MustParse({"--role", "a", "--role", "b", "train.py"}).role, "b");
}

// --- --nnodes ----------------------------------------------------------------

TEST(LaunchConfigTest, NnodesForms) {
  struct Case {
    std::string value;
    int min, max;
  };
  for (const Case& c : std::vector<Case>{
           {"1", 1, 1}, {"3", 3, 3}, {"1:4", 1, 4}, {"2:2", 2, 2}, {"1:1", 1, 1}}) {
    SCOPED_TRACE(c.value);
    LaunchConfig config =
        MustParse({"--rdzv-backend=c10d", "--nnodes", c.value, "train.py"});
    EXPECT_EQ(config.min_nodes, c.min);
    EXPECT_EQ(config.max_nodes, c.max);
  }
}

TEST(LaunchConfigTest, NnodesErrors) {
  for (std::string value :
       {"0", "3:1", "a", "1:2:3", "", ":2", "1:", "0:2", "-1:2", "1.5", "2:x"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(ErrorOf({"--nnodes=" + value, "train.py"}),
              absl::StrCat("--nnodes: expected N or MIN:MAX, got '", value, "'"));
  }
}

// --- --nproc-per-node --------------------------------------------------------

TEST(LaunchConfigTest, NprocPerNodeForms) {
  struct Case {
    std::string spec;
    int cpus, gpus, expected;
  };
  for (const Case& c : std::vector<Case>{{"4", 8, 0, 4},
                                         {"1", 8, 2, 1},
                                         {"cpu", 8, 2, 8},
                                         {"gpu", 8, 2, 2},
                                         {"auto", 8, 2, 2},
                                         {"auto", 6, 0, 6}}) {
    SCOPED_TRACE(c.spec);
    LaunchConfig config =
        MustParse({"--nproc-per-node", c.spec, "train.py"}, {}, FakeHost(c.cpus, c.gpus));
    EXPECT_EQ(config.nproc_per_node, c.expected);
    EXPECT_EQ(config.nproc_per_node_spec, c.spec);
  }
}

TEST(LaunchConfigTest, NprocPerNodeErrors) {
  EXPECT_EQ(ErrorOf({"--nproc-per-node=gpu", "train.py"}, {}, FakeHost(8, 0)),
            "--nproc-per-node: 'gpu' but no GPU found");
  for (std::string value : {"0", "-2", "x", "1.5", "", "GPU"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(ErrorOf({"--nproc-per-node=" + value, "train.py"}),
              absl::StrCat("--nproc-per-node: expected a positive integer, cpu, gpu or "
                           "auto, got '",
                           value, "'"));
  }
}

// --- Rendezvous backend and endpoint -------------------------------------------

TEST(LaunchConfigTest, RdzvBackendNames) {
  for (std::string name : {"c10d", "meshrun", "dynamic"}) {
    EXPECT_EQ(MustParse({"--rdzv-backend", name, "train.py"}).rdzv_backend,
              RdzvBackend::kDynamic);
  }
  EXPECT_EQ(
      MustParse({"--rdzv-backend", "static", "--master-port=1", "train.py"}).rdzv_backend,
      RdzvBackend::kStatic);
  for (std::string etcd : {"etcd", "etcd-v2"}) {
    EXPECT_EQ(ErrorOf({"--rdzv-backend", etcd, "train.py"}),
              "--rdzv-backend: " + etcd +
                  " is not supported: meshrun's rendezvous daemon replaces etcd "
                  "(--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT of a meshrun-rdzvd or "
                  "of node 0)");
  }
  EXPECT_EQ(ErrorOf({"--rdzv-backend", "zeus", "train.py"}),
            "--rdzv-backend: expected one of static, c10d, meshrun, dynamic, got 'zeus'");
}

TEST(LaunchConfigTest, RdzvEndpointForms) {
  struct Case {
    std::string value;
    HostPort expected;
  };
  for (const Case& c :
       std::vector<Case>{{"node0", {"node0", 29400}},
                         {"node0:1234", {"node0", 1234}},
                         {"host.example.com:65535", {"host.example.com", 65535}},
                         {"[::1]:29400", {"::1", 29400}},
                         {"[fe80::1%eth0]:7", {"fe80::1%eth0", 7}},
                         {"[::1]", {"::1", 29400}},
                         {" node0:5 ", {"node0", 5}}}) {
    SCOPED_TRACE(c.value);
    LaunchConfig config =
        MustParse({"--rdzv-backend=c10d", "--rdzv-endpoint", c.value, "train.py"});
    EXPECT_EQ(config.rdzv_endpoint, c.expected);
    EXPECT_TRUE(config.rdzv_endpoint_given);
  }
  // Empty means "not given", as in torch.
  EXPECT_FALSE(MustParse({"--rdzv-backend=c10d", "--rdzv-endpoint=", "train.py"})
                   .rdzv_endpoint_given);
  EXPECT_EQ(MustParse({"--rdzv-backend=c10d", "train.py"}).rdzv_endpoint,
            (HostPort{"localhost", 29400}));
}

TEST(LaunchConfigTest, RdzvEndpointErrors) {
  const std::string kExpected = "HOST[:PORT] with PORT in 0..65535, IPv6 as [ADDR]:PORT";
  for (std::string value : {"node0:65536", "node0:-1", "node0:abc", "node0:", ":1234",
                            "[::1", "[::1]x", "[]:5", "bad host:1", "node0:123456"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(
        ErrorOf({"--rdzv-endpoint", value, "train.py"}),
        absl::StrCat("--rdzv-endpoint: expected ", kExpected, ", got '", value, "'"));
  }
  EXPECT_EQ(ErrorOf({"--rdzv-endpoint", "::1:29400", "train.py"}),
            absl::StrCat("--rdzv-endpoint: expected ", kExpected,
                         ", got '::1:29400' (put IPv6 addresses in brackets)"));
}

// --rdzv-endpoint=A,B,...: daemon replicas, in order, each with the default
// port where it names none.
TEST(LaunchConfigTest, RdzvEndpointList) {
  LaunchConfig config = MustParse(
      {"--rdzv-backend=c10d", "--rdzv-endpoint=n0:5, n1 ,[fd00::2]:7,[::1]", "train.py"});
  EXPECT_EQ(config.rdzv_endpoint, (HostPort{"n0", 5}));
  EXPECT_EQ(
      config.rdzv_endpoints,
      (std::vector<HostPort>{{"n0", 5}, {"n1", 29400}, {"fd00::2", 7}, {"::1", 29400}}));
  EXPECT_TRUE(config.rdzv_endpoint_given);
  // One endpoint is no list.
  EXPECT_TRUE(MustParse({"--rdzv-backend=c10d", "--rdzv-endpoint=n0:5", "train.py"})
                  .rdzv_endpoints.empty());
  EXPECT_EQ(
      MustParse({"--rdzv-backend=c10d", "train.py"}, {{"PET_RDZV_ENDPOINT", "a:1,b:2"}})
          .rdzv_endpoints.size(),
      2u);
}

TEST(LaunchConfigTest, RdzvEndpointListErrors) {
  const std::string kExpected = "HOST[:PORT] with PORT in 0..65535, IPv6 as [ADDR]:PORT";
  struct Case {
    std::string value;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"a:1,,b:2", "empty entry in the endpoint list 'a:1,,b:2'"},
           {"a:1,", "empty entry in the endpoint list 'a:1,'"},
           {",a:1", "empty entry in the endpoint list ',a:1'"},
           {"a:1, ,b:2", "empty entry in the endpoint list 'a:1, ,b:2'"},
           {"a:1,b:x", absl::StrCat("expected ", kExpected, ", got 'b:x'")},
           {"a:1,b:70000", absl::StrCat("expected ", kExpected, ", got 'b:70000'")},
           {"a:1,::1:5", absl::StrCat("expected ", kExpected,
                                      ", got '::1:5' (put IPv6 addresses in brackets)")},
           {"a:1,b:2,a:1", "'a:1' appears twice in the endpoint list 'a:1,b:2,a:1'"},
           {"a,a:29400", "'a:29400' appears twice in the endpoint list 'a,a:29400'"},
           {"a:1,b:0",
            "port 0 cannot be reached by the agents (--standalone runs a daemon on a "
            "free port), got 'a:1,b:0'"}}) {
    SCOPED_TRACE(c.value);
    EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--rdzv-endpoint", c.value, "train.py"}),
              absl::StrCat("--rdzv-endpoint: ", c.error));
  }
  // Replicas elect their daemon; the static backend's is node 0's.
  EXPECT_EQ(ErrorOf({"--rdzv-backend=static", "--node-rank=0", "--rdzv-endpoint=a:1,b:2",
                     "train.py"}),
            "--rdzv-endpoint: a list of daemon replicas needs --rdzv-backend=c10d (the "
            "static backend's daemon is node 0's), got 'a:1,b:2'");
  // Neither can this launcher host one of them, nor a stock TCPStore follow.
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--rdzv-endpoint=a:1,b:2",
                     "--rdzv-conf=is_host=1", "train.py"}),
            "--rdzv-conf: is_host: a launcher given a list of daemon replicas "
            "(--rdzv-endpoint=A,B,...) never hosts the daemon; run meshrun-rdzvd "
            "replicas");
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--rdzv-endpoint=a:1,b:2",
                     "--worker-store=daemon", "train.py"}),
            "--worker-store: daemon: workers' TCPStore clients cannot follow a list of "
            "daemon replicas (--rdzv-endpoint=A,B,...); the default, agent, does");
}

// Port 0 names no port another agent (or this one) could reach.
TEST(LaunchConfigTest, RdzvEndpointPortZeroIsRefused) {
  for (const char* backend : {"--rdzv-backend=c10d", "--rdzv-backend=static"}) {
    SCOPED_TRACE(backend);
    EXPECT_EQ(ErrorOf({backend, "--rdzv-endpoint=node0:0", "train.py"}),
              "--rdzv-endpoint: port 0 cannot be reached by the agents (--standalone "
              "runs a daemon on a free port), got 'node0:0'");
  }
  EXPECT_EQ(ErrorOf({"train.py"}, {{"PET_RDZV_ENDPOINT", "[::1]:0"}}),
            "--rdzv-endpoint: port 0 cannot be reached by the agents (--standalone "
            "runs a daemon on a free port), got '[::1]:0' (from PET_RDZV_ENDPOINT)");
}

TEST(LaunchConfigTest, StaticBackend) {
  // Single node: rank 0 is implied; the endpoint is master addr:port.
  LaunchConfig single =
      MustParse({"--rdzv-backend=static", "--master-port=29500", "train.py"});
  EXPECT_EQ(single.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_FALSE(single.standalone);
  EXPECT_EQ(single.node_rank, 0);
  EXPECT_FALSE(single.node_rank_given);
  EXPECT_EQ(single.rdzv_endpoint, (HostPort{"127.0.0.1", 29500}));
  EXPECT_FALSE(single.rdzv_endpoint_given);
  EXPECT_TRUE(single.notices.empty());

  LaunchConfig multi =
      MustParse({"--rdzv-backend=static", "--nnodes=2", "--node-rank=1",
                 "--master-addr=[::1]", "--master-port=1234", "train.py"});
  EXPECT_EQ(multi.node_rank, 1);
  EXPECT_EQ(multi.rdzv_endpoint, (HostPort{"::1", 1234}));
  EXPECT_EQ(multi.master_addr, "[::1]");

  LaunchConfig explicit_endpoint = MustParse(
      {"--rdzv-backend=static", "--rdzv-endpoint=n0:99", "--master-port=1", "train.py"});
  EXPECT_EQ(explicit_endpoint.rdzv_endpoint, (HostPort{"n0", 99}));

  EXPECT_EQ(ErrorOf({"--rdzv-backend=static", "--nnodes=1:2", "train.py"}),
            "--nnodes: the static backend needs a fixed node count, got '1:2'");
  EXPECT_EQ(ErrorOf({"--rdzv-backend=static", "--nnodes=2", "train.py"}),
            "--node-rank: required with the static backend (torchrun's default) when "
            "--nnodes is above 1; --rdzv-backend=c10d assigns node ranks at the "
            "rendezvous");
  EXPECT_EQ(ErrorOf({"--rdzv-backend=static", "--rdzv-endpoint=n0", "train.py"}),
            "--rdzv-endpoint: expected HOST:PORT (the static backend needs a port), got "
            "'n0'");
}

TEST(LaunchConfigTest, NodeRank) {
  EXPECT_EQ(ErrorOf({"--nnodes=2", "--node-rank=2", "train.py"}),
            "--node-rank: must be below the maximum node count 2, got 2");
  // "-1" after a flag is its value (argparse's rule), and not a valid rank.
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--node-rank", "-1", "train.py"}),
            "--node-rank: expected a non-negative integer, got '-1'");
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--node-rank", "x", "train.py"}),
            "--node-rank: expected a non-negative integer, got 'x'");
  LaunchConfig elastic =
      MustParse({"--rdzv-backend=c10d", "--nnodes=1:4", "--node-rank", "3", "train.py"});
  EXPECT_EQ(elastic.node_rank, 3);
  EXPECT_TRUE(elastic.node_rank_given);
}

TEST(LaunchConfigTest, MasterAddrAndPort) {
  EXPECT_EQ(
      MustParse({"--master-port=0", "--rdzv-backend=static", "train.py"}).master_port, 0);
  EXPECT_EQ(ErrorOf({"--master-port=65536", "train.py"}),
            "--master-port: expected a port in 0..65535, got '65536'");
  EXPECT_EQ(ErrorOf({"--master-addr=::1", "train.py"}),
            "--master-addr: expected a host name or address, IPv6 as [ADDR], got '::1'");
  // Under the dynamic backend they do nothing; say so when they were given.
  LaunchConfig dynamic =
      MustParse({"--rdzv-backend=c10d", "--master-addr=10.0.0.1", "train.py"});
  ASSERT_EQ(dynamic.notices.size(), 1u);
  EXPECT_TRUE(
      absl::StartsWith(dynamic.notices[0], "--master-addr/--master-port: only used"));
  // Nor on one node without --master-port, where torchrun's rule makes it
  // standalone.
  LaunchConfig implied = MustParse({"--master-addr=10.0.0.1", "train.py"});
  EXPECT_TRUE(implied.standalone);
  EXPECT_EQ(implied.notices,
            (std::vector<std::string>{
                "--master-addr: unused on one node without --master-port (torchrun's "
                "rule: the rendezvous runs on localhost:0)"}));
}

// --- --rdzv-conf ----------------------------------------------------------------

TEST(LaunchConfigTest, RdzvConfAllKeys) {
  LaunchConfig config = MustParse(
      {"--rdzv-conf",
       "join_timeout=12.5, last_call_timeout=1,close_timeout=2,keep_alive_interval=0.25,"
       "keep_alive_max_attempt=7,read_timeout=3,is_host=false",
       "train.py"});
  EXPECT_EQ(config.rdzv_conf.join_timeout, milliseconds(12500));
  EXPECT_EQ(config.rdzv_conf.last_call_timeout, milliseconds(1000));
  EXPECT_EQ(config.rdzv_conf.close_timeout, milliseconds(2000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_interval, milliseconds(250));
  EXPECT_EQ(config.rdzv_conf.keep_alive_max_attempt, 7);
  EXPECT_EQ(config.rdzv_conf.read_timeout, milliseconds(3000));
  EXPECT_EQ(config.rdzv_conf.is_host, false);

  EXPECT_EQ(MustParse({"--rdzv-conf=timeout=42", "train.py"}).rdzv_conf.join_timeout,
            milliseconds(42000));
  EXPECT_EQ(MustParse({"--rdzv-conf=is_host=1", "train.py"}).rdzv_conf.is_host, true);
  // torch's c10d keys without an effect here (server-side joins, a TCP daemon).
  EXPECT_TRUE(
      MustParse({"--rdzv-conf=store_type=TCP,cas_backoff_max_seconds=0.5", "train.py"})
          .notices.empty());
  EXPECT_EQ(MustParse({"--rdzv-conf=", "train.py"}).rdzv_conf.join_timeout,
            milliseconds(600000));
}

TEST(LaunchConfigTest, RdzvConfErrors) {
  struct Case {
    std::string value;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"foo=1",
            "unknown key 'foo'; valid keys: cas_backoff_max_seconds, close_timeout, "
            "is_host, join_timeout, keep_alive_interval, keep_alive_max_attempt, "
            "last_call_timeout, read_timeout, store_type, timeout"},
           {"store_type=file",
            "store_type: meshrun's rendezvous is its daemon over TCP, so only 'tcp' is "
            "accepted, got 'file'"},
           {"cas_backoff_max_seconds=x",
            "cas_backoff_max_seconds: expected a non-negative number of seconds, got "
            "'x'"},
           {"join_timeout=", "'join_timeout' needs a value"},
           {"join_timeout", "'join_timeout' needs a value"},
           {"=5", "expected KEY=VALUE,KEY=VALUE,..., got '=5'"},
           {"join_timeout=5,", "expected KEY=VALUE,KEY=VALUE,..., got 'join_timeout=5,'"},
           {"join_timeout=abc",
            "join_timeout: expected a positive number of seconds, got 'abc'"},
           {"close_timeout=0",
            "close_timeout: expected a positive number of seconds, got '0'"},
           {"read_timeout=-3",
            "read_timeout: expected a positive number of seconds, got '-3'"},
           {"keep_alive_max_attempt=0",
            "keep_alive_max_attempt: expected an integer >= 1, got '0'"},
           {"is_host=maybe",
            "is_host: expected a boolean (1/0, true/false, yes/no), got 'maybe'"},
           {"timeout=5,join_timeout=6",
            "'timeout' and 'join_timeout' are the same setting; give one"},
       }) {
    SCOPED_TRACE(c.value);
    EXPECT_EQ(ErrorOf({"--rdzv-conf=" + c.value, "train.py"}),
              "--rdzv-conf: " + c.message);
  }
}

// --- --standalone --------------------------------------------------------------

TEST(LaunchConfigTest, StandaloneOverridesTheRendezvousFlags) {
  LaunchConfig plain = MustParse({"--standalone", "--nproc-per-node=4", "train.py"});
  EXPECT_TRUE(plain.standalone);
  EXPECT_EQ(plain.rdzv_backend, RdzvBackend::kDynamic);
  EXPECT_EQ(plain.rdzv_endpoint, (HostPort{"localhost", 0}));
  EXPECT_EQ(plain.rdzv_id, kRunId);
  EXPECT_EQ(plain.min_nodes, 1);
  EXPECT_EQ(plain.max_nodes, 1);
  EXPECT_EQ(plain.nproc_per_node, 4);
  EXPECT_TRUE(plain.notices.empty());

  // What standalone would pick anyway goes without a notice.
  EXPECT_TRUE(MustParse({"--standalone", "--nnodes=1", "--rdzv-backend=c10d", "train.py"})
                  .notices.empty());
  EXPECT_TRUE(MustParse({"--standalone", "--nnodes=1:1", "train.py"}).notices.empty());

  // Ignored values are not even validated: they are ignored.
  LaunchConfig overridden = MustParse(
      {"--standalone", "--rdzv-backend=static", "--rdzv-endpoint=far:1", "--rdzv-id=job",
       "--nnodes=bogus", "--rdzv-conf=join_timeout=7", "train.py"},
      {{"PET_NODE_RANK", "3"}});
  EXPECT_EQ(overridden.rdzv_backend, RdzvBackend::kDynamic);
  EXPECT_EQ(overridden.rdzv_endpoint, (HostPort{"localhost", 0}));
  EXPECT_EQ(overridden.rdzv_id, kRunId);
  EXPECT_EQ(overridden.max_nodes, 1);
  EXPECT_EQ(overridden.node_rank, -1);
  EXPECT_EQ(overridden.rdzv_conf.join_timeout, milliseconds(7000));  // kept, as torchrun
  ASSERT_EQ(overridden.notices.size(), 1u);
  EXPECT_EQ(overridden.notices[0],
            "--standalone: ignoring --nnodes=bogus --rdzv-backend=static "
            "--rdzv-endpoint=far:1 --rdzv-id=job --node-rank=3 (one node, rendezvous on "
            "localhost:0, run id standalone-run-id)");
}

TEST(LaunchConfigTest, SystemHostProbeGivesFreshUuids) {
  HostProbe host = SystemHostProbe();
  EXPECT_GE(host.cpu_count(), 1);
  EXPECT_GE(host.gpu_count(), 0);
  std::string a = host.new_run_id(), b = host.new_run_id();
  EXPECT_NE(a, b);
  ASSERT_EQ(a.size(), 36u);
  EXPECT_EQ(a[8], '-');
  EXPECT_EQ(a[14], '4');                                          // version 4
  EXPECT_NE(std::string("89ab").find(a[19]), std::string::npos);  // RFC 4122 variant
}

// --- -r / -t / --local-ranks-filter ----------------------------------------------

TEST(LaunchConfigTest, StdStreamsForms) {
  struct Case {
    std::string value;
    StdStreamsSpec expected;
  };
  for (const Case& c : std::vector<Case>{
           {"0", {StdStreams::kNone, {}}},
           {"1", {StdStreams::kOut, {}}},
           {"2", {StdStreams::kErr, {}}},
           {"3", {StdStreams::kAll, {}}},
           {"0:1,1:2",
            {StdStreams::kNone, {{0, StdStreams::kOut}, {1, StdStreams::kErr}}}},
           {"0:3,1:0,2:1,3:2",
            {StdStreams::kNone,
             {{0, StdStreams::kAll},
              {1, StdStreams::kNone},
              {2, StdStreams::kOut},
              {3, StdStreams::kErr}}}},
           {"12:3", {StdStreams::kNone, {{12, StdStreams::kAll}}}},
       }) {
    for (const Args& flags : std::vector<Args>{{"-r", c.value},
                                               {"-r" + c.value},
                                               {"-r=" + c.value},
                                               {"--redirects", c.value}}) {
      SCOPED_TRACE(absl::StrJoin(flags, " "));
      EXPECT_EQ(MustParse(With(flags)).redirects, c.expected);
    }
    for (const Args& flags : std::vector<Args>{{"-t", c.value}, {"-t" + c.value}}) {
      SCOPED_TRACE(absl::StrJoin(flags, " "));
      EXPECT_EQ(MustParse(With(flags)).tee, c.expected);
    }
  }
  StdStreamsSpec mapped = MustParse({"-t", "0:1,1:2", "train.py"}).tee;
  EXPECT_EQ(mapped.ForLocalRank(0), StdStreams::kOut);
  EXPECT_EQ(mapped.ForLocalRank(1), StdStreams::kErr);
  EXPECT_EQ(mapped.ForLocalRank(2), StdStreams::kNone);
  EXPECT_EQ(MustParse({"-t3", "train.py"}).tee.ForLocalRank(5), StdStreams::kAll);
}

TEST(LaunchConfigTest, StdStreamsErrors) {
  for (std::string value :
       {"4", "0:4", "a", "0:1,", "1:", ":1", "0:1:2", "-1:1", "", "01", "0:1;1:2"}) {
    SCOPED_TRACE(value);
    std::string tail = absl::StrCat(
        ": expected 0-3 or LOCAL_RANK:0-3,... (0 none, 1 stdout, 2 stderr, 3 both), got "
        "'",
        value, "'");
    EXPECT_EQ(ErrorOf({"--redirects=" + value, "train.py"}), "--redirects" + tail);
    EXPECT_EQ(ErrorOf({"--tee=" + value, "train.py"}), "--tee" + tail);
  }
}

// The daemon's rule for run ids (rendezvous/request_validation), applied
// when the flag is parsed instead of when the agent joins.
TEST(LaunchConfigTest, RdzvIdFollowsTheDaemonsRules) {
  EXPECT_EQ(
      MustParse({"--rdzv-backend=c10d", "--rdzv-id=job/7.a_b-c", "train.py"}).rdzv_id,
      "job/7.a_b-c");
  EXPECT_EQ(
      MustParse({"--rdzv-backend=c10d", "--rdzv-id=" + std::string(256, 'j'), "train.py"})
          .rdzv_id.size(),
      256u);
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--rdzv-id=my job", "train.py"}),
            "--rdzv-id: byte 0x20 at offset 2 is not allowed (printable ASCII without "
            "spaces only)");
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "--rdzv-id=caf\xc3\xa9", "train.py"}),
            "--rdzv-id: byte 0xc3 at offset 3 is not allowed (printable ASCII without "
            "spaces only)");
  EXPECT_EQ(
      ErrorOf({"--rdzv-backend=c10d", "--rdzv-id=" + std::string(257, 'j'), "train.py"}),
      "--rdzv-id: 257 bytes exceeds the limit of 256");
  EXPECT_EQ(ErrorOf({"--rdzv-backend=c10d", "train.py"}, {{"PET_RDZV_ID", "a\tb"}}),
            "--rdzv-id: byte 0x09 at offset 1 is not allowed (printable ASCII without "
            "spaces only) (from PET_RDZV_ID)");
}

// A filter naming no local rank would hide every line of output.
TEST(LaunchConfigTest, LocalRanksFilterMustNameARankOfThisNode) {
  EXPECT_EQ(ErrorOf({"--nproc-per-node=2", "--local-ranks-filter=2,3", "train.py"}),
            "--local-ranks-filter: names no local rank of this node (0..1 with "
            "--nproc-per-node=2), got '2,3'");
  EXPECT_EQ(ErrorOf({"--local-ranks-filter=1", "train.py"}),
            "--local-ranks-filter: names no local rank of this node (0..0 with "
            "--nproc-per-node=1), got '1'");
  // Some exist: the others are mentioned.
  LaunchConfig partial =
      MustParse({"--nproc-per-node=2", "--local-ranks-filter=1,5", "train.py"});
  EXPECT_EQ(partial.local_ranks_filter, (std::set<int>{1, 5}));
  ASSERT_EQ(partial.notices.size(), 1u);
  EXPECT_EQ(partial.notices[0],
            "--local-ranks-filter: local rank 5 does not exist (0..1 with "
            "--nproc-per-node=2)");
  // A count that depends on the machine: another node may have more, so a
  // warning rather than a refusal.
  LaunchConfig by_cpu = MustParse(
      {"--nproc-per-node=cpu", "--local-ranks-filter=4", "train.py"}, {}, FakeHost(2));
  ASSERT_EQ(by_cpu.notices.size(), 1u);
  EXPECT_EQ(by_cpu.notices[0],
            "--local-ranks-filter: names no local rank of this node (0..1 with "
            "--nproc-per-node=cpu here); no worker output will reach the console");
  EXPECT_TRUE(MustParse({"--nproc-per-node=4", "--local-ranks-filter=0,3", "train.py"})
                  .notices.empty());
}

TEST(LaunchConfigTest, LocalRanksFilter) {
  EXPECT_EQ(MustParse({"--local-ranks-filter=0", "train.py"}).local_ranks_filter,
            (std::set<int>{0}));
  EXPECT_EQ(MustParse({"--local-ranks-filter=2,0,2", "train.py"}).local_ranks_filter,
            (std::set<int>{0, 2}));
  EXPECT_EQ(MustParse({"--local-ranks-filter", "0, 1", "train.py"}).local_ranks_filter,
            (std::set<int>{0, 1}));
  EXPECT_TRUE(
      MustParse({"--local-ranks-filter=", "train.py"}).local_ranks_filter.empty());
  for (std::string value : {"a", "0,,1", "-1", "1.5", "0,"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(
        ErrorOf({"--local-ranks-filter=" + value, "train.py"}),
        absl::StrCat("--local-ranks-filter: expected a comma-separated list of local "
                     "ranks like 0,1,2, got '",
                     value, "'"));
  }
}

// --- Signals, durations, log prefix ----------------------------------------------

TEST(LaunchConfigTest, SignalsToHandle) {
  EXPECT_EQ(
      MustParse({"--signals-to-handle=SIGUSR1,SIGUSR2", "train.py"}).signals_to_handle,
      (std::vector<int>{SIGUSR1, SIGUSR2}));
  EXPECT_EQ(
      MustParse({"--signals-to-handle", "term, usr1", "train.py"}).signals_to_handle,
      (std::vector<int>{SIGTERM, SIGUSR1}));
  EXPECT_EQ(MustParse({"--signals-to-handle=SIGTERM,TERM,SIGINT", "train.py"})
                .signals_to_handle,
            (std::vector<int>{SIGTERM, SIGINT}));
  EXPECT_EQ(ErrorOf({"--signals-to-handle=SIGTERM,SIGFOO", "train.py"}),
            "--signals-to-handle: unknown signal 'SIGFOO'; valid: "
            "SIGHUP,SIGINT,SIGQUIT,SIGTERM,SIGUSR1,SIGUSR2,SIGALRM,SIGXCPU,SIGCONT");
  EXPECT_EQ(ErrorOf({"--signals-to-handle=SIGKILL", "train.py"}),
            "--signals-to-handle: SIGKILL cannot be caught");
  EXPECT_TRUE(absl::StartsWith(ErrorOf({"--signals-to-handle=", "train.py"}),
                               "--signals-to-handle: unknown signal ''"));
}

TEST(LaunchConfigTest, DurationsInSeconds) {
  struct Case {
    std::string value;
    milliseconds expected;
  };
  for (const Case& c : std::vector<Case>{{"0", milliseconds(0)},
                                         {"0.1", milliseconds(100)},
                                         {"5", milliseconds(5000)},
                                         {"1e-3", milliseconds(1)},
                                         {"0.0004", milliseconds(0)}}) {
    SCOPED_TRACE(c.value);
    LaunchConfig config = MustParse(
        {"--monitor-interval", c.value, "--shutdown-timeout", c.value, "train.py"});
    EXPECT_EQ(config.monitor_interval, c.expected);
    EXPECT_EQ(config.shutdown_timeout, c.expected);
  }
  for (std::string value : {"-1", "abc", "inf", "nan", "", "1s", "1e10"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(
        ErrorOf({"--shutdown-timeout=" + value, "train.py"}),
        absl::StrCat("--shutdown-timeout: expected a non-negative number of seconds, "
                     "got '",
                     value, "'"));
    EXPECT_TRUE(absl::StartsWith(ErrorOf({"--monitor-interval=" + value, "train.py"}),
                                 "--monitor-interval: expected"));
  }
  EXPECT_EQ(ErrorOf({"--max-restarts=-1", "train.py"}),
            "--max-restarts: expected a non-negative integer, got '-1'");
  EXPECT_EQ(ErrorOf({"--max-restarts=1.0", "train.py"}),
            "--max-restarts: expected a non-negative integer, got '1.0'");
}

TEST(LaunchConfigTest, LogLinePrefixTemplate) {
  for (std::string value :
       {"${host}:${rank}>", "${hostname}:${rank}: ", "$rank|$local_rank",
        "$$ ${role_name}", "plain", "cost $5", ""}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(MustParse({"--log-line-prefix-template=" + value, "train.py"})
                  .log_line_prefix_template,
              value);
  }
  EXPECT_EQ(ErrorOf({"--log-line-prefix-template=${rnak}", "train.py"}),
            "--log-line-prefix-template: unknown placeholder 'rnak' in '${rnak}'; valid: "
            "${role_name}, ${rank}, ${local_rank}, ${hostname}, ${host}");
  EXPECT_EQ(ErrorOf({"--log-line-prefix-template=$world", "train.py"}),
            "--log-line-prefix-template: unknown placeholder 'world' in '$world'; valid: "
            "${role_name}, ${rank}, ${local_rank}, ${hostname}, ${host}");
  EXPECT_EQ(ErrorOf({"--log-line-prefix-template=[${rank", "train.py"}),
            "--log-line-prefix-template: unclosed '${' in '[${rank'");
  // torch 2.x's variable is honoured below the flag and PET_*.
  const Env torch_env = {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}:"}};
  EXPECT_EQ(MustParse({"train.py"}, torch_env).log_line_prefix_template, "${rank}:");
  Env both = torch_env;
  both["PET_LOG_LINE_PREFIX_TEMPLATE"] = "${host}:";
  EXPECT_EQ(MustParse({"train.py"}, both).log_line_prefix_template, "${host}:");
  EXPECT_EQ(ErrorOf({"train.py"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${x}"}}),
            "--log-line-prefix-template: unknown placeholder 'x' in '${x}'; valid: "
            "${role_name}, ${rank}, ${local_rank}, ${hostname}, ${host} (from "
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)");
}

TEST(LaunchConfigTest, StartMethodChoices) {
  EXPECT_TRUE(MustParse({"--start-method=spawn", "train.py"}).notices.empty());
  EXPECT_EQ(MustParse({"--start-method=forkserver", "train.py"}).notices.size(), 1u);
  EXPECT_EQ(ErrorOf({"--start-method=thread", "train.py"}),
            "--start-method: expected one of spawn, fork, forkserver, got 'thread'");
}

// --- The worker command ----------------------------------------------------------

TEST(LaunchConfigTest, WorkerArgv) {
  struct Case {
    Args args;
    Env env;
    Args argv;
  };
  for (const Case& c : std::vector<Case>{
           {{"train.py", "--lr", "1"}, {}, {"python3", "-u", "train.py", "--lr", "1"}},
           // torchrun prepends python whatever the file is called.
           {{"train", "a"}, {}, {"python3", "-u", "train", "a"}},
           {{"-m", "pkg.mod", "a"}, {}, {"python3", "-u", "-m", "pkg.mod", "a"}},
           {{"--module", "pkg.mod"}, {}, {"python3", "-u", "-m", "pkg.mod"}},
           {{"--no-python", "./a.out", "x"}, {}, {"./a.out", "x"}},
           {{"--no_python", "echo"}, {}, {"echo"}},
           {{"train.py"},
            {{"PYTHON_EXEC", "/opt/py/bin/python"}},
            {"/opt/py/bin/python", "-u", "train.py"}},
           {{"train.py"}, {{"PYTHON_EXEC", ""}}, {"python3", "-u", "train.py"}},
           {{"--run-path", "/abs/train.py", "a"},
            {},
            {"python3", "-u", "/abs/train.py", "a"}},
           // --run-path wins over --no-python and -m, as in torchrun.
           {{"--run-path", "--no-python", "-m", "/abs/t.py"},
            {},
            {"python3", "-u", "/abs/t.py"}},
       }) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    EXPECT_EQ(MustParse(c.args, c.env).worker_argv, c.argv);
  }
  LaunchConfig run_path = MustParse({"--run-path", "--no-python", "/abs/t.py"});
  ASSERT_EQ(run_path.notices.size(), 1u);
  EXPECT_EQ(
      run_path.notices[0],
      "--run-path: meshrun has no in-process interpreter; running python3 -u /abs/t.py "
      "and ignoring --no-python");
}

// A pip-installed meshrun runs its own virtualenv's python3, as torchrun runs
// sys.executable; $PYTHON_EXEC still wins, and --no-python runs no Python.
TEST(LaunchConfigTest, WorkerPythonIsTheVirtualenvsWhereMeshrunIsInstalled) {
  HostProbe venv = FakeHost();
  venv.venv_python = [] { return std::string("/home/u/venv/bin/python3"); };
  LaunchConfig config = MustParse({"train.py"}, {}, venv);
  EXPECT_EQ(config.worker_argv, (Args{"/home/u/venv/bin/python3", "-u", "train.py"}));
  EXPECT_EQ(config.python, "/home/u/venv/bin/python3");
  EXPECT_EQ(config.python_source, "meshrun's virtualenv");
  EXPECT_EQ(
      MustParse({"train.py"}, {{"PYTHON_EXEC", "/opt/py/bin/python"}}, venv).worker_argv,
      (Args{"/opt/py/bin/python", "-u", "train.py"}));
  EXPECT_EQ(MustParse({"--no-python", "./a.out"}, {}, venv).worker_argv, Args{"./a.out"});
  // Not in a virtualenv (build/bin/meshrun, /usr/bin/meshrun): PATH's python3.
  HostProbe system = FakeHost();
  system.venv_python = [] { return std::string(); };
  EXPECT_EQ(MustParse({"train.py"}, {}, system).python, "python3");
  EXPECT_EQ(MustParse({"train.py"}, {}, system).python_source, "PATH");
}

TEST(LaunchConfigTest, NoPythonAndModuleConflict) {
  EXPECT_EQ(ErrorOf({"--no-python", "-m", "pkg"}),
            "--no-python: cannot be combined with -m/--module");
  EXPECT_EQ(ErrorOf({"-m", "pkg"}, {{"PET_NO_PYTHON", "1"}}),
            "--no-python: cannot be combined with -m/--module");
}

// --- The script and its arguments --------------------------------------------------

TEST(LaunchConfigTest, ScriptArgumentsPassThroughUntouched) {
  LaunchConfig config = MustParse(
      {"--nproc-per-node", "2", "train.py", "--nproc-per-node", "8", "-m", "x"});
  EXPECT_EQ(config.nproc_per_node, 2);
  EXPECT_FALSE(config.module);
  EXPECT_EQ(config.script, "train.py");
  EXPECT_EQ(config.script_args, (Args{"--nproc-per-node", "8", "-m", "x"}));
  EXPECT_EQ(config.worker_argv,
            (Args{"python3", "-u", "train.py", "--nproc-per-node", "8", "-m", "x"}));

  struct Case {
    Args args;
    std::string script;
    Args script_args;
  };
  for (const Case& c : std::vector<Case>{
           {{"train.py", "--help"}, "train.py", {"--help"}},
           {{"train.py", "--bogus", "--", "x"}, "train.py", {"--bogus", "--", "x"}},
           {{"--", "train.py", "--standalone"}, "train.py", {"--standalone"}},
           {{"--nnodes=2", "--node-rank=0", "--", "-weird.py", "a"}, "-weird.py", {"a"}},
           {{"--", "--"}, "--", {}},
           {{"-"}, "-", {}},
           // argparse's rule: a negative number is never a flag.
           {{"-1", "x"}, "-1", {"x"}},
           {{"train.py", "", " spaced arg "}, "train.py", {"", " spaced arg "}},
           {{"--rdzv-id", "train.py", "real.py"}, "real.py", {}},
       }) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    LaunchConfig parsed = MustParse(c.args);
    EXPECT_EQ(parsed.script, c.script);
    EXPECT_EQ(parsed.script_args, c.script_args);
  }
}

TEST(LaunchConfigTest, MissingScript) {
  for (const Args& args :
       std::vector<Args>{{}, {"--nnodes", "2"}, {"--"}, {"--standalone"}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    EXPECT_EQ(ErrorOf(args), "missing training script (see meshrun --help)");
  }
}

// --- Command-line errors -------------------------------------------------------------

TEST(LaunchConfigTest, FlagSyntaxErrors) {
  struct Case {
    Args args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--bogus", "train.py"}, "--bogus: unknown flag (see meshrun --help)"},
           {{"--bogus=1", "train.py"}, "--bogus: unknown flag (see meshrun --help)"},
           {{"--nproc_per-node=1", "train.py"},
            "--nproc_per-node: unknown flag (see meshrun --help)"},
           {{"--no-such-flag", "train.py"},
            "--no-such-flag: unknown flag (see meshrun --help)"},
           {{"--nproc", "2", "train.py"}, "--nproc: unknown flag (see meshrun --help)"},
           {{"-x", "train.py"}, "-x: unknown flag (see meshrun --help)"},
           {{"-mx", "train.py"}, "-mx: unknown flag (see meshrun --help)"},
           {{"-nproc_per_node", "4", "train.py"},
            "-nproc_per_node: unknown flag (see meshrun --help)"},
           {{"--nnodes"}, "--nnodes: missing value"},
           {{"--nnodes", "--standalone", "train.py"}, "--nnodes: missing value"},
           {{"--rdzv-id", "--", "train.py"}, "--rdzv-id: missing value"},
           {{"-r"}, "-r: missing value"},
           {{"--standalone=1", "train.py"}, "--standalone: takes no value"},
           {{"--no_python=true", "train.py"}, "--no_python: takes no value"},
           {{"--rdzv-id=", "--rdzv-backend=c10d", "train.py"},
            "--rdzv-id: must not be empty"},
           {{"--role=", "train.py"}, "--role: must not be empty"},
           // The first mistake is reported.
           {{"--bogus", "--worse", "train.py"},
            "--bogus: unknown flag (see meshrun --help)"},
       }) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    EXPECT_EQ(ErrorOf(c.args), c.message);
  }
}

// --- Restart scope (issue 18) --------------------------------------------------

TEST(LaunchConfigTest, RestartScopeDefaultsToTheWholeJob) {
  LaunchConfig config = MustParse({"train.py"});
  EXPECT_EQ(config.restart_scope, RestartScope::kJob);
  EXPECT_EQ(config.replica_size, 1);
  config = MustParse({"--restart-scope=replica", "--nproc-per-node=3", "train.py"});
  EXPECT_EQ(config.restart_scope, RestartScope::kReplica);
  EXPECT_EQ(config.replica_size, 1);
}

TEST(LaunchConfigTest, WorkerStoreDefaultsByBackend) {
  EXPECT_EQ(MustParse({"train.py"}).worker_store, WorkerStore::kDefault);
  EXPECT_EQ(MustParse({"--worker-store=agent", "train.py"}).worker_store,
            WorkerStore::kAgent);
  EXPECT_EQ(ErrorOf({"--worker-store=rank0", "train.py"}),
            "--worker-store: expected agent or daemon, got 'rank0'");
}

TEST(LaunchConfigTest, RestartScopeAndReplicaSizeErrors) {
  EXPECT_EQ(ErrorOf({"--restart-scope=node", "train.py"}),
            "--restart-scope: expected job or replica, got 'node'");
  EXPECT_EQ(ErrorOf({"--restart-scope=replica", "--replica-size=0", "train.py"}),
            "--replica-size: expected a positive integer, got '0'");
  EXPECT_EQ(ErrorOf({"--restart-scope=replica", "--replica-size=-2", "train.py"}),
            "--replica-size: expected a positive integer, got '-2'");
  EXPECT_EQ(ErrorOf({"--replica-size=2", "--nproc-per-node=4", "train.py"}),
            "--replica-size: needs --restart-scope=replica (the default scope, job, "
            "restarts every worker)");
  EXPECT_EQ(ErrorOf({"--restart-scope=job", "--replica-size=1", "train.py"}),
            "--replica-size: needs --restart-scope=replica (the default scope, job, "
            "restarts every worker)");
  EXPECT_EQ(ErrorOf({"--restart-scope=replica", "--replica-size=3", "--nproc-per-node=4",
                     "train.py"}),
            "--replica-size: 3 does not divide --nproc-per-node=4: a replica group "
            "lives within one node, so each node runs whole replica groups");
  // From the environment, the variable is named.
  EXPECT_EQ(ErrorOf({"--nproc-per-node=4", "train.py"},
                    {{"PET_RESTART_SCOPE", "replica"}, {"PET_REPLICA_SIZE", "3"}}),
            "--replica-size: 3 does not divide --nproc-per-node=4: a replica group "
            "lives within one node, so each node runs whole replica groups (from "
            "PET_REPLICA_SIZE)");
  // Resolved counts are checked too (8 CPUs here).
  EXPECT_EQ(MustParse({"--restart-scope=replica", "--replica-size=4",
                       "--nproc-per-node=cpu", "train.py"})
                .replica_size,
            4);
  EXPECT_NE(ErrorOf({"--restart-scope=replica", "--replica-size=3",
                     "--nproc-per-node=cpu", "train.py"}),
            "<ok>");
}

TEST(LaunchConfigTest, EveryErrorIsOneLineStartingWithTheFlag) {
  const std::vector<Args> bad = {
      {"--nnodes=0", "t.py"},
      {"--nproc-per-node=x", "t.py"},
      {"--rdzv-backend=x", "t.py"},
      {"--rdzv-endpoint=a:b", "t.py"},
      {"--rdzv-conf=x=1", "t.py"},
      {"--max-restarts=x", "t.py"},
      {"--restart-scope=node", "t.py"},
      {"--replica-size=0", "--restart-scope=replica", "t.py"},
      {"--replica-size=2", "t.py"},
      {"--replica-size=3", "--restart-scope=replica", "--nproc-per-node=4", "t.py"},
      {"--monitor-interval=x", "t.py"},
      {"--start-method=x", "t.py"},
      {"-r", "9", "t.py"},
      {"-t", "9", "t.py"},
      {"--local-ranks-filter=x", "t.py"},
      {"--node-rank=x", "--rdzv-backend=c10d", "t.py"},
      {"--master-addr=a b", "t.py"},
      {"--master-port=x", "t.py"},
      {"--shutdown-timeout=x", "t.py"},
      {"--signals-to-handle=x", "t.py"},
      {"--log-line-prefix-template=${x}", "t.py"},
      {"--what", "t.py"},
  };
  for (const Args& args : bad) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    std::string message = ErrorOf(args);
    EXPECT_NE(message, "<ok>");
    EXPECT_EQ(message.find('\n'), std::string::npos);
    EXPECT_TRUE(absl::StartsWith(message, "-")) << message;
    std::string flag = args[0].substr(0, args[0].find('='));
    EXPECT_TRUE(absl::StartsWith(message, flag == "-r"   ? "--redirects:"
                                          : flag == "-t" ? "--tee:"
                                                         : flag + ":"))
        << message;
  }
}

// --- Help ------------------------------------------------------------------------------

TEST(LaunchConfigTest, HelpBeforeTheScript) {
  for (const Args& args : std::vector<Args>{{"--help"},
                                            {"-h"},
                                            {"--nnodes", "2", "--help", "train.py"},
                                            {"--bogus", "-h"},
                                            {"--nnodes=0", "--help"}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    absl::StatusOr<LaunchConfig> config = Parse(args);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(absl::StrContains(config->help_text, "--nproc-per-node"));
    EXPECT_TRUE(absl::StrContains(config->help_text, "--nproc_per_node"));
    EXPECT_TRUE(absl::StrContains(config->help_text, "PET_NPROC_PER_NODE"));
    EXPECT_TRUE(absl::StrContains(config->help_text, "-r,--redirects"));
  }
  EXPECT_TRUE(MustParse({"train.py", "--help"}).help_text.empty());
}

// --version as --help: before the script, over other mistakes; --help wins.
TEST(LaunchConfigTest, VersionBeforeTheScript) {
  for (const Args& args : std::vector<Args>{{"--version"},
                                            {"--nnodes", "2", "--version", "train.py"},
                                            {"--bogus", "--version"}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    absl::StatusOr<LaunchConfig> config = Parse(args);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(config->version_requested);
    EXPECT_TRUE(config->help_text.empty());
  }
  EXPECT_FALSE(MustParse({"train.py", "--version"}).version_requested);
  EXPECT_FALSE(MustParse({"--version", "--help"}).version_requested);
  EXPECT_TRUE(absl::StrContains(MustParse({"--help"}).help_text, "--version"));
}

// --- torchrun 2's rendezvous defaults ----------------------------------------------

// run.py: static (the default backend, or named) on one node with neither an
// endpoint nor --master-port becomes c10d on localhost:0 with a fresh run id;
// anything else stays static on the endpoint or --master-addr:--master-port.
TEST(LaunchConfigTest, TorchrunsStandaloneRule) {
  for (const Args& args : std::vector<Args>{{"train.py"},
                                            {"--rdzv-backend=static", "train.py"},
                                            {"--nnodes=1", "--node-rank=0", "train.py"},
                                            {"--rdzv-endpoint=", "train.py"}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    LaunchConfig config = MustParse(args);
    EXPECT_TRUE(config.standalone);
    EXPECT_EQ(config.rdzv_backend, RdzvBackend::kDynamic);
    EXPECT_EQ(config.rdzv_endpoint, (HostPort{"localhost", 0}));
    EXPECT_EQ(config.rdzv_id, kRunId);
    EXPECT_TRUE(config.notices.empty());
  }
  // torchrun replaces a given run id without a word; meshrun says so.
  EXPECT_EQ(MustParse({"--rdzv-id=job", "train.py"}).notices,
            (std::vector<std::string>{
                "one node with neither --rdzv-endpoint nor --master-port (torchrun's "
                "rule): ignoring --rdzv-id=job (one node, rendezvous on localhost:0, run "
                "id standalone-run-id)"}));

  struct Static {
    Args args;
    Env env;
    HostPort endpoint;
  };
  for (const Static& c : std::vector<Static>{
           {{"--master-port=29500", "train.py"}, {}, {"127.0.0.1", 29500}},
           {{"train.py"}, {{"PET_MASTER_PORT", "1234"}}, {"127.0.0.1", 1234}},
           {{"--master-addr=node0", "--master-port=7", "train.py"}, {}, {"node0", 7}},
           {{"--rdzv-endpoint=node0:5", "train.py"}, {}, {"node0", 5}},
           {{"--nnodes=2", "--node-rank=1", "train.py"}, {}, {"127.0.0.1", 29500}},
       }) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    LaunchConfig config = MustParse(c.args, c.env);
    EXPECT_FALSE(config.standalone);
    EXPECT_EQ(config.rdzv_backend, RdzvBackend::kStatic);
    EXPECT_EQ(config.rdzv_endpoint, c.endpoint);
    EXPECT_EQ(config.rdzv_id, "none");
  }
  // An elastic range needs the daemon, named.
  EXPECT_EQ(ErrorOf({"--nnodes=1:2", "train.py"}),
            "--nnodes: the static backend needs a fixed node count, got '1:2'");
  EXPECT_EQ(MustParse({"--rdzv-backend=c10d", "--nnodes=1:2", "train.py"}).rdzv_backend,
            RdzvBackend::kDynamic);
}

// --- torchrun flags meshrun does not carry out -------------------------------------

TEST(LaunchConfigTest, RefusedFlagsSayWhatMeshrunDoesInstead) {
  struct Case {
    Args flags;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--logs-specs=mine"},
            "--logs-specs: meshrun loads no Python LogsSpecs plugins; it lays out logs "
            "as torchrun's default does (--log-dir, -r, -t)"},
           {{"--numa_binding", "node"},
            "--numa-binding: meshrun binds no worker to CPUs or NUMA nodes; run the "
            "workers under numactl or taskset (--no-python numactl ... python3 -u "
            "SCRIPT)"},
           {{"--print-completion=bash"},
            "--print-completion: meshrun prints no shell completion script; meshrun "
            "--help lists every flag"},
           {{"--event-log-handler=console"},
            "--event-log-handler: meshrun records no torchelastic events, so only 'null' "
            "is accepted; the daemon's status page and metrics (--metrics-port) report "
            "the run, got 'console'"},
       }) {
    SCOPED_TRACE(absl::StrJoin(c.flags, " "));
    EXPECT_EQ(ErrorOf(With(c.flags)), c.message);
    // As torchrun acts on --print-completion before it looks for a script.
    EXPECT_EQ(ErrorOf(c.flags), c.message);
  }
  EXPECT_EQ(ErrorOf({"train.py"}, {{"PET_EVENT_LOG_HANDLER", "console"}}),
            "--event-log-handler: meshrun records no torchelastic events, so only 'null' "
            "is accepted; the daemon's status page and metrics (--metrics-port) report "
            "the run, got 'console' (from PET_EVENT_LOG_HANDLER)");
  // torchrun reads no PET_* for these three.
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_LOGS_SPECS", "x"},
                                     {"PET_NUMA_BINDING", "node"},
                                     {"PET_PRINT_COMPLETION", "bash"}})
                .notices,
            std::vector<std::string>{});
  // Help lists them, without a PET_* name.
  std::string help = MustParse({"--help"}).help_text;
  EXPECT_TRUE(absl::StrContains(help, "--numa-binding,--numa_binding"));
  EXPECT_FALSE(absl::StrContains(help, "PET_NUMA_BINDING"));
  EXPECT_TRUE(absl::StrContains(help, "PET_EVENT_LOG_HANDLER"));
}

// torchrun's comma_separated_list: ",," is a literal comma; given empty, it
// is one empty filter (which matches every line).
TEST(LaunchConfigTest, DuplicateFilters) {
  LaunchConfig none = MustParse({"train.py"});
  EXPECT_FALSE(none.duplicate_stdout_filters.has_value());
  EXPECT_FALSE(none.duplicate_stderr_filters.has_value());
  LaunchConfig config = MustParse({"--duplicate-stdout-filters=apple,,pie,orange",
                                   "--duplicate_stderr_filters", "", "train.py"});
  EXPECT_EQ(config.duplicate_stdout_filters,
            (std::vector<std::string>{"apple,pie", "orange"}));
  EXPECT_EQ(config.duplicate_stderr_filters, (std::vector<std::string>{""}));
  EXPECT_EQ(MustParse({"train.py"}, {{"PET_DUPLICATE_STDERR_FILTERS", "Error"}})
                .duplicate_stderr_filters,
            (std::vector<std::string>{"Error"}));
}

TEST(LaunchConfigTest, VirtualLocalRankNeedsAGpuPerWorker) {
  EXPECT_TRUE(MustParse({"--virtual-local-rank", "--nproc-per-node=2", "train.py"},
                        {{"CUDA_VISIBLE_DEVICES", "3,5"}})
                  .virtual_local_rank);
  EXPECT_EQ(ErrorOf({"--virtual-local-rank", "--nproc-per-node=3", "train.py"},
                    {{"CUDA_VISIBLE_DEVICES", "3,5"}}),
            "--virtual-local-rank: local rank 2 has no GPU in CUDA_VISIBLE_DEVICES=3,5 "
            "(--nproc-per-node=3)");
  // HIP's list wins where set, as in torchrun.
  EXPECT_EQ(ErrorOf({"--virtual-local-rank", "--nproc-per-node=2", "train.py"},
                    {{"CUDA_VISIBLE_DEVICES", "0,1"}, {"HIP_VISIBLE_DEVICES", "4"}}),
            "--virtual-local-rank: local rank 1 has no GPU in HIP_VISIBLE_DEVICES=4 "
            "(--nproc-per-node=2)");
  // No list: local rank N gets GPU N.
  EXPECT_TRUE(MustParse({"--virtual-local-rank", "--nproc-per-node=8", "train.py"})
                  .virtual_local_rank);
}

TEST(LaunchConfigTest, ShutdownTimeoutFromTorchsVariable) {
  const Env env = {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}};
  EXPECT_EQ(MustParse({"train.py"}, env).shutdown_timeout, milliseconds(7000));
  EXPECT_EQ(MustParse({"--shutdown-timeout=2", "train.py"}, env).shutdown_timeout,
            milliseconds(2000));
  EXPECT_EQ(
      ErrorOf({"train.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "x"}}),
      "--shutdown-timeout: expected a non-negative number of seconds, got 'x' (from "
      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT)");
}

TEST(LaunchConfigTest, NprocPerNodeXpuIsRefusedInOneLine) {
  EXPECT_EQ(ErrorOf({"--nproc-per-node=xpu", "train.py"}),
            "--nproc-per-node: 'xpu': meshrun counts NVIDIA GPUs only (gpu, auto); give "
            "the number of workers");
}

}  // namespace
// --ray[=ADDRESS]: the address (else $RAY_ADDRESS, else auto), a bare --ray
// that takes no following token, and the flags that would name another
// rendezvous refused in one line.
TEST(LaunchConfigTest, RayTakesItsAddressOnlyAfterAnEqualsSign) {
  LaunchConfig bare = MustParse({"--ray", "--nnodes=2", "train.py"});
  EXPECT_EQ(bare.ray_address, "auto");
  EXPECT_EQ(bare.script, "train.py");
  EXPECT_EQ(bare.max_nodes, 2);
  EXPECT_FALSE(bare.ray_rdzv_id_given);
  EXPECT_EQ(MustParse({"--ray", "train.py"}, {{"RAY_ADDRESS", "h:6379"}}).ray_address,
            "h:6379");
  LaunchConfig named = MustParse({"--ray=ray://h:10001", "--rdzv-id=job", "train.py"});
  EXPECT_EQ(named.ray_address, "ray://h:10001");
  EXPECT_TRUE(named.ray_rdzv_id_given);
  EXPECT_FALSE(MustParse({"train.py"}).ray_address.has_value());
}

TEST(LaunchConfigTest, RayRefusesAnotherRendezvous) {
  for (const Args& flags : std::vector<Args>{{"--rdzv-endpoint=h:1"},
                                             {"--standalone"},
                                             {"--node-rank=0"},
                                             {"--master-addr=h"},
                                             {"--rdzv-backend=static"}}) {
    Args args{"--ray"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::string error = ErrorOf(With(args));
    EXPECT_TRUE(absl::StartsWith(error, "--ray: ")) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  EXPECT_EQ(ErrorOf({"--ray", "--slurm", "train.py"}),
            "--ray: cannot be combined with --slurm");
}

}  // namespace meshrun::launcher
