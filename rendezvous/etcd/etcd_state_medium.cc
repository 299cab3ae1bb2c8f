#include "rendezvous/etcd/etcd_state_medium.h"

#include <spdlog/spdlog.h>

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace meshrun::rdzv {

namespace {

constexpr int kRangePage = 64;  // keys a read asks for at once (up to 64 MiB)

std::string Hex(uint64_t n) { return absl::StrFormat("%016x", n); }

}  // namespace

EtcdStateMedium::EtcdStateMedium(EtcdLeadership* leadership)
    : leadership_(leadership), prefix_(leadership->prefix()) {}

std::string EtcdStateMedium::name() const {
  return absl::StrCat("etcd prefix ", prefix_, " at ",
                      leadership_->etcd().current_endpoint());
}

std::string EtcdStateMedium::LogKey(uint64_t gen, uint64_t seq) const {
  return absl::StrCat(prefix_, "log/", Hex(gen), "/", Hex(seq));
}

std::string EtcdStateMedium::SnapKey(uint64_t gen, uint64_t chunk) const {
  return absl::StrCat(prefix_, "snap/", Hex(gen), "/", Hex(chunk));
}

absl::StatusOr<std::vector<std::string>> EtcdStateMedium::ReadRange(
    const std::string& from, const std::string& to) {
  std::vector<std::string> values;
  std::string next = from;
  while (true) {
    etcdserverpb::RangeRequest request;
    request.set_key(next);
    request.set_range_end(to);
    request.set_limit(kRangePage);
    auto reply = leadership_->etcd().Range(request);
    if (!reply.ok()) return reply.status();
    for (const etcdserverpb::KeyValue& kv : reply->kvs()) values.push_back(kv.value());
    if (!reply->more() || reply->kvs_size() == 0) return values;
    next = reply->kvs(reply->kvs_size() - 1).key() + std::string(1, '\0');
  }
}

absl::StatusOr<std::optional<std::string>> EtcdStateMedium::ReadSnapshot() {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix_ + "snapshot");
  auto reply = leadership_->etcd().Range(request);
  if (!reply.ok()) return reply.status();
  if (reply->kvs_size() == 0) return std::nullopt;
  uint64_t gen = 0;
  uint64_t chunks = 0;
  const std::string pointer = reply->kvs(0).value();
  std::vector<std::string> fields = absl::StrSplit(pointer, ' ');
  if (fields.size() != 2 ||
      !absl::SimpleAtoi(absl::StripPrefix(fields[0], "gen="), &gen) ||
      !absl::SimpleAtoi(absl::StripPrefix(fields[1], "chunks="), &chunks)) {
    return absl::DataLossError(absl::StrCat(
        prefix_, "snapshot is '", pointer.substr(0, 64), "', not gen=<n> chunks=<n>"));
  }
  auto values = ReadRange(SnapKey(gen, 0), SnapKey(gen + 1, 0));
  if (!values.ok()) return values.status();
  if (values->size() < chunks) {
    return absl::DataLossError(absl::StrCat("snapshot ", gen, " has ", values->size(),
                                            " of its ", chunks, " chunks"));
  }
  std::string bytes;
  for (uint64_t i = 0; i < chunks; ++i) bytes += (*values)[i];
  return std::optional<std::string>(std::move(bytes));
}

absl::StatusOr<std::string> EtcdStateMedium::ReadLog(uint64_t gen) {
  auto values = ReadRange(LogKey(gen, 0), LogKey(gen + 1, 0));
  if (!values.ok()) return values.status();
  std::string frames;
  for (const std::string& value : *values) frames += value;
  return frames;
}

absl::Status EtcdStateMedium::FencedWrite(etcdserverpb::TxnRequest txn) {
  auto delay = std::chrono::milliseconds(50);
  bool logged = false;
  while (true) {
    *txn.mutable_compare(0) = leadership_->Fence();
    auto reply = leadership_->etcd().Txn(txn);
    absl::Status status = reply.status();
    if (reply.ok() && reply->succeeded()) {
      if (stalled_.exchange(false)) spdlog::info("etcd takes writes again");
      return absl::OkStatus();
    }
    if (reply.ok()) status = leadership_->Reconfirm();  // the fence failed
    if (status.ok()) continue;  // still leading, under a new fence
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kDeadlineExceeded)
      return status;
    // etcd unreachable: nothing is acknowledged until this lands.
    stalled_ = true;
    if (!logged) {
      spdlog::warn("etcd unreachable ({}); holding the state's writes until it is back",
                   std::string(status.message()));
      logged = true;
    }
    if (abandoned_)
      return absl::UnavailableError("gave up waiting for etcd: " +
                                    std::string(status.message()));
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(1000));
  }
}

absl::Status EtcdStateMedium::Append(std::string_view frames) {
  while (!frames.empty()) {
    const size_t n = std::min(frames.size(), kMaxValueBytes);
    etcdserverpb::TxnRequest txn;
    txn.add_compare();  // the fence, set by FencedWrite
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(LogKey(gen_, next_seq_));
    put->set_value(std::string(frames.substr(0, n)));
    if (absl::Status s = FencedWrite(std::move(txn)); !s.ok()) return s;
    ++next_seq_;
    frames.remove_prefix(n);
  }
  return absl::OkStatus();
}

absl::Status EtcdStateMedium::InstallSnapshot(const std::string& snapshot, uint64_t gen) {
  // The chunks first, beside the current snapshot, which stays the state
  // until the last transaction names this one.
  uint64_t chunks = 0;
  for (size_t at = 0; at < snapshot.size() || chunks == 0; at += kMaxValueBytes) {
    etcdserverpb::TxnRequest txn;
    txn.add_compare();
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(SnapKey(gen, chunks));
    put->set_value(snapshot.substr(at, kMaxValueBytes));
    if (absl::Status s = FencedWrite(std::move(txn)); !s.ok()) return s;
    ++chunks;
  }
  etcdserverpb::TxnRequest txn;
  txn.add_compare();
  auto* pointer = txn.add_success()->mutable_request_put();
  pointer->set_key(prefix_ + "snapshot");
  pointer->set_value(absl::StrCat("gen=", gen, " chunks=", chunks));
  // Older generations, and any log of this one (a leader that died between
  // writing this generation's chunks and naming them wrote none, but be sure).
  auto* old_snaps = txn.add_success()->mutable_request_delete_range();
  old_snaps->set_key(prefix_ + "snap/");
  old_snaps->set_range_end(SnapKey(gen, 0));
  auto* old_logs = txn.add_success()->mutable_request_delete_range();
  old_logs->set_key(prefix_ + "log/");
  old_logs->set_range_end(LogKey(gen + 1, 0));
  if (absl::Status s = FencedWrite(std::move(txn)); !s.ok()) return s;
  gen_ = gen;
  next_seq_ = 0;
  return absl::OkStatus();
}

}  // namespace meshrun::rdzv
