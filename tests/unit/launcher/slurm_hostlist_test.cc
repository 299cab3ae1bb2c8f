#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "launcher/slurm_env.h"

namespace meshrun::launcher {
namespace {

using Hosts = std::vector<std::string>;

std::string Expanded(const std::string& hostlist) {
  auto hosts = ExpandHostlist(hostlist);
  if (!hosts.ok()) return "error: " + std::string(hosts.status().message());
  return absl::StrJoin(*hosts, " ");
}

struct Case {
  std::string hostlist;
  std::string expected;
};

TEST(SlurmHostlistTest, ExpandsLikeScontrolShowHostnames) {
  const Case kCases[] = {
      {"n1", "n1"},
      {"n[1-3]", "n1 n2 n3"},
      {"node[01-04,07]", "node01 node02 node03 node04 node07"},
      {"node[1-2],gpu[08-10]", "node1 node2 gpu08 gpu09 gpu10"},
      {"a1,b2,c3", "a1 b2 c3"},
      {"n[8-10]", "n8 n9 n10"},
      {"n[008-010]", "n008 n009 n010"},
      {"n[099-101]", "n099 n100 n101"},
      {"n[7]", "n7"},
      {"n[3,1,2]", "n3 n1 n2"},
      {"rack[1-2]-n[1-2]", "rack1-n1 rack1-n2 rack2-n1 rack2-n2"},
      {"n[1-2].cluster.org", "n1.cluster.org n2.cluster.org"},
      {"x-[0-1]-y,z", "x-0-y x-1-y z"},
      {"[1-2]", "1 2"},
      {"host-a,n[1-2],host-b", "host-a n1 n2 host-b"},
      {"n[0-0]", "n0"},
  };
  for (const Case& c : kCases) {
    EXPECT_EQ(Expanded(c.hostlist), c.expected) << c.hostlist;
  }
}

TEST(SlurmHostlistTest, RejectsMalformedListsWithAReason) {
  const Case kCases[] = {
      {"", "it is empty"},
      {"n[1-3", "'[' is never closed"},
      {"n1-3]", "']' without '['"},
      {"n[1-[2]]", "nested '['"},
      {"n[]", "empty range"},
      {"n[1,,2]", "empty range"},
      {"n[1,]", "empty range"},
      {"n[3-1]", "runs backwards"},
      {"n[a-c]", "'a-c' is not a number"},
      {"n[1-]", "'1-' is not a number"},
      {"n[-2]", "'-2' is not a number"},
      {"n[1-2-3]", "'1-2-3' is not a number"},
      {"n1,,n2", "empty host name"},
      {"n1,", "empty host name"},
      {",n1", "empty host name"},
      {"n1 n2", "whitespace"},
      {"n[0-99999999]", "more than"},
      {"a[0-1023]b[0-1023]c[0-1]", "more than"},
      {"n[1234567890123456789012-1234567890123456789013]", "is not a number"},
  };
  for (const Case& c : kCases) {
    auto hosts = ExpandHostlist(c.hostlist);
    ASSERT_FALSE(hosts.ok()) << c.hostlist;
    EXPECT_EQ(hosts.status().code(), absl::StatusCode::kInvalidArgument);
    std::string message(hosts.status().message());
    EXPECT_TRUE(absl::StrContains(message, "malformed hostlist '" + c.hostlist + "'"))
        << message;
    EXPECT_TRUE(absl::StrContains(message, c.expected)) << c.hostlist << ": " << message;
  }
}

TEST(SlurmHostlistTest, LargeListsStayInOrder) {
  auto hosts = ExpandHostlist("n[0001-1000],m[1-24]");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 1024u);
  EXPECT_EQ(hosts->front(), "n0001");
  EXPECT_EQ((*hosts)[999], "n1000");
  EXPECT_EQ(hosts->back(), "m24");
}

TEST(SlurmCountListTest, ExpandsRepeats) {
  auto counts = ExpandCountList("2(x3),1,4(x2)");
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts, (std::vector<int>{2, 2, 2, 1, 4, 4}));
  EXPECT_EQ(*ExpandCountList("1"), (std::vector<int>{1}));
  for (const char* bad : {"", "2(x)", "2(x0)", "x", "2(y3)", "2(x3", "1,,2", "-1"}) {
    EXPECT_FALSE(ExpandCountList(bad).ok()) << bad;
  }
}

TEST(SlurmRendezvousPortTest, StableInRangeAndSpreadOverJobs) {
  EXPECT_EQ(SlurmRendezvousPort("42.0"), SlurmRendezvousPort("42.0"));
  std::vector<int> ports;
  for (int job = 1; job <= 50; ++job) {
    int port = SlurmRendezvousPort(std::to_string(job) + ".0");
    EXPECT_GE(port, 20000);
    EXPECT_LT(port, 29000) << "clear of torch's 29400 and 29500";
    ports.push_back(port);
  }
  std::sort(ports.begin(), ports.end());
  EXPECT_EQ(std::unique(ports.begin(), ports.end()), ports.end())
      << "consecutive job ids should not share a port";
}

}  // namespace
}  // namespace meshrun::launcher
