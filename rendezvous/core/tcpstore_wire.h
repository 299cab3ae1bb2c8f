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

struct WireLimits {
  size_t max_key_bytes = 8192;
  size_t max_value_bytes = 64 << 20;
  size_t max_keys_per_query = 128 << 10;
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
// large value parses it once, not once per chunk.
ParseResult ParseQuery(std::string_view data, const WireLimits& limits);

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
