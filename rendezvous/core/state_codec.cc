#include "rendezvous/core/state_codec.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace meshrun::rdzv::codec {
namespace {

std::array<uint32_t, 256> MakeCrcTable() {
  // CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib computes it.
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr size_t kFrameHeader = 8;
// A frame longer than this is garbage, not a record (values are at most
// 64 MiB by default; runs of 100,000 nodes stay well under).
constexpr uint32_t kMaxRecordBytes = 1u << 30;

uint32_t LoadU32(std::string_view in) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

std::string StoreRecord(RecordType type, std::string_view ns, std::string_view key,
                        const std::string_view* value) {
  ByteWriter w;
  w.U8(static_cast<uint8_t>(type));
  w.Str(ns);
  w.Str(key);
  if (value) w.Str(*value);
  return w.Take();
}

}  // namespace

uint32_t Crc32(std::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) c = table[(c ^ static_cast<uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void ByteWriter::U32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void ByteWriter::U64(uint64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void ByteWriter::Str(std::string_view s) {
  U64(s.size());
  out_.append(s.data(), s.size());
}

bool ByteReader::Need(size_t n) {
  if (!ok_ || in_.size() < n) {
    ok_ = false;
    return false;
  }
  return true;
}

uint8_t ByteReader::U8() {
  if (!Need(1)) return 0;
  uint8_t v = static_cast<uint8_t>(in_[0]);
  in_.remove_prefix(1);
  return v;
}

uint32_t ByteReader::U32() {
  if (!Need(4)) return 0;
  uint32_t v = LoadU32(in_);
  in_.remove_prefix(4);
  return v;
}

uint64_t ByteReader::U64() {
  if (!Need(8)) return 0;
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in_[i]);
  in_.remove_prefix(8);
  return v;
}

std::string ByteReader::Str() {
  const uint64_t n = U64();
  if (!Need(n)) return {};
  std::string s(in_.substr(0, n));
  in_.remove_prefix(n);
  return s;
}

void AppendFrame(std::string* out, std::string_view payload) {
  ByteWriter header;
  header.U32(static_cast<uint32_t>(payload.size()));
  header.U32(Crc32(payload));
  out->append(header.Take());
  out->append(payload.data(), payload.size());
}

absl::StatusOr<FrameScan> ScanFrames(std::string_view data) {
  FrameScan scan;
  size_t at = 0;
  while (at < data.size()) {
    const std::string_view rest = data.substr(at);
    if (rest.size() < kFrameHeader) {
      scan.torn_tail = true;
      break;
    }
    const uint32_t length = LoadU32(rest);
    const uint32_t crc = LoadU32(rest.substr(4));
    if (length > kMaxRecordBytes || rest.size() - kFrameHeader < length) {
      // Runs past the end: the write was cut short. (A garbage length in the
      // middle of the file lands here too, and is caught by what follows
      // being unreadable only if we looked; a crash is by far likelier.)
      scan.torn_tail = true;
      break;
    }
    const std::string_view payload = rest.substr(kFrameHeader, length);
    if (Crc32(payload) != crc) {
      if (kFrameHeader + length == rest.size()) {
        scan.torn_tail = true;
        break;
      }
      return absl::DataLossError(
          absl::StrCat("record at byte ", at, " fails its checksum and is followed by ",
                       rest.size() - kFrameHeader - length, " more bytes"));
    }
    scan.records.push_back(payload);
    at += kFrameHeader + length;
    scan.valid_bytes = at;
  }
  return scan;
}

std::string SetRecord(std::string_view ns, std::string_view key, std::string_view value) {
  return StoreRecord(RecordType::kSet, ns, key, &value);
}

std::string AppendRecord(std::string_view ns, std::string_view key,
                         std::string_view value) {
  return StoreRecord(RecordType::kAppend, ns, key, &value);
}

std::string DeleteRecord(std::string_view ns, std::string_view key) {
  return StoreRecord(RecordType::kDelete, ns, key, nullptr);
}

std::string QueuePushRecord(std::string_view ns, std::string_view key,
                            std::string_view value) {
  return StoreRecord(RecordType::kQueuePush, ns, key, &value);
}

std::string QueuePopRecord(std::string_view ns, std::string_view key) {
  return StoreRecord(RecordType::kQueuePop, ns, key, nullptr);
}

std::string RememberedRecord(std::string_view ns, std::string_view id,
                             const StoredAnswer& answer,
                             const std::vector<std::string>& effects) {
  ByteWriter w;
  w.U8(static_cast<uint8_t>(RecordType::kRemembered));
  w.Str(ns);
  w.Str(id);
  w.U32(static_cast<uint32_t>(answer.code));
  w.Str(answer.error);
  w.I64(answer.number);
  w.U8(answer.flag ? 1 : 0);
  w.U64(answer.values.size());
  for (const std::string& value : answer.values) w.Str(value);
  w.U64(effects.size());
  for (const std::string& effect : effects) w.Str(effect);
  return w.Take();
}

std::string DropNamespaceRecord(std::string_view ns) {
  ByteWriter w;
  w.U8(static_cast<uint8_t>(RecordType::kDropNamespace));
  w.Str(ns);
  return w.Take();
}

std::string RunRecord(const RendezvousState& state, const std::string& run_id,
                      RdzvTime now) {
  ByteWriter w;
  std::optional<std::string> run = state.EncodeRun(run_id, now);
  w.U8(static_cast<uint8_t>(run ? RecordType::kRun : RecordType::kRunGone));
  w.Str(run_id);
  if (run) w.Str(*run);
  return w.Take();
}

absl::Status ApplyRecord(std::string_view payload, KvStore* store,
                         RendezvousState* rendezvous, RdzvTime now) {
  ByteReader r(payload);
  const auto type = static_cast<RecordType>(r.U8());
  switch (type) {
    case RecordType::kSet:
    case RecordType::kAppend:
    case RecordType::kQueuePush: {
      std::string ns = r.Str();
      std::string key = r.Str();
      std::string value = r.Str();
      if (!r.ok() || !r.done()) break;
      if (type == RecordType::kSet) {
        store->RestoreSet(ns, key, std::move(value));
      } else if (type == RecordType::kAppend) {
        store->RestoreAppend(ns, key, value);
      } else {
        store->RestoreQueuePush(ns, key, std::move(value));
      }
      return absl::OkStatus();
    }
    case RecordType::kQueuePop: {
      std::string ns = r.Str();
      std::string key = r.Str();
      if (!r.ok() || !r.done()) break;
      store->RestoreQueuePop(ns, key);
      return absl::OkStatus();
    }
    case RecordType::kDelete: {
      std::string ns = r.Str();
      std::string key = r.Str();
      if (!r.ok() || !r.done()) break;
      store->Delete(ns, key);
      return absl::OkStatus();
    }
    case RecordType::kDropNamespace: {
      std::string ns = r.Str();
      if (!r.ok() || !r.done()) break;
      std::vector<Wakeup> none;  // nothing waits during a restore
      store->DropNamespace(ns, &none);
      return absl::OkStatus();
    }
    case RecordType::kRemembered: {
      std::string ns = r.Str();
      std::string id = r.Str();
      StoredAnswer answer;
      answer.code = static_cast<int32_t>(r.U32());
      answer.error = r.Str();
      answer.number = r.I64();
      answer.flag = r.U8() != 0;
      // Each string costs at least its 8-byte length, so a damaged count
      // fails the read instead of reserving without bound.
      for (uint64_t n = r.U64(); r.ok() && n > 0; --n) answer.values.push_back(r.Str());
      std::vector<std::string> effects;
      for (uint64_t n = r.U64(); r.ok() && n > 0; --n) effects.push_back(r.Str());
      if (!r.ok() || !r.done()) break;
      for (const std::string& effect : effects) {
        const auto effect_type =
            effect.empty() ? RecordType{0} : static_cast<RecordType>(effect[0]);
        if (effect_type != RecordType::kSet && effect_type != RecordType::kAppend &&
            effect_type != RecordType::kDelete && effect_type != RecordType::kQueuePush &&
            effect_type != RecordType::kQueuePop) {
          return absl::DataLossError(absl::StrCat(
              "a remembered answer's effect is of type ", static_cast<int>(effect_type)));
        }
      }
      for (const std::string& effect : effects) {
        if (absl::Status s = ApplyRecord(effect, store, rendezvous, now); !s.ok())
          return s;
      }
      store->Remember(ns, id, std::move(answer));
      return absl::OkStatus();
    }
    case RecordType::kForgotten: {
      std::string ns = r.Str();
      std::vector<std::string> ids;
      // Each id costs at least its 8-byte length (see kRemembered).
      for (uint64_t n = r.U64(); r.ok() && n > 0; --n) ids.push_back(r.Str());
      if (!r.ok() || !r.done()) break;
      for (const std::string& id : ids) store->Forget(ns, id);
      return absl::OkStatus();
    }
    case RecordType::kRun: {
      std::string run_id = r.Str();
      std::string state = r.Str();
      if (!r.ok() || !r.done()) break;
      return rendezvous->RestoreRun(state, now);
    }
    case RecordType::kRunGone: {
      std::string run_id = r.Str();
      if (!r.ok() || !r.done()) break;
      rendezvous->RemoveRun(run_id);
      return absl::OkStatus();
    }
    default:
      return absl::DataLossError(
          absl::StrCat("unknown record type ", static_cast<int>(type)));
  }
  return absl::DataLossError(
      absl::StrCat("malformed record of type ", static_cast<int>(type)));
}

std::string EncodeSnapshot(const KvStore& store, const RendezvousState& rendezvous,
                           uint64_t next_generation, RdzvTime now) {
  std::string out(kSnapshotMagic);
  uint64_t count = 0;
  {
    ByteWriter header;
    header.U8(static_cast<uint8_t>(RecordType::kSnapshotHeader));
    header.U64(next_generation);
    AppendFrame(&out, header.Take());
  }
  store.ForEachEntry(
      [&](const std::string& ns, const std::string& key, const std::string& value) {
        AppendFrame(&out, SetRecord(ns, key, value));
        ++count;
      });
  store.ForEachQueueItem(
      [&](const std::string& ns, const std::string& key, const std::string& value) {
        AppendFrame(&out, QueuePushRecord(ns, key, value));
        ++count;
      });
  store.ForEachRemembered(
      [&](const std::string& ns, const std::string& id, const StoredAnswer& answer) {
        AppendFrame(&out, RememberedRecord(ns, id, answer, {}));
        ++count;
      });
  for (const std::string& run_id : rendezvous.RunIds()) {
    AppendFrame(&out, RunRecord(rendezvous, run_id, now));
    ++count;
  }
  ByteWriter trailer;
  trailer.U8(static_cast<uint8_t>(RecordType::kSnapshotTrailer));
  trailer.U64(count);
  AppendFrame(&out, trailer.Take());
  return out;
}

absl::StatusOr<uint64_t> DecodeSnapshot(std::string_view data, KvStore* store,
                                        RendezvousState* rendezvous, RdzvTime now) {
  if (data.substr(0, kSnapshotMagic.size()) != kSnapshotMagic) {
    return absl::DataLossError("not a meshrun state snapshot (bad magic)");
  }
  auto scan = ScanFrames(data.substr(kSnapshotMagic.size()));
  if (!scan.ok()) return scan.status();
  // A snapshot is written whole and renamed into place, so unlike the log a
  // short one is damage, not a crash mid-write.
  if (scan->torn_tail) {
    return absl::DataLossError(
        absl::StrCat("snapshot is cut short or damaged after byte ",
                     kSnapshotMagic.size() + scan->valid_bytes));
  }
  const auto& records = scan->records;
  if (records.size() < 2) return absl::DataLossError("snapshot has no header or trailer");
  ByteReader header(records.front());
  const uint8_t header_type = header.U8();
  const uint64_t generation = header.U64();
  if (header_type != static_cast<uint8_t>(RecordType::kSnapshotHeader) || !header.ok() ||
      !header.done()) {
    return absl::DataLossError("snapshot header is damaged");
  }
  ByteReader trailer(records.back());
  const uint8_t trailer_type = trailer.U8();
  const uint64_t count = trailer.U64();
  if (trailer_type != static_cast<uint8_t>(RecordType::kSnapshotTrailer) ||
      !trailer.ok() || !trailer.done()) {
    return absl::DataLossError("snapshot trailer is missing or damaged");
  }
  if (count != records.size() - 2) {
    return absl::DataLossError(absl::StrCat("snapshot trailer counts ", count,
                                            " records, the file holds ",
                                            records.size() - 2));
  }
  for (size_t i = 1; i + 1 < records.size(); ++i) {
    if (absl::Status s = ApplyRecord(records[i], store, rendezvous, now); !s.ok()) {
      return absl::DataLossError(absl::StrCat("snapshot record ", i, ": ", s.message()));
    }
  }
  return generation;
}

}  // namespace meshrun::rdzv::codec
