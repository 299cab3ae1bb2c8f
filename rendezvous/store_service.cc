#include "rendezvous/store_service.h"

#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace meshrun::rdzv {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreResponse;

namespace {

meshrun::v1::StoreCode ToStoreCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return meshrun::v1::STORE_OK;
    case absl::StatusCode::kDeadlineExceeded:
      return meshrun::v1::STORE_DEADLINE_EXCEEDED;
    case absl::StatusCode::kResourceExhausted:
      return meshrun::v1::STORE_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kInvalidArgument:
      return meshrun::v1::STORE_INVALID_ARGUMENT;
    default:
      return meshrun::v1::STORE_UNAVAILABLE;
  }
}

void SetStatus(const absl::Status& status, StoreResponse* reply) {
  reply->set_code(ToStoreCode(status.code()));
  if (!status.ok()) reply->set_error(std::string(status.message()));
}

std::vector<std::string> Keys(
    const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return {keys.begin(), keys.end()};
}

}  // namespace

// One client stream. Replies are queued and written one at a time (gRPC
// allows a single outstanding write per stream). gRPC calls (StartWrite,
// StartRead, Finish) are made outside mu_, since a reaction may run inline.
class StoreService::StoreSession final
    : public grpc::ServerBidiReactor<StoreRequest, StoreResponse> {
 public:
  explicit StoreSession(StoreService* service) : service_(service) {
    StartRead(&request_);
  }

  // Queues a reply. May be called from any thread until EndSession() ran.
  void Send(StoreResponse reply) {
    StoreResponse* to_write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || write_failed_) return;
      replies_.push_back(std::move(reply));
      if (!writing_) {
        writing_ = true;
        to_write = &replies_.front();  // deque: stays valid across push_back
      }
    }
    if (to_write) StartWrite(to_write);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Half-close or cancellation: nothing more will arrive, and nothing
      // parked for this stream may be delivered any more.
      ReadingDone();
      return;
    }
    service_->Handle(this, request_);
    bool pause;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pause = replies_.size() >= service_->options_.max_queued_replies_per_session;
      read_paused_ = pause;  // resumed by OnWriteDone
    }
    if (!pause) StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    StoreResponse* next = nullptr;
    bool resume_read = false;
    bool stop_reading = false;
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.pop_front();
      if (!ok) {
        // The client is gone. An outstanding read fails and ends the session;
        // a paused one never will, so end it here.
        replies_.clear();
        write_failed_ = true;
        writing_ = false;
        stop_reading = read_paused_;
        read_paused_ = false;
      } else {
        if (!replies_.empty()) {
          next = &replies_.front();
        } else {
          writing_ = false;
        }
        if (read_paused_ &&
            replies_.size() < service_->options_.max_queued_replies_per_session) {
          read_paused_ = false;
          resume_read = true;
        }
      }
      finish = ShouldFinishLocked();
    }
    if (stop_reading) return ReadingDone();
    if (resume_read) StartRead(&request_);
    if (next) StartWrite(next);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  void ReadingDone() {
    service_->EndSession(this);
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_done_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) Finish(grpc::Status::OK);
  }

  // REQUIRES: mu_ held. True exactly once: when the caller must Finish().
  bool ShouldFinishLocked() {
    if (finished_ || !reading_done_ || writing_) return false;
    finished_ = true;
    return true;
  }

  StoreService* const service_;
  StoreRequest request_;
  std::mutex mu_;
  std::deque<StoreResponse> replies_;  // guarded by mu_; front is being written
  bool writing_ = false;               // guarded by mu_
  bool write_failed_ = false;          // guarded by mu_
  bool read_paused_ = false;           // guarded by mu_
  bool reading_done_ = false;          // guarded by mu_
  bool finished_ = false;              // guarded by mu_
};

StoreService::StoreService(StoreServiceOptions options)
    : options_(std::move(options)), store_(options_.limits) {
  timer_ = std::make_unique<DeadlineTimer>([this](TimePoint now) { return Expire(now); });
}

StoreService::~StoreService() { timer_.reset(); }

grpc::ServerBidiReactor<StoreRequest, StoreResponse>* StoreService::Session(
    grpc::CallbackServerContext* /*context*/) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++sessions_open_;
  }
  return new StoreSession(this);
}

StoreServiceStats StoreService::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return {sessions_open_, ops_.load(std::memory_order_relaxed), store_.num_waiters()};
}

