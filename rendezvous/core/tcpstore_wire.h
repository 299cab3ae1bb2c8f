#pragma once

// c10d's TCPStore wire protocol, as a pure codec: queries parsed from the
// bytes a stock TCPStore client (torch 2.15, Python or C++) sends, and the
// bytes of each reply. No sockets; the front-end (server/tcpstore_server.h)
// does the I/O and runs the queries on the daemon's store.
//
// The protocol, as torch's TCPStore client speaks it: a connection starts
// with VALIDATE and a 32-bit magic number; every query is a one-byte
// QueryType followed by its fields. Integers are little-endian (the byte
// order of the hosts torch runs on; the client sends them raw), strings and
// byte vectors are a u64 length and the bytes. Set, append, multi_set and
// queue_push have no reply; the others reply as noted below.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun::rdzv::tcpstore {

// In the order of c10d::detail::QueryType (its value is the byte on the wire).
enum class QueryType : uint8_t {
  kValidate,    // u32 magic; no reply (a wrong magic closes the connection)
  kSet,         // key, value
  kCompareSet,  // key, expected, desired -> bytes (the value now, see KvStore)
  kGet,         // key -> bytes (empty when absent; clients wait first)
  kAdd,         // key, i64 delta -> i64 sum
  kCheck,       // u64 n, n keys -> u8 CheckResponse
  kWait,        // u64 n, n keys -> u8 kStopWaiting once all exist
  kGetNumKeys,  // -> i64
  kDeleteKey,   // key -> i64 (keys deleted: 0 or 1)
  kAppend,      // key, value
  kMultiGet,    // u64 n, n keys -> n bytes
  kMultiSet,    // u64 n, n (key, value)
  kCancelWait,  // -> u8 kWaitCanceled
  kPing,        // u32 nonce -> u32 nonce
  kQueuePush,   // key, value
  kQueuePop,    // key -> i64 length before, then bytes when it was > 0
  kQueueLen,    // key -> i64
  kListKeys,    // -> i64 n, n strings
  kBarrier,     // key, i64 world size -> u8 kStopWaiting once reached
};
inline constexpr uint8_t kNumQueryTypes = static_cast<uint8_t>(QueryType::kBarrier) + 1;
const char* ToString(QueryType type);

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;
enum class CheckResponse : uint8_t { kReady = 0, kNotReady = 1 };
enum class WaitResponse : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };

struct Query {
  QueryType type = QueryType::kValidate;
  // One for single-key queries; every key for check, wait, multi_get and
  // multi_set.
  std::vector<std::string> keys;
  // set, append, queue_push: one; compare_set: expected, desired; multi_set:
  // one per key.
  std::vector<std::string> values;
  // add: the delta; barrier: the world size; validate, ping: the u32.
  int64_t number = 0;
};

// The largest query to admit with these field limits: compare_set with its
// key and both values at their limits (a type byte, three lengths, the
// bytes), and a margin. A multi_set's or multi_get's entries share it.
inline constexpr size_t kQueryBytesMargin = 1 << 20;
constexpr size_t MaxQueryBytesFor(size_t max_key_bytes, size_t max_value_bytes) {
  return 1 + 3 * 8 + max_key_bytes + 2 * max_value_bytes + kQueryBytesMargin;
}

struct WireLimits {
  size_t max_key_bytes = 8192;
  size_t max_value_bytes = 64 << 20;
  size_t max_keys_per_query = 128 << 10;
  // A whole query, type byte and every length included (129 MiB + 8,217 B by
  // default): what one query can make a connection buffer.
  size_t max_query_bytes = MaxQueryBytesFor(8192, 64 << 20);
};

struct ParseResult {
  enum class Kind {
    kQuery,       // `query` holds one whole query of `consumed` bytes
    kIncomplete,  // more bytes are needed: at least `needed` in all
    kBad,         // not a query (unknown type, a field over its limit)
  };
  Kind kind = Kind::kIncomplete;
  Query query;
  size_t consumed = 0;
  size_t needed = 0;
  std::string error;  // kBad: why, one line
};

// Parses the query at the front of `data`. A kIncomplete result says how many
// bytes the parse needs before it can get further, so a caller that buffers a
// large value parses it once, not once per chunk. Each call starts from the
// query's first byte: a caller that reads a query of many fields in many
// chunks finds its end with a FrameScanner first.
ParseResult ParseQuery(std::string_view data, const WireLimits& limits);

struct ScanResult {
  enum class Kind {
    kFrame,       // the query is the first `frame_bytes` bytes, all there
    kIncomplete,  // more bytes are needed: at least `needed` in all
    kBad,         // not a query; `error` says why, as ParseQuery would
  };
  Kind kind = Kind::kIncomplete;
  size_t frame_bytes = 0;
  // kIncomplete: where the next length prefix ends or, once the last field's
  // length is known, the query's exact size.
  size_t needed = 0;
  std::string error;
};

// Finds where the query at the front of a stream ends by walking only its
// type byte, counts and length prefixes, and keeps its place between calls:
// fed a query as it arrives, a read at a time, it looks at each prefix once,
// so finding the end of a query of n fields costs O(n) in all, however many
// reads bring it. The caller then parses the frame once (ParseQuery), which
// agrees with the scan on where it ends and on what is bad.
//
// Not thread-safe; one per connection.
class FrameScanner {
 public:
  explicit FrameScanner(const WireLimits& limits) : limits_(limits) {}

  // REQUIRES: `data` starts at the query's first byte and holds at least the
  // bytes of the previous call since Reset() (they may have moved).
  ScanResult Scan(std::string_view data);
  // For the query after the one just found.
  void Reset();
  // Fields looked at since construction (the type byte counts as one): the
  // work done, for tests.
  uint64_t steps() const { return steps_; }

 private:
  enum class Field : uint8_t { kU32, kI64, kCount, kKey, kValue };
  enum class Phase : uint8_t { kType, kHead, kItems, kDone };
  void SetLayout(QueryType type);
  ScanResult Bad(std::string error) const;
  void Advance();  // past the field just scanned

  WireLimits limits_;
  Phase phase_ = Phase::kType;
  QueryType type_ = QueryType::kValidate;
  const Field* head_ = nullptr;  // the fields before the repeated items
  size_t head_size_ = 0;
  const Field* item_ = nullptr;  // the fields of one repeated item
  size_t item_size_ = 0;
  size_t field_ = 0;         // index into head_ or item_
  uint64_t items_left_ = 0;  // kItems: items not yet scanned, this one included
  size_t pos_ = 0;           // where the next field starts
  uint64_t steps_ = 0;
};

// Reply encoders, appending to `out`.
void AppendU8(std::string* out, uint8_t value);
void AppendU32(std::string* out, uint32_t value);
void AppendI64(std::string* out, int64_t value);
void AppendBytes(std::string* out, std::string_view bytes);  // u64 length + bytes

// Query encoders (what a stock client sends), for tests and tools.
std::string EncodeQuery(const Query& query);
// A query of `type` with the given fields, for EncodeQuery.
Query MakeQuery(QueryType type, std::vector<std::string> keys = {},
                std::vector<std::string> values = {}, int64_t number = 0);

}  // namespace meshrun::rdzv::tcpstore
