#include "rendezvous/relay/relay_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/request_validation.h"

namespace meshrun::rdzv {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreRequestBatch;
using meshrun::v1::StoreResponse;

namespace {

void AppendField(std::string* out, const std::string& field) {
  absl::StrAppend(out, field.size(), ":", field);
}

StoreResponse Refusal(uint64_t id, meshrun::v1::StoreCode code, std::string error) {
  StoreResponse reply;
  reply.set_id(id);
  reply.set_code(code);
  reply.set_error(std::move(error));
  return reply;
}

const char* OpName(const StoreRequest& request) {
  switch (request.op_case()) {
    case StoreRequest::kAdd:
      return "add";
    case StoreRequest::kCompareSet:
      return "compare_set";
    case StoreRequest::kAppend:
      return "append";
    case StoreRequest::kQueuePush:
      return "queue_push";
    case StoreRequest::kQueuePop:
      return "queue_pop";
    case StoreRequest::kBarrier:
      return "barrier";
    default:
      return "request";
  }
}

}  // namespace

RelayCore::RelayCore(RelayLimits limits, uint64_t identity)
    : limits_(limits), identity_(identity) {}

std::string RelayCore::JoinKey(const StoreRequest& request) {
  std::string key;
  switch (request.op_case()) {
    case StoreRequest::kWait:
      key = "w";
      for (const std::string& k : request.wait().keys()) AppendField(&key, k);
      break;
    case StoreRequest::kGet:
      key = request.get().if_present() ? "g" : "G";
      AppendField(&key, request.get().key());
      break;
    case StoreRequest::kMultiGet:
      key = request.multi_get().if_present() ? "m" : "M";
      for (const std::string& k : request.multi_get().keys()) AppendField(&key, k);
      break;
    case StoreRequest::kCheck:
      key = "c";
      for (const std::string& k : request.check().keys()) AppendField(&key, k);
      break;
    case StoreRequest::kAdd:
      key = "a";
      AppendField(&key, request.add().key());
      break;
    default:
      return key;
  }
  // Callers join only callers of the same namespace and timeout.
  absl::StrAppend(&key, "|", request.timeout_ms(), "|");
  AppendField(&key, request.ns());
  return key;
}

bool RelayCore::IsRead(const StoreRequest& request) {
  switch (request.op_case()) {
    case StoreRequest::kGet:
    case StoreRequest::kMultiGet:
    case StoreRequest::kWait:
    case StoreRequest::kCheck:
    case StoreRequest::kNumKeys:
    case StoreRequest::kListKeys:
    case StoreRequest::kQueueLen:
      return true;
    default:
      return false;
  }
}

bool RelayCore::NeedsDedupId(const StoreRequest& request) {
  // add(key, 0) is a read: repeating it is harmless already.
  return TakesDedupId(request) &&
         !(request.op_case() == StoreRequest::kAdd && request.add().delta() == 0);
}

bool RelayCore::SafeToRepeat(const StoreRequest& request) {
  // The daemon answers a repeated dedup id without applying it again.
  if (!request.dedup_id().empty()) return true;
  // A repeated set, multi_set or delete leaves what the first left, unless
  // another client wrote the same key in between: c10d's users write a
  // key once (addresses, flags), or rewrite it with the same value.
  switch (request.op_case()) {
    case StoreRequest::kSet:
    case StoreRequest::kMultiSet:
    case StoreRequest::kDelete:
      return true;
    case StoreRequest::kAdd:
      // add(key, 0) is a read (torch's store barrier counts arrivals so).
      return request.add().delta() == 0;
    default:
      return IsRead(request);
  }
}

std::optional<StoreResponse> RelayCore::Submit(StoreReplySink* session,
                                               StoreRequest request) {
  ++stats_.requests;
  const size_t bytes = request.ByteSizeLong();
  if (bytes > limits_.max_request_bytes) {
    ++stats_.refused;
    return Refusal(
        request.id(), meshrun::v1::STORE_INVALID_ARGUMENT,
        absl::StrCat("a request of ", bytes, " bytes is over the relay's bound (",
                     limits_.max_request_bytes, ")"));
  }
  size_t& pending = pending_[session];
  if (pending >= limits_.max_pending_per_session) {
    ++stats_.refused;
    return Refusal(request.id(), meshrun::v1::STORE_RESOURCE_EXHAUSTED,
                   absl::StrCat("more than ", limits_.max_pending_per_session,
                                " requests of one client pending"));
  }
  Joiner joiner{session, request.id(), 0};
  std::string key = JoinKey(request);
  if (!key.empty() && pending == 0) {
    auto found = joinable_.find(key);
    if (found != joinable_.end()) {
      Op& op = ops_.at(found->second);
      bool joins = true;
      if (request.op_case() == StoreRequest::kAdd) {
        int64_t sum = 0;
        joins = !__builtin_add_overflow(op.request.add().delta(), request.add().delta(),
                                        &sum);
        if (joins) {
          op.request.mutable_add()->set_delta(sum);
          joiner.add_through = sum;
        }
      }
      if (joins) {
        op.joiners.push_back(joiner);
        ++pending;
        ops_of_[session].insert(found->second);
        ++stats_.joined;
        return std::nullopt;
      }
    }
  }
  if (!unsent_.empty() && unsent_bytes_ + bytes > limits_.max_unsent_bytes) {
    ++stats_.refused;
    return Refusal(request.id(), meshrun::v1::STORE_RESOURCE_EXHAUSTED,
                   absl::StrCat("the relay holds ", unsent_bytes_,
                                " bytes of requests the daemon has not taken yet"));
  }
  const uint64_t id = next_id_++;
  request.set_id(id);
  if (request.op_case() == StoreRequest::kAdd) joiner.add_through = request.add().delta();
  Op& op = ops_[id];
  op.request = std::move(request);
  op.joiners.push_back(joiner);
  op.bytes = bytes;
  if (!key.empty()) {
    joinable_[key] = id;
    op.join_key = std::move(key);
  }
  unsent_.insert(id);
  unsent_bytes_ += bytes;
  ++pending;
  ops_of_[session].insert(id);
  return std::nullopt;
}

bool RelayCore::TakeBatch(StoreRequestBatch* batch) {
  if (!writing_.empty() || unsent_.empty()) return false;
  size_t bytes = 0;
  while (!unsent_.empty() &&
         static_cast<size_t>(batch->requests_size()) < limits_.max_requests_per_batch) {
    const uint64_t id = *unsent_.begin();
    Op& op = ops_.at(id);
    if (batch->requests_size() > 0 && bytes + op.bytes > limits_.max_batch_bytes) break;
    // In order: a session's later requests wait behind this one.
    const bool dedup = !op.request.dedup_id().empty() || NeedsDedupId(op.request);
    if (dedup && dedup_in_flight_ >= limits_.max_dedup_in_flight) break;
    // Set once, when the request is final (no add joins it once taken), and
    // kept for its repeats.
    if (op.request.dedup_id().empty() && NeedsDedupId(op.request)) {
      std::string dedup_id(16, '\0');
      for (int i = 0; i < 8; ++i) {
        dedup_id[i] = static_cast<char>((identity_ >> (8 * i)) & 0xFF);
        dedup_id[8 + i] = static_cast<char>((id >> (8 * i)) & 0xFF);
      }
      op.request.set_dedup_id(std::move(dedup_id));
    }
    if (auto waiting = forget_.find(op.request.ns()); waiting != forget_.end()) {
      std::vector<std::string>& ids = waiting->second;
      while (!ids.empty() && static_cast<size_t>(op.request.forget_dedup_ids_size()) <
                                 limits_.max_forget_per_request) {
        op.request.add_forget_dedup_ids(std::move(ids.back()));
        ids.pop_back();
      }
      if (ids.empty()) forget_.erase(waiting);
    }
    CountInFlight(op, true);
    *batch->add_requests() = op.request;
    bytes += op.bytes;
    unsent_bytes_ -= op.bytes;
    unsent_.erase(unsent_.begin());
    op.state = Op::State::kWriting;
    writing_.push_back(id);
    // Only waits are joined once sent (see the header).
    if (!op.join_key.empty() && op.request.op_case() != StoreRequest::kWait) {
      auto found = joinable_.find(op.join_key);
      if (found != joinable_.end() && found->second == id) joinable_.erase(found);
      op.join_key.clear();
    }
  }
  // Nothing when the first waits for the dedup window.
  if (batch->requests_size() == 0) return false;
  ++stats_.batches;
  return true;
}

void RelayCore::WriteDone(bool written) {
  for (uint64_t id : writing_) {
    auto it = ops_.find(id);
    if (it == ops_.end()) continue;  // answered before the write completed
    Op& op = it->second;
    if (written) {
      op.state = Op::State::kSent;
      ++stats_.sent;
    } else {
      op.state = Op::State::kUnsent;
      CountInFlight(op, false);
      unsent_.insert(id);
      unsent_bytes_ += op.bytes;
    }
  }
  writing_.clear();
}

void RelayCore::OnReply(const StoreResponse& reply, std::vector<RelayDelivery>* out) {
  auto it = ops_.find(reply.id());
  if (it == ops_.end()) return;  // nobody waits for it any more
  Op& op = it->second;
  // The daemon keeps its answer until told: on the next request there.
  if (!op.request.dedup_id().empty())
    forget_[op.request.ns()].push_back(op.request.dedup_id());
  const bool add =
      op.request.op_case() == StoreRequest::kAdd && reply.code() == meshrun::v1::STORE_OK;
  const int64_t total = add ? op.request.add().delta() : 0;
  for (const Joiner& joiner : op.joiners) {
    StoreResponse answer = reply;
    answer.set_id(joiner.id);
    if (add) answer.set_number(reply.number() - total + joiner.add_through);
    out->push_back({joiner.session, std::move(answer)});
    auto pending = pending_.find(joiner.session);
    if (pending != pending_.end() && --pending->second == 0) pending_.erase(pending);
    auto of = ops_of_.find(joiner.session);
    if (of != ops_of_.end()) {
      of->second.erase(reply.id());
      if (of->second.empty()) ops_of_.erase(of);
    }
  }
  Forget(reply.id(), /*answered=*/true);
}

void RelayCore::OnStreamLost(std::vector<RelayDelivery>* out) {
  std::vector<uint64_t> orphans;
  std::vector<uint64_t> unknown;  // may or may not have been applied
  for (auto& [id, op] : ops_) {
    if (op.state != Op::State::kSent) continue;
    if (op.joiners.empty() && IsRead(op.request)) {
      orphans.push_back(id);
    } else if (SafeToRepeat(op.request)) {
      op.state = Op::State::kUnsent;
      CountInFlight(op, false);
      unsent_.insert(id);
      unsent_bytes_ += op.bytes;
      ++stats_.repeated;
    } else {
      unknown.push_back(id);
    }
  }
  for (uint64_t id : orphans) Forget(id, /*answered=*/false);
  for (uint64_t id : unknown) {
    Op& op = ops_.at(id);
    // Never applied twice: it has no dedup id (SafeToRepeat), and what it
    // named to forget is named again, as the daemon may not have seen it.
    for (std::string& forget : *op.request.mutable_forget_dedup_ids())
      forget_[op.request.ns()].push_back(std::move(forget));
    op.request.clear_forget_dedup_ids();
    stats_.failed_in_flight += op.joiners.size();
    StoreResponse reply;
    reply.set_id(id);
    reply.set_code(meshrun::v1::STORE_UNAVAILABLE);
    reply.set_error(absl::StrCat("the connection to the daemon broke while this ",
                                 OpName(op.request),
                                 " was in flight; it may or may not have been applied"));
    OnReply(reply, out);
  }
}

void RelayCore::RemoveJoiners(StoreReplySink* session, bool waits_only) {
  auto of = ops_of_.find(session);
  if (of == ops_of_.end()) return;
  std::vector<uint64_t> forget;
  for (auto id_it = of->second.begin(); id_it != of->second.end();) {
    const uint64_t id = *id_it;
    Op& op = ops_.at(id);
    const auto op_case = op.request.op_case();
    if (waits_only && op_case != StoreRequest::kWait &&
        op_case != StoreRequest::kBarrier) {
      ++id_it;
      continue;
    }
    size_t removed = 0;
    for (auto j = op.joiners.begin(); j != op.joiners.end();) {
      if (j->session == session) {
        j = op.joiners.erase(j);
        ++removed;
      } else {
        ++j;
      }
    }
    auto pending = pending_.find(session);
    if (pending != pending_.end()) {
      pending->second -= std::min(pending->second, removed);
      if (pending->second == 0) pending_.erase(pending);
    }
    if (op.joiners.empty() && op.state == Op::State::kUnsent && IsRead(op.request)) {
      forget.push_back(id);
    }
    id_it = of->second.erase(id_it);
  }
  if (of->second.empty()) ops_of_.erase(of);
  for (uint64_t id : forget) Forget(id, /*answered=*/false);
}

void RelayCore::CancelWaits(StoreReplySink* session) { RemoveJoiners(session, true); }

void RelayCore::EndSession(StoreReplySink* session) {
  RemoveJoiners(session, false);
  pending_.erase(session);
  ops_of_.erase(session);
}

size_t RelayCore::to_forget() const {
  size_t n = 0;
  for (const auto& [ns, ids] : forget_) n += ids.size();
  return n;
}

void RelayCore::CountInFlight(const Op& op, bool out) {
  if (op.request.dedup_id().empty() && !NeedsDedupId(op.request)) return;
  if (out) {
    ++dedup_in_flight_;
  } else {
    --dedup_in_flight_;
  }
}

void RelayCore::Forget(uint64_t upstream_id, bool answered) {
  auto it = ops_.find(upstream_id);
  if (it == ops_.end()) return;
  Op& op = it->second;
  if (op.state != Op::State::kUnsent) CountInFlight(op, false);
  if (!answered) {
    for (std::string& forget : *op.request.mutable_forget_dedup_ids())
      forget_[op.request.ns()].push_back(std::move(forget));
  }
  if (!op.join_key.empty()) {
    auto found = joinable_.find(op.join_key);
    if (found != joinable_.end() && found->second == upstream_id) joinable_.erase(found);
  }
  if (unsent_.erase(upstream_id) > 0) unsent_bytes_ -= op.bytes;
  ops_.erase(it);
}

}  // namespace meshrun::rdzv
