#include "rendezvous/core/tcpstore_wire.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace meshrun::rdzv::tcpstore {
namespace {

// Every query type survives an encode/parse round trip, and parses only
// once all of its bytes are there.
TEST(TcpStoreWireTest, EveryQueryRoundTripsAndNeedsAllItsBytes) {
  const std::vector<Query> queries = {
      MakeQuery(QueryType::kValidate, {}, {}, kValidationMagic),
      MakeQuery(QueryType::kSet, {"k"}, {"v"}),
      MakeQuery(QueryType::kCompareSet, {"k"}, {"", "new"}),
      MakeQuery(QueryType::kGet, {"k"}),
      MakeQuery(QueryType::kAdd, {"k"}, {}, -7),
      MakeQuery(QueryType::kCheck, {"a", "b"}),
      MakeQuery(QueryType::kWait, {"a"}),
      MakeQuery(QueryType::kGetNumKeys),
      MakeQuery(QueryType::kDeleteKey, {"k"}),
      MakeQuery(QueryType::kAppend, {"k"}, {"tail"}),
      MakeQuery(QueryType::kMultiGet, {"a", "b", "c"}),
      MakeQuery(QueryType::kMultiSet, {"a", "b"}, {"1", "2"}),
      MakeQuery(QueryType::kCancelWait),
      MakeQuery(QueryType::kPing, {}, {}, 12345),
      MakeQuery(QueryType::kQueuePush, {"q"}, {"item"}),
      MakeQuery(QueryType::kQueuePop, {"q"}),
      MakeQuery(QueryType::kQueueLen, {"q"}),
      MakeQuery(QueryType::kListKeys),
      MakeQuery(QueryType::kBarrier, {"b"}, {}, 4),
  };
  ASSERT_EQ(queries.size(), kNumQueryTypes);
  for (const Query& q : queries) {
    SCOPED_TRACE(ToString(q.type));
    const std::string bytes = EncodeQuery(q);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      ParseResult partial = ParseQuery(std::string_view(bytes).substr(0, cut), {});
      ASSERT_EQ(partial.kind, ParseResult::Kind::kIncomplete) << cut;
      EXPECT_GT(partial.needed, cut);
      EXPECT_LE(partial.needed, bytes.size());
    }
    ParseResult whole = ParseQuery(bytes + "trailing", {});
    ASSERT_EQ(whole.kind, ParseResult::Kind::kQuery);
    EXPECT_EQ(whole.consumed, bytes.size());
    EXPECT_EQ(whole.query.type, q.type);
    EXPECT_EQ(whole.query.keys, q.keys);
    EXPECT_EQ(whole.query.values, q.values);
    EXPECT_EQ(whole.query.number, q.number);
  }
}

// c10d's client writes the type byte, then u64-length-prefixed fields in the
// host's (little-endian) byte order.
TEST(TcpStoreWireTest, SetIsTheBytesTorchsClientSends) {
  const std::string expected = std::string("\x01", 1) +
                               std::string("\x01\0\0\0\0\0\0\0", 8) + "k" +
                               std::string("\x02\0\0\0\0\0\0\0", 8) + "vv";
  EXPECT_EQ(EncodeQuery(MakeQuery(QueryType::kSet, {"k"}, {"vv"})), expected);
}

TEST(TcpStoreWireTest, ALargeValueSaysHowManyBytesItNeeds) {
  const std::string bytes =
      EncodeQuery(MakeQuery(QueryType::kSet, {"k"}, {std::string(1 << 20, 'x')}));
  ParseResult head = ParseQuery(std::string_view(bytes).substr(0, 100), {});
  ASSERT_EQ(head.kind, ParseResult::Kind::kIncomplete);
  EXPECT_EQ(head.needed, bytes.size());
}

TEST(TcpStoreWireTest, UnknownTypesAndOversizedFieldsAreRefusedAtOnce) {
  EXPECT_EQ(ParseQuery(std::string(1, '\x7f'), {}).kind, ParseResult::Kind::kBad);
  WireLimits limits;
  limits.max_value_bytes = 16;
  // Only the length has arrived: refused without waiting for the value.
  const std::string big =
      EncodeQuery(MakeQuery(QueryType::kSet, {"k"}, {std::string(17, 'x')}));
  ParseResult r = ParseQuery(std::string_view(big).substr(0, 1 + 8 + 1 + 8), limits);
  EXPECT_EQ(r.kind, ParseResult::Kind::kBad);
  EXPECT_NE(r.error.find("over the limit"), std::string::npos) << r.error;
  limits.max_keys_per_query = 2;
  EXPECT_EQ(
      ParseQuery(EncodeQuery(MakeQuery(QueryType::kWait, {"a", "b", "c"})), limits).kind,
      ParseResult::Kind::kBad);
  // A length no machine could hold.
  std::string huge(1, '\x03');
  huge += std::string(8, '\xff');
  EXPECT_EQ(ParseQuery(huge, {}).kind, ParseResult::Kind::kBad);
}

TEST(TcpStoreWireTest, RepliesAreLittleEndianAndLengthPrefixed) {
  std::string out;
  AppendI64(&out, 7);
  AppendBytes(&out, "ab");
  AppendU8(&out, static_cast<uint8_t>(WaitResponse::kWaitCanceled));
  EXPECT_EQ(out, std::string("\x07\0\0\0\0\0\0\0", 8) +
                     std::string("\x02\0\0\0\0\0\0\0", 8) + "ab" + "\x01");
}

}  // namespace
}  // namespace meshrun::rdzv::tcpstore
