#include "rendezvous/core/tcpstore_wire.h"

#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace meshrun::rdzv::tcpstore {

namespace {

std::string FieldOverLimit(const char* what, uint64_t size, size_t max_bytes) {
  return absl::StrCat(what, " of ", size, " bytes is over the limit of ", max_bytes);
}
std::string CountOverLimit(uint64_t n, size_t max_keys) {
  return absl::StrCat(n, " keys in one query is over the limit of ", max_keys);
}
std::string QueryOverLimit(uint64_t at_least, size_t max_bytes) {
  return absl::StrCat("a query of at least ", at_least, " bytes is over the limit of ",
                      max_bytes);
}

// Reads fields off the front of the data; the first field that is not all
// there stops it and records how many bytes it needed.
class Reader {
 public:
  Reader(std::string_view data, const WireLimits& limits)
      : data_(data), limits_(limits) {}

  bool ok() const { return !incomplete_ && error_.empty(); }
  bool incomplete() const { return incomplete_; }
  size_t pos() const { return pos_; }
  size_t needed() const { return needed_; }
  const std::string& error() const { return error_; }

  template <typename T>
  T Raw() {
    T value{};
    if (!Need(sizeof(T))) return value;
    std::memcpy(&value, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string Str(const char* what, size_t max_bytes) {
    const uint64_t size = Raw<uint64_t>();
    if (!ok()) return {};
    if (size > max_bytes) {
      Fail(FieldOverLimit(what, size, max_bytes));
      return {};
    }
    if (!Need(size)) return {};
    std::string out(data_.substr(pos_, size));
    pos_ += size;
    return out;
  }
  std::string Key() { return Str("key", limits_.max_key_bytes); }
  std::string Value() { return Str("value", limits_.max_value_bytes); }

  uint64_t Count() {
    const uint64_t n = Raw<uint64_t>();
    if (ok() && n > limits_.max_keys_per_query)
      Fail(CountOverLimit(n, limits_.max_keys_per_query));
    return n;
  }

 private:
  bool Need(uint64_t bytes) {
    if (!ok()) return false;
    // The type byte, what was read, and this field (FrameScanner checks the
    // same sum at the same fields).
    if (1 + pos_ + bytes > limits_.max_query_bytes) {
      Fail(QueryOverLimit(1 + pos_ + bytes, limits_.max_query_bytes));
      return false;
    }
    if (data_.size() - pos_ >= bytes) return true;
    incomplete_ = true;
    needed_ = pos_ + bytes;
    return false;
  }
  void Fail(std::string error) { error_ = std::move(error); }

  std::string_view data_;
  const WireLimits& limits_;
  size_t pos_ = 0;
  size_t needed_ = 0;
  bool incomplete_ = false;
  std::string error_;
};

}  // namespace

const char* ToString(QueryType type) {
  static const char* const kNames[kNumQueryTypes] = {
      "validate",  "set",       "compare_set", "get",        "add",
      "check",     "wait",      "num_keys",    "delete_key", "append",
      "multi_get", "multi_set", "cancel_wait", "ping",       "queue_push",
      "queue_pop", "queue_len", "list_keys",   "barrier"};
  const auto i = static_cast<uint8_t>(type);
  return i < kNumQueryTypes ? kNames[i] : "unknown";
}

ParseResult ParseQuery(std::string_view data, const WireLimits& limits) {
  ParseResult result;
  if (data.empty()) {
    result.needed = 1;
    return result;
  }
  const uint8_t type_byte = static_cast<uint8_t>(data[0]);
  if (type_byte >= kNumQueryTypes) {
    result.kind = ParseResult::Kind::kBad;
    result.error = absl::StrCat("unknown query type ", type_byte);
    return result;
  }
  Reader r(data.substr(1), limits);
  Query& q = result.query;
  q.type = static_cast<QueryType>(type_byte);
  switch (q.type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      q.number = r.Raw<uint32_t>();
      break;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
      q.keys.push_back(r.Key());
      q.values.push_back(r.Value());
      break;
    case QueryType::kCompareSet:
      q.keys.push_back(r.Key());
      q.values.push_back(r.Value());
      q.values.push_back(r.Value());
      break;
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      q.keys.push_back(r.Key());
      break;
    case QueryType::kAdd:
    case QueryType::kBarrier:
      q.keys.push_back(r.Key());
      q.number = r.Raw<int64_t>();
      break;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet: {
      const uint64_t n = r.Count();
      for (uint64_t i = 0; i < n && r.ok(); ++i) q.keys.push_back(r.Key());
      break;
    }
    case QueryType::kMultiSet: {
      const uint64_t n = r.Count();
      for (uint64_t i = 0; i < n && r.ok(); ++i) {
        q.keys.push_back(r.Key());
        q.values.push_back(r.Value());
      }
      break;
    }
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      break;
  }
  if (!r.error().empty()) {
    result.kind = ParseResult::Kind::kBad;
    result.error = absl::StrCat(ToString(q.type), ": ", r.error());
    result.query = Query{};
    return result;
  }
  if (r.incomplete()) {
    result.needed = 1 + r.needed();
    result.query = Query{};
    return result;
  }
  result.kind = ParseResult::Kind::kQuery;
  result.consumed = 1 + r.pos();
  return result;
}

void FrameScanner::SetLayout(QueryType type) {
  static constexpr Field kNumber32[] = {Field::kU32};
  static constexpr Field kKeyValue[] = {Field::kKey, Field::kValue};
  static constexpr Field kKeyTwoValues[] = {Field::kKey, Field::kValue, Field::kValue};
  static constexpr Field kKey[] = {Field::kKey};
  static constexpr Field kKeyNumber[] = {Field::kKey, Field::kI64};
  static constexpr Field kCount[] = {Field::kCount};
  head_ = nullptr;
  head_size_ = 0;
  item_ = nullptr;
  item_size_ = 0;
  auto head = [this](const auto& fields) {
    head_ = fields;
    head_size_ = std::size(fields);
  };
  switch (type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      head(kNumber32);
      break;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
      head(kKeyValue);
      break;
    case QueryType::kCompareSet:
      head(kKeyTwoValues);
      break;
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      head(kKey);
      break;
    case QueryType::kAdd:
    case QueryType::kBarrier:
      head(kKeyNumber);
      break;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
      head(kCount);
      item_ = kKey;
      item_size_ = std::size(kKey);
      break;
    case QueryType::kMultiSet:
      head(kCount);
      item_ = kKeyValue;
      item_size_ = std::size(kKeyValue);
      break;
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      break;
  }
}

ScanResult FrameScanner::Bad(std::string error) const {
  ScanResult result;
  result.kind = ScanResult::Kind::kBad;
  result.error = absl::StrCat(ToString(type_), ": ", error);
  return result;
}

void FrameScanner::Advance() {
  ++field_;
  if (phase_ == Phase::kHead && field_ == head_size_) {
    field_ = 0;
    phase_ = item_size_ > 0 && items_left_ > 0 ? Phase::kItems : Phase::kDone;
  } else if (phase_ == Phase::kItems && field_ == item_size_) {
    field_ = 0;
    if (--items_left_ == 0) phase_ = Phase::kDone;
  }
}

ScanResult FrameScanner::Scan(std::string_view data) {
  ScanResult result;
  if (phase_ == Phase::kType) {
    if (data.empty()) {
      result.needed = 1;
      return result;
    }
    ++steps_;
    const uint8_t type_byte = static_cast<uint8_t>(data[0]);
    if (type_byte >= kNumQueryTypes) {
      result.kind = ScanResult::Kind::kBad;
      result.error = absl::StrCat("unknown query type ", type_byte);
      return result;
    }
    type_ = static_cast<QueryType>(type_byte);
    SetLayout(type_);
    pos_ = 1;
    field_ = 0;
    phase_ = head_size_ > 0 ? Phase::kHead : Phase::kDone;
  }
  while (phase_ != Phase::kDone) {
    const Field field = phase_ == Phase::kHead ? head_[field_] : item_[field_];
    const size_t prefix = field == Field::kU32 ? 4 : 8;
    // As ParseQuery: the sum is checked before the field is read.
    if (pos_ + prefix > limits_.max_query_bytes)
      return Bad(QueryOverLimit(pos_ + prefix, limits_.max_query_bytes));
    if (data.size() < pos_ + prefix) {
      result.needed = pos_ + prefix;
      return result;
    }
    ++steps_;
    uint64_t n = 0;
    if (prefix == 8) std::memcpy(&n, data.data() + pos_, sizeof(n));
    pos_ += prefix;
    switch (field) {
      case Field::kU32:
      case Field::kI64:
        break;
      case Field::kCount:
        if (n > limits_.max_keys_per_query)
          return Bad(CountOverLimit(n, limits_.max_keys_per_query));
        items_left_ = n;
        break;
      case Field::kKey:
      case Field::kValue: {
        const bool key = field == Field::kKey;
        const size_t max_bytes = key ? limits_.max_key_bytes : limits_.max_value_bytes;
        if (n > max_bytes)
          return Bad(FieldOverLimit(key ? "key" : "value", n, max_bytes));
        if (pos_ + n > limits_.max_query_bytes)
          return Bad(QueryOverLimit(pos_ + n, limits_.max_query_bytes));
        pos_ += n;
        break;
      }
    }
    Advance();
  }
  if (data.size() < pos_) {
    result.needed = pos_;
    return result;
  }
  result.kind = ScanResult::Kind::kFrame;
  result.frame_bytes = pos_;
  return result;
}

void FrameScanner::Reset() {
  phase_ = Phase::kType;
  field_ = 0;
  items_left_ = 0;
  pos_ = 0;
}

void AppendU8(std::string* out, uint8_t value) {
  out->push_back(static_cast<char>(value));
}

void AppendU32(std::string* out, uint32_t value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void AppendI64(std::string* out, int64_t value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void AppendBytes(std::string* out, std::string_view bytes) {
  const uint64_t size = bytes.size();
  out->append(reinterpret_cast<const char*>(&size), sizeof(size));
  out->append(bytes);
}

std::string EncodeQuery(const Query& q) {
  std::string out;
  AppendU8(&out, static_cast<uint8_t>(q.type));
  auto count = [&](size_t n) {
    const uint64_t size = n;
    out.append(reinterpret_cast<const char*>(&size), sizeof(size));
  };
  switch (q.type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      AppendU32(&out, static_cast<uint32_t>(q.number));
      break;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
    case QueryType::kCompareSet:
      AppendBytes(&out, q.keys.at(0));
      for (const std::string& v : q.values) AppendBytes(&out, v);
      break;
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      AppendBytes(&out, q.keys.at(0));
      break;
    case QueryType::kAdd:
    case QueryType::kBarrier:
      AppendBytes(&out, q.keys.at(0));
      AppendI64(&out, q.number);
      break;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
      count(q.keys.size());
      for (const std::string& k : q.keys) AppendBytes(&out, k);
      break;
    case QueryType::kMultiSet:
      count(q.keys.size());
      for (size_t i = 0; i < q.keys.size(); ++i) {
        AppendBytes(&out, q.keys[i]);
        AppendBytes(&out, q.values.at(i));
      }
      break;
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      break;
  }
  return out;
}

Query MakeQuery(QueryType type, std::vector<std::string> keys,
                std::vector<std::string> values, int64_t number) {
  Query query;
  query.type = type;
  query.keys = std::move(keys);
  query.values = std::move(values);
  query.number = number;
  return query;
}

}  // namespace meshrun::rdzv::tcpstore
