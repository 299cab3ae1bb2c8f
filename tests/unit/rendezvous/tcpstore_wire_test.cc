#include "rendezvous/core/tcpstore_wire.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace meshrun::rdzv::tcpstore {
namespace {

// One query of each type.
std::vector<Query> OneOfEach() {
  return {
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
}

// A multi_set of `n` entries with keys k0, k1, ... and values of `value_bytes`.
Query ManyEntries(size_t n, size_t value_bytes) {
  Query q = MakeQuery(QueryType::kMultiSet);
  for (size_t i = 0; i < n; ++i) {
    q.keys.push_back("k" + std::to_string(i));
    q.values.push_back(std::string(value_bytes, static_cast<char>('a' + i % 26)));
  }
  return q;
}

// What a connection does: `stream` arrives `chunk` bytes at a time into a
// buffer; the scanner finds each query's end and ParseQuery parses it once.
struct Fed {
  std::vector<Query> queries;
  uint64_t steps = 0;
  std::string error;  // the first bad query's
};
Fed FeedInChunks(const std::string& stream, size_t chunk, const WireLimits& limits) {
  Fed fed;
  FrameScanner scanner(limits);
  std::string buffer;
  for (size_t at = 0; at < stream.size() && fed.error.empty(); at += chunk) {
    buffer.append(stream, at, chunk);
    for (;;) {
      const ScanResult scan = scanner.Scan(buffer);
      if (scan.kind == ScanResult::Kind::kBad) {
        fed.error = scan.error;
        break;
      }
      if (scan.kind == ScanResult::Kind::kIncomplete) {
        EXPECT_GT(scan.needed, buffer.size());
        break;
      }
      ParseResult parsed =
          ParseQuery(std::string_view(buffer).substr(0, scan.frame_bytes), limits);
      EXPECT_EQ(parsed.kind, ParseResult::Kind::kQuery);
      EXPECT_EQ(parsed.consumed, scan.frame_bytes);
      fed.queries.push_back(std::move(parsed.query));
      buffer.erase(0, scan.frame_bytes);
      scanner.Reset();
    }
  }
  fed.steps = scanner.steps();
  EXPECT_TRUE(!fed.error.empty() || buffer.empty()) << buffer.size() << " bytes left";
  return fed;
}

void ExpectSameQueries(const std::vector<Query>& got, const std::vector<Query>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(ToString(want[i].type));
    EXPECT_EQ(got[i].type, want[i].type);
    EXPECT_EQ(got[i].keys, want[i].keys);
    EXPECT_EQ(got[i].values, want[i].values);
    EXPECT_EQ(got[i].number, want[i].number);
  }
}

// Every query type survives an encode/parse round trip, and parses only
// once all of its bytes are there.
TEST(TcpStoreWireTest, EveryQueryRoundTripsAndNeedsAllItsBytes) {
  const std::vector<Query> queries = OneOfEach();
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

// However the bytes are cut, the scanner and one parse per frame yield the
// queries that were sent, and the scanner looks at each field once: its
// steps are the same fed a byte at a time as fed everything at once.
TEST(TcpStoreWireTest, TheScannerFindsEachQueryHoweverTheBytesAreCut) {
  std::vector<Query> queries = OneOfEach();
  queries.push_back(ManyEntries(300, 5));
  queries.push_back(MakeQuery(QueryType::kMultiGet));  // no keys
  queries.push_back(MakeQuery(QueryType::kSet, {""}, {""}));
  std::string stream;
  for (const Query& q : queries) stream += EncodeQuery(q);
  const Fed whole = FeedInChunks(stream, stream.size(), {});
  ASSERT_TRUE(whole.error.empty()) << whole.error;
  ExpectSameQueries(whole.queries, queries);
  for (size_t chunk : {1, 2, 3, 7, 64}) {
    SCOPED_TRACE(chunk);
    const Fed fed = FeedInChunks(stream, chunk, {});
    ASSERT_TRUE(fed.error.empty()) << fed.error;
    ExpectSameQueries(fed.queries, queries);
    EXPECT_EQ(fed.steps, whole.steps);
  }
}

// The 21 MB multi_set of issue 27 in miniature: n entries cost n keys' and
// n values' prefixes, however many reads bring them (ParseQuery alone would
// restart at the first entry on each read).
TEST(TcpStoreWireTest, ScanningAQueryOfManyFieldsIsLinearInItsFields) {
  constexpr size_t kEntries = 20000;
  const Query q = ManyEntries(kEntries, 16);
  const std::string bytes = EncodeQuery(q);
  const Fed fed = FeedInChunks(bytes, 1, {});
  ASSERT_TRUE(fed.error.empty()) << fed.error;
  ASSERT_EQ(fed.queries.size(), 1u);
  EXPECT_EQ(fed.queries[0].keys, q.keys);
  EXPECT_EQ(fed.queries[0].values, q.values);
  // The type byte, the count, then a key and a value per entry.
  EXPECT_EQ(fed.steps, 2 + 2 * kEntries);
}

// Once the last field's length is in, the scanner knows the query's exact
// size, so a large value is read into place without scanning again.
TEST(TcpStoreWireTest, TheScannerTellsTheFrameEndOnceTheLastLengthIsIn) {
  const std::string bytes =
      EncodeQuery(MakeQuery(QueryType::kSet, {"k"}, {std::string(1 << 20, 'x')}));
  FrameScanner scanner({});
  const size_t header = 1 + 8 + 1 + 8;
  ScanResult r = scanner.Scan(std::string_view(bytes).substr(0, header - 1));
  ASSERT_EQ(r.kind, ScanResult::Kind::kIncomplete);
  EXPECT_EQ(r.needed, header);
  r = scanner.Scan(std::string_view(bytes).substr(0, header));
  ASSERT_EQ(r.kind, ScanResult::Kind::kIncomplete);
  EXPECT_EQ(r.needed, bytes.size());
  r = scanner.Scan(bytes);
  ASSERT_EQ(r.kind, ScanResult::Kind::kFrame);
  EXPECT_EQ(r.frame_bytes, bytes.size());
}

// The scanner refuses what ParseQuery refuses, with the same line, as soon
// as a length gives it away.
TEST(TcpStoreWireTest, TheScannerAndTheParserRefuseTheSameQueries) {
  WireLimits limits;
  limits.max_key_bytes = 4;
  limits.max_value_bytes = 16;
  limits.max_keys_per_query = 8;
  limits.max_query_bytes = MaxQueryBytesFor(4, 16) - kQueryBytesMargin;
  auto header_of = [](const Query& q, size_t cut) {
    return EncodeQuery(q).substr(0, cut);
  };
  const std::vector<std::string> bad = {
      std::string(1, ''),
      header_of(MakeQuery(QueryType::kGet, {"12345"}), 1 + 8),
      header_of(MakeQuery(QueryType::kSet, {"k"}, {std::string(17, 'x')}), 1 + 8 + 1 + 8),
      EncodeQuery(
          MakeQuery(QueryType::kWait, {"a", "b", "c", "d", "e", "f", "g", "h", "i"})),
      // Three full values are more than a query may carry.
      header_of(ManyEntries(3, 16), 1 + 8 + 8 + 2 + 8 + 16 + 8 + 2 + 8 + 16 + 8 + 2 + 8),
  };
  for (const std::string& bytes : bad) {
    FrameScanner scanner(limits);
    const ScanResult scan = scanner.Scan(bytes);
    const ParseResult parse = ParseQuery(bytes, limits);
    ASSERT_EQ(scan.kind, ScanResult::Kind::kBad) << parse.error;
    ASSERT_EQ(parse.kind, ParseResult::Kind::kBad) << scan.error;
    EXPECT_EQ(scan.error, parse.error);
  }
  // compare_set with its key and both values at their limits fits exactly.
  const std::string fits = EncodeQuery(MakeQuery(
      QueryType::kCompareSet, {"kkkk"}, {std::string(16, 'e'), std::string(16, 'd')}));
  ASSERT_EQ(fits.size(), limits.max_query_bytes);
  FrameScanner scanner(limits);
  EXPECT_EQ(scanner.Scan(fits).kind, ScanResult::Kind::kFrame);
  EXPECT_EQ(ParseQuery(fits, limits).kind, ParseResult::Kind::kQuery);
  // The default admits it at the default limits.
  EXPECT_GE(WireLimits{}.max_query_bytes, 1 + 3 * 8 + 4096 + 2 * (size_t{64} << 20));
  EXPECT_EQ(WireLimits{}.max_query_bytes, MaxQueryBytesFor(8192, size_t{64} << 20));
}

// Mangled queries (bytes overwritten, cut short): fed a byte at a time, the
// scanner ends a query where ParseQuery does, and refuses what it refuses
// with the same line. (tcpstore_bytes_fuzzer checks the same on any bytes.)
TEST(TcpStoreWireTest, TheScannerAgreesWithTheParserOnMangledQueries) {
  WireLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 32;
  limits.max_keys_per_query = 6;
  limits.max_query_bytes = 200;
  std::vector<Query> queries = OneOfEach();
  queries.push_back(ManyEntries(5, 10));
  std::mt19937 random(27);
  int parsed_whole = 0;
  int refused = 0;
  for (int round = 0; round < 4000; ++round) {
    std::string bytes = EncodeQuery(queries[random() % queries.size()]);
    const int edits = static_cast<int>(random() % 3);
    for (int e = 0; e < edits; ++e) {
      const char small[] = {0, 1, 2, 5, 9, 17, 33, 127, '\xff'};
      bytes[random() % bytes.size()] = small[random() % sizeof(small)];
    }
    if (random() % 4 == 0) bytes.resize(random() % (bytes.size() + 1));
    SCOPED_TRACE(round);
    const ParseResult parsed = ParseQuery(bytes, limits);
    FrameScanner scanner(limits);
    ScanResult scan;
    for (size_t n = 0; n <= bytes.size(); ++n) {
      scan = scanner.Scan(std::string_view(bytes).substr(0, n));
      if (scan.kind != ScanResult::Kind::kIncomplete) break;
    }
    if (parsed.kind == ParseResult::Kind::kQuery) {
      ++parsed_whole;
      ASSERT_EQ(scan.kind, ScanResult::Kind::kFrame) << scan.error;
      EXPECT_EQ(scan.frame_bytes, parsed.consumed);
    } else if (parsed.kind == ParseResult::Kind::kBad) {
      ++refused;
      ASSERT_EQ(scan.kind, ScanResult::Kind::kBad);
      EXPECT_EQ(scan.error, parsed.error);
    } else {
      // Short of a whole query the scanner may refuse it from a length the
      // parse has not reached; it never ends it.
      EXPECT_NE(scan.kind, ScanResult::Kind::kFrame);
    }
  }
  EXPECT_GT(parsed_whole, 100);
  EXPECT_GT(refused, 100);
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