void StoreService::Handle(StoreSession* session, const StoreRequest& request) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  StoreResponse reply;
  reply.set_id(request.id());
  const std::string& ns = request.ns();
  const auto timeout = request.timeout_ms() > 0
                           ? std::chrono::milliseconds(request.timeout_ms())
                           : options_.default_timeout;
  const TimePoint deadline = Clock::now() + timeout;

  std::vector<Wakeup> woken;
  std::unique_lock<std::mutex> lock(mu_);
  // Blocking ops return a BlockingResult; parked ones reply later.
  auto block = [&](BlockingResult result, WaiterId waiter) {
    if (!result.ready) {
      pending_[waiter] = {session, request.id()};
      parked_[session].insert(waiter);
      timer_->Poke(deadline);
      return false;
    }
    SetStatus(result.status, &reply);
    for (auto& v : result.values) reply.add_values(std::move(v));
    return true;
  };

  switch (request.op_case()) {
    case StoreRequest::kSet:
      SetStatus(store_.Set(ns, request.set().key(), request.set().value(), &woken),
                &reply);
      break;
    case StoreRequest::kGet: {
      WaiterId id = next_waiter_++;
      if (!block(store_.Get(ns, request.get().key(), id, deadline), id)) return;
      break;
    }
    case StoreRequest::kAdd: {
      auto sum = store_.Add(ns, request.add().key(), request.add().delta(), &woken);
      SetStatus(sum.status(), &reply);
      if (sum.ok()) reply.set_number(*sum);
      break;
    }
    case StoreRequest::kCompareSet: {
      const auto& op = request.compare_set();
      auto value = store_.CompareSet(ns, op.key(), op.expected(), op.desired(), &woken);
      SetStatus(value.status(), &reply);
      if (value.ok()) reply.add_values(std::move(*value));
      break;
    }
    case StoreRequest::kWait: {
      WaiterId id = next_waiter_++;
      if (!block(store_.Wait(ns, Keys(request.wait().keys()), id, deadline), id)) return;
      break;
    }
    case StoreRequest::kDelete:
      reply.set_flag(store_.Delete(ns, request.delete_().key()));
      break;
    case StoreRequest::kNumKeys:
      reply.set_number(store_.NumKeys(ns));
      break;
    case StoreRequest::kCheck: {
      auto all = store_.Check(ns, Keys(request.check().keys()));
      SetStatus(all.status(), &reply);
      if (all.ok()) reply.set_flag(*all);
      break;
    }
    case StoreRequest::kMultiGet: {
      WaiterId id = next_waiter_++;
      if (!block(store_.MultiGet(ns, Keys(request.multi_get().keys()), id, deadline), id))
        return;
      break;
    }
    case StoreRequest::kMultiSet: {
      std::vector<std::pair<std::string, std::string>> entries;
      entries.reserve(request.multi_set().entries_size());
      for (const auto& kv : request.multi_set().entries())
        entries.emplace_back(kv.key(), kv.value());
      SetStatus(store_.MultiSet(ns, entries, &woken), &reply);
      break;
    }
    case StoreRequest::kAppend:
      SetStatus(
          store_.Append(ns, request.append().key(), request.append().value(), &woken),
          &reply);
      break;
    case StoreRequest::OP_NOT_SET:
      SetStatus(absl::InvalidArgumentError("store request names no operation"), &reply);
      break;
  }
  DeliverLocked(woken);
  lock.unlock();
  session->Send(std::move(reply));
}

void StoreService::DeliverLocked(std::vector<Wakeup>& woken) {
  for (Wakeup& wake : woken) {
    auto it = pending_.find(wake.waiter);
    if (it == pending_.end()) continue;
    StoreResponse reply;
    reply.set_id(it->second.request_id);
    SetStatus(wake.status, &reply);
    for (auto& v : wake.values) reply.add_values(std::move(v));
    // Lock order: mu_ then the session's own mutex; sessions never take mu_
    // while holding theirs.
    it->second.session->Send(std::move(reply));
    auto parked = parked_.find(it->second.session);
    if (parked != parked_.end()) {
      parked->second.erase(wake.waiter);
      if (parked->second.empty()) parked_.erase(parked);
    }
    pending_.erase(it);
  }
}

void StoreService::EndSession(StoreSession* session) {
  std::lock_guard<std::mutex> lock(mu_);
  --sessions_open_;
  auto parked = parked_.find(session);
  if (parked == parked_.end()) return;
  for (WaiterId waiter : parked->second) {
    store_.CancelWaiter(waiter);
    pending_.erase(waiter);
  }
  parked_.erase(parked);
}

std::optional<TimePoint> StoreService::Expire(TimePoint now) {
  std::vector<Wakeup> woken;
  std::lock_guard<std::mutex> lock(mu_);
  store_.ExpireWaiters(now, &woken);
  DeliverLocked(woken);
  return store_.NextDeadline();
}

}  // namespace meshrun::rdzv
