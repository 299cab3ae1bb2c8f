#include "rendezvous/core/tcpstore_owner.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace meshrun::rdzv {
namespace {

using Live = std::map<std::string, std::string>;

TEST(TcpStoreOwnerTest, PinnedServesItsRunOnly) {
  TcpStoreOwner owner("job");
  EXPECT_FALSE(owner.Claim("other", {{"other", "/o/1"}}));
  EXPECT_TRUE(owner.Claim("job", {{"other", "/o/1"}, {"job", "/j/1"}}));
  EXPECT_EQ(owner.Namespace({{"other", "/o/1"}, {"job", "/j/2"}}).value(), "/j/2");
  // Not in progress (between rounds, or gone): refused, not another run's.
  EXPECT_EQ(owner.Namespace({{"other", "/o/1"}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TcpStoreOwnerTest, TheFirstRunAssignedOwnsTheEndpointUntilItCloses) {
  TcpStoreOwner owner;
  EXPECT_EQ(owner.Namespace({}).value(), kDefaultTcpStoreNamespace);
  EXPECT_TRUE(owner.Claim("a", {{"a", "/a/1"}}));
  // A second run is told to use its own store, and a's clients go on being
  // served while b is in progress too.
  EXPECT_FALSE(owner.Claim("b", {{"a", "/a/1"}, {"b", "/b/1"}}));
  EXPECT_EQ(owner.Namespace({{"a", "/a/1"}, {"b", "/b/1"}}).value(), "/a/1");
  // a's next round keeps it.
  EXPECT_TRUE(owner.Claim("a", {{"a", "/a/2"}, {"b", "/b/1"}}));
  EXPECT_EQ(owner.Namespace({{"a", "/a/2"}, {"b", "/b/1"}}).value(), "/a/2");
  // Once a has closed, b's next round takes it over.
  EXPECT_TRUE(owner.Claim("b", {{"b", "/b/2"}}));
  EXPECT_EQ(owner.owner(), "b");
  EXPECT_EQ(owner.Namespace({{"b", "/b/2"}}).value(), "/b/2");
}

TEST(TcpStoreOwnerTest, WithoutAClaimASingleRunIsServedAndSeveralAreRefused) {
  // A daemon restarted from its state dir has runs in progress it assigned
  // before: a single one is its owner again.
  TcpStoreOwner owner;
  EXPECT_EQ(owner.Namespace({{"a", "/a/3"}}).value(), "/a/3");
  EXPECT_EQ(owner.owner(), "a");
  TcpStoreOwner fresh;
  auto refused = fresh.Namespace({{"a", "/a/1"}, {"b", "/b/1"}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("2 runs are in progress"), std::string::npos);
}

}  // namespace
}  // namespace meshrun::rdzv
