// A daemon endpoint, or a list of daemon replicas, as a gRPC channel target
// (rendezvous/client/endpoint_list.h). Numeric addresses only: no DNS.

#include <gtest/gtest.h>

#include "rendezvous/client/endpoint_list.h"

namespace meshrun::rdzv {
namespace {

TEST(ChannelTargetTest, OneEndpointIsTheTargetAsItIs) {
  for (const std::string endpoint : {"node0:29400", "127.0.0.1:1", "[::1]:5"}) {
    ChannelTarget target = ResolveChannelTarget(endpoint);
    EXPECT_EQ(target.target, endpoint);
    EXPECT_EQ(target.tls_name, "");
    EXPECT_FALSE(IsEndpointList(endpoint));
  }
}

TEST(ChannelTargetTest, AListOfIpv4AddressesKeepsItsOrder) {
  ChannelTarget target = ResolveChannelTarget("127.0.0.3:7, 127.0.0.1:29400,10.1.2.3:8");
  EXPECT_EQ(target.target, "ipv4:127.0.0.3:7,127.0.0.1:29400,10.1.2.3:8");
  EXPECT_EQ(target.tls_name, "127.0.0.3");
  EXPECT_TRUE(target.unresolved.empty());
}

TEST(ChannelTargetTest, MixedFamiliesMapIpv4IntoIpv6) {
  EXPECT_EQ(ResolveChannelTarget("[::1]:5,127.0.0.1:6").target,
            "ipv6:[::1]:5,[::ffff:127.0.0.1]:6");
  EXPECT_EQ(SockaddrTarget({{"10.0.0.1", 1}, {"fd00::2", 2}}),
            "ipv6:[::ffff:10.0.0.1]:1,[fd00::2]:2");
}

TEST(ChannelTargetTest, RepeatedAddressesAppearOnce) {
  EXPECT_EQ(ResolveChannelTarget("127.0.0.1:5,127.0.0.1:5,127.0.0.1:6").target,
            "ipv4:127.0.0.1:5,127.0.0.1:6");
}

TEST(ChannelTargetTest, AnEntryThatIsNoHostPortLeavesTheTargetAsGiven) {
  EXPECT_EQ(ResolveChannelTarget("127.0.0.1:5,nope").target, "127.0.0.1:5,nope");
  EXPECT_EQ(ResolveChannelTarget("ipv4:127.0.0.1:5,127.0.0.1:6").target,
            "ipv4:127.0.0.1:5,127.0.0.1:6");
}

TEST(ChannelTargetTest, UnresolvableEntriesAreLeftOutAndNamed) {
  ChannelTarget target = ResolveChannelTarget("no-such-host.invalid:5,127.0.0.1:6");
  EXPECT_EQ(target.target, "ipv4:127.0.0.1:6");
  EXPECT_EQ(target.unresolved, std::vector<std::string>{"no-such-host.invalid:5"});
  // None resolves: the first entry, for gRPC's resolver to report and retry.
  EXPECT_EQ(ResolveChannelTarget("no-such-host.invalid:5,also.invalid:6").target,
            "no-such-host.invalid:5");
}

TEST(ChannelTargetTest, SplitHostPort) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(SplitHostPort("[fd00::1]:29400", &host, &port));
  EXPECT_EQ(host, "fd00::1");
  EXPECT_EQ(port, 29400);
  EXPECT_FALSE(SplitHostPort("fd00::1:29400", &host, &port));
  EXPECT_FALSE(SplitHostPort("host:0", &host, &port));
  EXPECT_FALSE(SplitHostPort(":5", &host, &port));
  EXPECT_FALSE(SplitHostPort("host", &host, &port));
}

}  // namespace
}  // namespace meshrun::rdzv
