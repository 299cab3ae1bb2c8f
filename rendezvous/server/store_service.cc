#include "rendezvous/server/store_service.h"

#include <algorithm>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/request_validation.h"
#include "rendezvous/core/state_codec.h"

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

size_t BytesOf(const std::vector<StoreResponse>& replies) {
  size_t bytes = 0;
  for (const StoreResponse& reply : replies) bytes += reply.ByteSizeLong();
  return bytes;
}

}  // namespace

// One client stream of either protocol: In/Out are StoreRequest/StoreResponse
// (Session) or StoreRequestBatch/StoreResponseBatch (BatchSession). Replies
// are queued and written one message at a time (gRPC allows a single
// outstanding write per stream); in batch mode everything queued while a
// write is in flight is packed into the next message. gRPC calls
// (StartWrite, StartRead, Finish) are made outside mu_, since a reaction may
// run inline.
//
// Flow control: while the queued replies exceed the session's bounds (count,
// bytes, or the service's total), the session neither reads nor executes
// the rest of the current batch; OnWriteDone resumes it once the client has
// read enough. Replies of waits parked earlier still queue meanwhile.
template <typename In, typename Out>
class StoreService::SessionReactor final : public StoreService::ReplySink,
                                           public grpc::ServerBidiReactor<In, Out> {
  static constexpr bool kBatched = std::is_same_v<Out, meshrun::v1::StoreResponseBatch>;

 public:
  explicit SessionReactor(StoreService* service) : service_(service) {
    this->StartRead(&request_);
  }

  void Send(StoreResponse reply) override {
    Out* to_write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || write_failed_) return;
      QueueLocked(std::move(reply));
      to_write = StartWritingLocked();
    }
    if (to_write) this->StartWrite(to_write);
  }

  void SendAll(std::vector<StoreResponse>* replies) override {
    if (replies->empty()) return;
    Out* to_write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || write_failed_) return;
      for (auto& reply : *replies) QueueLocked(std::move(reply));
      to_write = StartWritingLocked();
    }
    if (to_write) this->StartWrite(to_write);
  }

  void Hold(const std::vector<StoreResponse>& replies) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++holds_;
    queued_ += replies.size();
    AddBytesLocked(BytesOf(replies));
  }

  void SendHeld(std::vector<StoreResponse>* replies) override {
    Out* to_write = nullptr;
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --holds_;
      queued_ -= replies->size();
      SubtractBytesLocked(BytesOf(*replies));
      if (!finished_ && !write_failed_) {
        for (auto& reply : *replies) QueueLocked(std::move(reply));
        to_write = StartWritingLocked();
      }
      finish = ShouldFinishLocked();
    }
    if (to_write) this->StartWrite(to_write);
    if (finish) this->Finish(finish_status_);
  }

  bool DeferIfOverBounds() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || write_failed_ || !OverBoundsLocked()) return false;
    has_deferred_ = true;
    return true;
  }

  void MarkDeferred() override {
    std::lock_guard<std::mutex> lock(mu_);
    has_deferred_ = true;
  }

  size_t RoomBytes() override {
    std::lock_guard<std::mutex> lock(mu_);
    return service_->ReplyRoom(queued_bytes_,
                               service_->options_.max_queued_reply_bytes_per_session);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Half-close or cancellation: nothing more will arrive, and nothing
      // parked for this stream may be delivered any more.
      ReadingDone(grpc::Status::OK);
      return;
    }
    if constexpr (kBatched) {
      const size_t n = static_cast<size_t>(request_.requests_size());
      if (n > service_->options_.max_requests_per_batch) {
        ReadingDone(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            "store batch of " + std::to_string(n) + " requests exceeds the limit of " +
                std::to_string(service_->options_.max_requests_per_batch)));
        return;
      }
      next_request_ = 0;
    } else {
      service_->Handle(this, request_);
    }
    ExecuteThenRead();
  }

  void OnWriteDone(bool ok) override {
    Out* next = nullptr;
    bool resume = false;
    bool redeliver = false;
    bool stop_reading = false;
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_ -= Count(out_.front());
      SubtractBytesLocked(out_bytes_.front());
      out_.pop_front();
      out_bytes_.pop_front();
      writing_ = false;
      if (!ok) {
        // The client is gone. An outstanding read fails and ends the session;
        // a paused one never will, so end it here.
        for (const Out& out : out_) queued_ -= Count(out);
        for (size_t bytes : out_bytes_) SubtractBytesLocked(bytes);
        out_.clear();
        out_bytes_.clear();
        write_failed_ = true;
        stop_reading = read_paused_;
        read_paused_ = false;
      } else {
        next = StartWritingLocked();
        if (!OverBoundsLocked()) {
          redeliver = has_deferred_;
          has_deferred_ = false;
          resume = read_paused_;
          read_paused_ = false;
        }
      }
      finish = ShouldFinishLocked();
    }
    if (stop_reading) return ReadingDone(grpc::Status::OK);
    if (next) this->StartWrite(next);
    // Woken waits first: they were asked for before what is still unread.
    if (redeliver) service_->RedeliverDeferred(this);
    if (resume) ExecuteThenRead();
    if (finish) this->Finish(finish_status_);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      SubtractBytesLocked(queued_bytes_);
    }
    delete this;
  }

 private:
  static size_t Count(const Out& out) {
    if constexpr (kBatched) {
      return static_cast<size_t>(out.responses_size());
    } else {
      return 1;
    }
  }

  // Executes what is left of the current batch, as far as the queue's
  // bounds allow, then reads the next message; or, once over the bounds,
  // pauses until OnWriteDone makes room. REQUIRES: read_paused_ clear, no
  // read outstanding, mu_ not held. (The bounds are checked and the pause
  // set under mu_, so a write completing meanwhile cannot be missed.)
  void ExecuteThenRead() {
    while (true) {
      bool more = false;
      if constexpr (kBatched) {
        const size_t n = static_cast<size_t>(request_.requests_size());
        if (next_request_ < n) {
          next_request_ = service_->HandleBatch(this, request_.requests(), next_request_,
                                                RoomBytes());
        }
        more = next_request_ < n;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (OverBoundsLocked()) {
          read_paused_ = true;
          return;
        }
      }
      if (!more) break;
    }
    this->StartRead(&request_);
  }

  // REQUIRES: mu_ held.
  bool OverBoundsLocked() const {
    const StoreServiceOptions& options = service_->options_;
    if (queued_ >= options.max_queued_replies_per_session) return true;
    return service_->OverReplyBounds(queued_bytes_,
                                     options.max_queued_reply_bytes_per_session);
  }

  // REQUIRES: mu_ held.
  void AddBytesLocked(size_t bytes) {
    queued_bytes_ += bytes;
    service_->queued_reply_bytes_.fetch_add(bytes);
  }
  void SubtractBytesLocked(size_t bytes) {
    queued_bytes_ -= bytes;
    service_->queued_reply_bytes_.fetch_sub(bytes);
  }

  // REQUIRES: mu_ held.
  void QueueLocked(StoreResponse reply) {
    ++queued_;
    const size_t bytes = reply.ByteSizeLong();
    AddBytesLocked(bytes);
    if constexpr (kBatched) {
      // The front message is on the wire while writing_; later ones fill up.
      const bool can_pack =
          out_.size() > (writing_ ? 1u : 0u) &&
          out_bytes_.back() + bytes <= service_->options_.max_reply_batch_bytes;
      if (!can_pack) {
        out_.emplace_back();
        out_bytes_.push_back(0);
      }
      out_bytes_.back() += bytes;
      *out_.back().add_responses() = std::move(reply);
    } else {
      out_.push_back(std::move(reply));
      out_bytes_.push_back(bytes);
    }
  }

  // REQUIRES: mu_ held. The message to start writing, if none is in flight.
  Out* StartWritingLocked() {
    if (writing_ || out_.empty()) return nullptr;
    writing_ = true;
    // A deque's elements stay put across push_back.
    return &out_.front();
  }

  void ReadingDone(grpc::Status status) {
    service_->EndSession(this);
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_done_ = true;
      if (finish_status_.ok()) finish_status_ = std::move(status);
      finish = ShouldFinishLocked();
    }
    if (finish) this->Finish(finish_status_);
  }

  // REQUIRES: mu_ held. True exactly once: when the caller must Finish().
  bool ShouldFinishLocked() {
    if (finished_ || !reading_done_ || writing_ || holds_ > 0) return false;
    finished_ = true;
    return true;
  }

  StoreService* const service_;
  In request_;
  std::mutex mu_;
  size_t next_request_ = 0;       // batch mode: the next of request_ to execute
  std::deque<Out> out_;           // guarded by mu_; front is being written
  std::deque<size_t> out_bytes_;  // guarded by mu_; reply bytes of each of out_
  size_t queued_ = 0;             // guarded by mu_; replies in out_ or held
  size_t queued_bytes_ = 0;       // guarded by mu_; their bytes
  bool writing_ = false;          // guarded by mu_
  bool write_failed_ = false;     // guarded by mu_
  bool read_paused_ = false;      // guarded by mu_
  bool has_deferred_ = false;     // guarded by mu_; see DeferIfOverBounds
  bool reading_done_ = false;     // guarded by mu_
  bool finished_ = false;         // guarded by mu_
  int holds_ = 0;                 // guarded by mu_; replies waiting for the log
  grpc::Status finish_status_;    // guarded by mu_ until finished_
};

StoreService::StoreService(StoreServiceOptions options)
    : options_(std::move(options)), store_(options_.limits) {
  request_limits_.max_keys_per_request = options_.limits.max_keys_per_request;
  timer_ = std::make_unique<DeadlineTimer>([this](TimePoint now) { return Expire(now); });
}

StoreService::~StoreService() { timer_.reset(); }

grpc::ServerBidiReactor<StoreRequest, StoreResponse>* StoreService::Session(
    grpc::CallbackServerContext* /*context*/) {
  {
    auto lock = LockStore();
    ++sessions_open_;
  }
  return new SessionReactor<StoreRequest, StoreResponse>(this);
}

grpc::ServerBidiReactor<meshrun::v1::StoreRequestBatch, meshrun::v1::StoreResponseBatch>*
StoreService::BatchSession(grpc::CallbackServerContext* /*context*/) {
  {
    auto lock = LockStore();
    ++sessions_open_;
  }
  return new SessionReactor<meshrun::v1::StoreRequestBatch,
                            meshrun::v1::StoreResponseBatch>(this);
}

void StoreService::DropRunNamespaces(const std::vector<std::string>& run_ids) {
  auto lock = LockStore();
  std::vector<Wakeup> woken;
  for (const std::string& run_id : run_ids)
    for (const std::string& ns : store_.NamespacesOfRun(run_id)) {
      store_.DropNamespace(ns, &woken);
      if (log_) log_->Append(codec::DropNamespaceRecord(ns));
    }
  DeliverLocked(woken);
}

StoreServiceStats StoreService::Stats() {
  auto lock = LockStore();
  return {sessions_open_, ops_.load(std::memory_order_relaxed), store_.num_waiters(),
          queued_reply_bytes_.load()};
}

int StoreService::OpIndex(const StoreRequest& request) {
  const int op = static_cast<int>(request.op_case());
  if (op < kFirstOp || op - kFirstOp + 1 >= kNumOps) return 0;
  return op - kFirstOp + 1;
}

void StoreService::Observe(int op, TimePoint arrived, const StoreResponse& reply) {
  OpMetrics& metrics = op_metrics_[op];
  metrics.ops.Inc();
  if (reply.code() != meshrun::v1::STORE_OK) metrics.errors.Inc();
  metrics.latency.Observe(std::chrono::duration<double>(Clock::now() - arrived).count());
}

void StoreService::CollectMetrics(std::vector<MetricFamily>* out) {
  static const char* const kOpNames[kNumOps] = {
      "none",       "set",       "get",       "add",       "compare_set", "wait",
      "delete",     "num_keys",  "check",     "multi_get", "multi_set",   "append",
      "queue_push", "queue_pop", "queue_len", "list_keys", "barrier"};
  MetricFamily ops{"meshrun_store_ops_total", "Store operations answered, by type.",
                   "counter"};
  MetricFamily errors{"meshrun_store_op_errors_total",
                      "Store operations answered with an error (timeout, limit, bad "
                      "request), by type.",
                      "counter"};
  MetricFamily latency{"meshrun_store_op_duration_seconds",
                       "From a store request's arrival to its answer, by type; blocking "
                       "ops (get, wait, multi_get) include the wait.",
                       "histogram"};
  for (int i = 1; i < kNumOps; ++i) {
    const Labels labels{{"op", kOpNames[i]}};
    ops.Add(labels, static_cast<double>(op_metrics_[i].ops.value()));
    errors.Add(labels, static_cast<double>(op_metrics_[i].errors.value()));
    latency.AddHistogram(labels, op_metrics_[i].latency.Snapshot());
  }
  StoreServiceStats stats = Stats();
  MetricFamily sessions{"meshrun_store_sessions_open",
                        "Store client streams (sessions) open now.", "gauge"};
  sessions.Add({}, static_cast<double>(stats.sessions_open));
  MetricFamily waiters{"meshrun_store_waiters_parked",
                       "Blocking store calls (get, wait, multi_get) parked now.",
                       "gauge"};
  waiters.Add({}, static_cast<double>(stats.waiters));
  MetricFamily reply_bytes{"meshrun_store_reply_bytes_queued",
                           "Bytes of store replies queued for clients that have not "
                           "read them yet.",
                           "gauge"};
  reply_bytes.Add({}, static_cast<double>(stats.queued_reply_bytes));
  MetricFamily lock_taken{"meshrun_store_lock_acquisitions_total",
                          "Times the store's lock was taken (about one a store "
                          "operation), by whether another thread held it then.",
                          "counter"};
  {
    auto lock = LockStore();
    lock_taken.Add({{"waited", "false"}},
                   static_cast<double>(lock_acquisitions_ - lock_contended_));
    lock_taken.Add({{"waited", "true"}}, static_cast<double>(lock_contended_));
  }
  for (MetricFamily* family :
       {&ops, &errors, &latency, &sessions, &waiters, &reply_bytes, &lock_taken})
    out->push_back(std::move(*family));
}

std::unique_lock<std::mutex> StoreService::LockStore() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  const bool waited = !lock.owns_lock();
  if (waited) lock.lock();
  ++lock_acquisitions_;
  if (waited) ++lock_contended_;
  return lock;
}

void StoreService::Handle(ReplySink* session, const StoreRequest& request) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  const TimePoint arrived = Clock::now();
  std::vector<StoreResponse> replies(1);
  std::vector<Wakeup> woken;
  bool answered = true;
  StateLog::Mark mark;
  // Outside the lock: what needs no store (a bad request is answered here).
  if (absl::Status invalid = ValidateStoreRequest(request, request_limits_);
      !invalid.ok()) {
    replies[0].set_id(request.id());
    SetStatus(invalid, &replies[0]);
  } else {
    auto lock = LockStore();
    store_.set_woken_value_budget(options_.max_queued_reply_bytes_per_session);
    answered = ExecuteLocked(session, request, &replies[0], &woken, /*validated=*/true);
    if (log_) {
      mark = log_->Now();
    } else {
      DeliverLocked(woken);
    }
  }
  if (answered) Observe(OpIndex(request), arrived, replies[0]);
  if (!answered) replies.clear();
  if (log_) return AfterDurable(session, mark, std::move(replies), std::move(woken));
  if (answered) session->Send(std::move(replies[0]));
}

size_t StoreService::HandleBatch(ReplySink* session, const Requests& requests,
                                 size_t start, size_t budget) {
  const size_t n = static_cast<size_t>(requests.size());
  if (start >= n) return n;
  const TimePoint arrived = Clock::now();
  std::vector<StoreResponse> replies;
  std::vector<Wakeup> woken;
  StateLog::Mark mark;
  size_t next = start;
  {
    auto lock = LockStore();
    store_.set_woken_value_budget(options_.max_queued_reply_bytes_per_session);
    // Each Get's reply is a copy of its value, so a batch of Gets of a large
    // value stops here and goes on once the client read the replies.
    size_t produced = 0;
    while (next < n && (next == start || produced < budget)) {
      const StoreRequest& request = requests[static_cast<int>(next++)];
      StoreResponse reply;
      if (ExecuteLocked(session, request, &reply, &woken)) {
        Observe(OpIndex(request), arrived, reply);
        produced += reply.ByteSizeLong();
        replies.push_back(std::move(reply));
      }
    }
    if (log_) {
      mark = log_->Now();
    } else {
      DeliverLocked(woken);
    }
  }
  ops_.fetch_add(static_cast<uint64_t>(next - start), std::memory_order_relaxed);
  if (log_) {
    AfterDurable(session, mark, std::move(replies), std::move(woken));
  } else {
    session->SendAll(&replies);
  }
  return next;
}

// Once the log holds everything this call did or read (a read may have seen
// another session's change that is not yet on disk), the flusher sends the
// replies and delivers the wakeups. Nothing blocks meanwhile: the stream
// goes on reading, and the calls of every session share one fsync.
void StoreService::AfterDurable(ReplySink* session, StateLog::Mark mark,
                                std::vector<StoreResponse> replies,
                                std::vector<Wakeup> woken) {
  session->Hold(replies);
  log_->WhenDurable(mark, [this, session, replies = std::move(replies),
                           woken = std::move(woken)]() mutable {
    if (!woken.empty()) {
      auto lock = LockStore();
      // A waiter whose session ended meanwhile is no longer pending: skipped.
      DeliverLocked(woken);
    }
    session->SendHeld(&replies);
  });
}

void StoreService::WithStore(const std::function<void(KvStore&)>& fn) {
  auto lock = LockStore();
  fn(store_);
}

bool StoreService::ExecuteLocked(ReplySink* session, const StoreRequest& request,
                                 StoreResponse* reply, std::vector<Wakeup>* woken,
                                 bool validated) {
  reply->set_id(request.id());
  if (absl::Status invalid =
          validated ? absl::OkStatus() : ValidateStoreRequest(request, request_limits_);
      !invalid.ok()) {
    SetStatus(invalid, reply);
    return true;
  }
  const std::string& ns = request.ns();
  // Answers the sender has and will not ask for again: first, so that the
  // room they held counts for this request.
  if (request.forget_dedup_ids_size() > 0) {
    for (const std::string& id : request.forget_dedup_ids()) store_.Forget(ns, id);
    if (log_) log_->Append(codec::ForgottenRecord(ns, request.forget_dedup_ids()));
  }
  // A request with a dedup id is answered once: a repeat gets that answer.
  const bool dedup = !request.dedup_id().empty() && TakesDedupId(request);
  if (dedup) {
    if (std::optional<StoredAnswer> answer = store_.Recall(ns, request.dedup_id())) {
      reply->set_code(static_cast<meshrun::v1::StoreCode>(answer->code));
      reply->set_error(std::move(answer->error));
      reply->set_number(answer->number);
      reply->set_flag(answer->flag);
      for (std::string& value : answer->values) reply->add_values(std::move(value));
      return true;
    }
    // Its answer must be kept until its sender forgets it: a request whose
    // answer could not be is not applied at all, since forgetting another
    // answer instead would let that one's repeat be applied twice.
    if (!store_.CanRemember(ns)) {
      SetStatus(absl::ResourceExhaustedError(absl::StrCat(
                    "namespace ", ns, " holds ", store_.num_remembered(ns), " answers (",
                    store_.remembered_bytes(ns),
                    " bytes) that their senders have not yet confirmed; this request "
                    "was not applied")),
                reply);
      return true;
    }
  }
  // Its effects are logged in one record with its answer (below), so that a
  // restart never keeps one without the other.
  std::vector<std::string> effects;
  auto record_effect = [&](std::string record) {
    if (dedup) {
      effects.push_back(std::move(record));
    } else {
      log_->Append(record);
    }
  };
  // Only blocking ops read the clock.
  auto deadline = [&] {
    const auto timeout = request.timeout_ms() > 0
                             ? std::chrono::milliseconds(request.timeout_ms())
                             : options_.default_timeout;
    return Clock::now() + timeout;
  };
  // Blocking ops return a BlockingResult; parked ones reply later.
  // `keys`: of a get or multi_get, to read again if its reply is deferred.
  auto block = [&](BlockingResult result, WaiterId waiter, TimePoint when,
                   std::vector<std::string> keys) {
    if (!result.ready) {
      pending_[waiter] = {session,
                          request.id(),
                          OpIndex(request),
                          Clock::now(),
                          keys.empty() ? std::string() : ns,
                          std::move(keys),
                          when};
      parked_[session].insert(waiter);
      timer_->Poke(when);
      return false;
    }
    SetStatus(result.status, reply);
    for (auto& v : result.values) reply->add_values(std::move(v));
    return true;
  };

  switch (request.op_case()) {
    case StoreRequest::kSet: {
      absl::Status status =
          store_.Set(ns, request.set().key(), request.set().value(), woken);
      if (log_ && status.ok())
        record_effect(codec::SetRecord(ns, request.set().key(), request.set().value()));
      SetStatus(status, reply);
      break;
    }
    case StoreRequest::kGet: {
      if (request.get().if_present()) {
        reply->add_values(store_.Peek(ns, request.get().key()).value_or(""));
        break;
      }
      if (!RoomToPark(session, reply)) break;
      WaiterId id = next_waiter_++;
      TimePoint when = deadline();
      return block(store_.Get(ns, request.get().key(), id, when), id, when,
                   {request.get().key()});
    }
    case StoreRequest::kAdd: {
      auto sum = store_.Add(ns, request.add().key(), request.add().delta(), woken);
      SetStatus(sum.status(), reply);
      if (sum.ok()) reply->set_number(*sum);
      if (log_ && sum.ok())
        record_effect(codec::SetRecord(ns, request.add().key(), std::to_string(*sum)));
      break;
    }
    case StoreRequest::kCompareSet: {
      const auto& op = request.compare_set();
      auto value = store_.CompareSet(ns, op.key(), op.expected(), op.desired(), woken);
      // Logged only when it wrote: the key now holds `desired`.
      if (log_ && value.ok() && *value == op.desired()) {
        if (auto now_held = store_.Peek(ns, op.key());
            now_held && *now_held == op.desired())
          record_effect(codec::SetRecord(ns, op.key(), *now_held));
      }
      SetStatus(value.status(), reply);
      if (value.ok()) reply->add_values(std::move(*value));
      break;
    }
    case StoreRequest::kWait: {
      if (!RoomToPark(session, reply)) break;
      WaiterId id = next_waiter_++;
      TimePoint when = deadline();
      return block(store_.Wait(ns, Keys(request.wait().keys()), id, when), id, when, {});
    }
    case StoreRequest::kDelete: {
      const bool existed = store_.Delete(ns, request.delete_().key());
      if (log_ && existed)
        record_effect(codec::DeleteRecord(ns, request.delete_().key()));
      reply->set_flag(existed);
      break;
    }
    case StoreRequest::kNumKeys:
      reply->set_number(store_.NumKeys(ns));
      break;
    case StoreRequest::kCheck: {
      auto all = store_.Check(ns, Keys(request.check().keys()));
      SetStatus(all.status(), reply);
      if (all.ok()) reply->set_flag(*all);
      break;
    }
    case StoreRequest::kMultiGet: {
      if (request.multi_get().if_present()) {
        auto values = store_.PeekMany(ns, Keys(request.multi_get().keys()));
        SetStatus(values.status(), reply);
        if (values.ok())
          for (std::string& value : *values) reply->add_values(std::move(value));
        break;
      }
      if (!RoomToPark(session, reply)) break;
      WaiterId id = next_waiter_++;
      TimePoint when = deadline();
      return block(store_.MultiGet(ns, Keys(request.multi_get().keys()), id, when), id,
                   when, Keys(request.multi_get().keys()));
    }
    case StoreRequest::kMultiSet: {
      std::vector<std::pair<std::string, std::string>> entries;
      entries.reserve(request.multi_set().entries_size());
      for (const auto& kv : request.multi_set().entries())
        entries.emplace_back(kv.key(), kv.value());
      absl::Status status = store_.MultiSet(ns, entries, woken);
      if (log_ && status.ok()) {
        for (const auto& [key, value] : entries)
          record_effect(codec::SetRecord(ns, key, value));
      }
      SetStatus(status, reply);
      break;
    }
    case StoreRequest::kAppend: {
      absl::Status status =
          store_.Append(ns, request.append().key(), request.append().value(), woken);
      if (log_ && status.ok())
        record_effect(
            codec::AppendRecord(ns, request.append().key(), request.append().value()));
      SetStatus(status, reply);
      break;
    }
    case StoreRequest::kQueuePush: {
      const auto& op = request.queue_push();
      absl::Status status = store_.QueuePush(ns, op.key(), op.value(), woken);
      if (log_ && status.ok())
        record_effect(codec::QueuePushRecord(ns, op.key(), op.value()));
      SetStatus(status, reply);
      break;
    }
    case StoreRequest::kQueuePop: {
      auto popped = store_.QueuePop(ns, request.queue_pop().key());
      SetStatus(popped.status(), reply);
      if (!popped.ok()) break;
      reply->set_number(popped->length_before);
      if (popped->length_before > 0) {
        if (log_) record_effect(codec::QueuePopRecord(ns, request.queue_pop().key()));
        reply->add_values(std::move(popped->value));
      }
      break;
    }
    case StoreRequest::kQueueLen:
      reply->set_number(store_.QueueLength(ns, request.queue_len().key()));
      break;
    case StoreRequest::kListKeys: {
      auto keys = store_.ListKeys(ns);
      SetStatus(keys.status(), reply);
      if (keys.ok())
        for (std::string& key : *keys) reply->add_values(std::move(key));
      break;
    }
    case StoreRequest::kBarrier: {
      // Before arriving: a refused barrier is not counted.
      if (!RoomToPark(session, reply)) break;
      const auto& op = request.barrier();
      WaiterId id = next_waiter_++;
      TimePoint when = deadline();
      BlockingResult result =
          store_.Barrier(ns, op.key(), op.world_size(), id, when, woken);
      // The arrival is an Add: logged as the Set of its count.
      if (log_) {
        if (auto count = store_.Peek(ns, op.key()))
          record_effect(codec::SetRecord(ns, op.key(), *count));
      }
      return block(std::move(result), id, when, {});
    }
    case StoreRequest::OP_NOT_SET:
      SetStatus(absl::InvalidArgumentError("store request names no operation"), reply);
      break;
  }
  if (dedup) {
    StoredAnswer answer;
    answer.code = reply->code();
    answer.error = reply->error();
    answer.number = reply->number();
    answer.flag = reply->flag();
    answer.values.assign(reply->values().begin(), reply->values().end());
    if (log_)
      log_->Append(codec::RememberedRecord(ns, request.dedup_id(), answer, effects));
    store_.Remember(ns, request.dedup_id(), std::move(answer));
  }
  return true;
}

bool StoreService::OverReplyBounds(size_t own, size_t own_max) const {
  if (own >= own_max) return true;
  return own > 0 && queued_reply_bytes_.load() >= options_.max_queued_reply_bytes;
}

size_t StoreService::ReplyRoom(size_t own, size_t own_max) const {
  const size_t total = queued_reply_bytes_.load();
  const size_t total_max = options_.max_queued_reply_bytes;
  return std::min(own_max > own ? own_max - own : 0,
                  total_max > total ? total_max - total : 0);
}

bool StoreService::RoomToPark(ReplySink* session, StoreResponse* reply) {
  size_t cap = session->MaxParkedWaits();
  if (cap == 0) cap = options_.max_parked_waits_per_session;
  auto parked = parked_.find(session);
  if (parked == parked_.end() || parked->second.size() < cap) return true;
  SetStatus(
      absl::ResourceExhaustedError(absl::StrCat("this session already has the limit of ",
                                                cap, " blocking requests parked")),
      reply);
  return false;
}

void StoreService::DeliverLocked(std::vector<Wakeup>& woken) {
  for (Wakeup& wake : woken) {
    auto it = pending_.find(wake.waiter);
    if (it == pending_.end()) continue;
    // Each woken get's reply is a copy of its values: for a session whose
    // client is not reading, it is made once the client has room (from the
    // values then current) rather than queued now; so is one the store did
    // not copy (past this call's budget), by the timer thread (Expire).
    ReplySink* session = it->second.session;
    if (wake.reread || (!wake.values.empty() && session->DeferIfOverBounds())) {
      deferred_[session].push_back(wake.waiter);
      if (wake.reread && kicked_.insert(session).second) timer_->Poke(Clock::now());
      continue;
    }
    StoreResponse reply;
    reply.set_id(it->second.request_id);
    SetStatus(wake.status, &reply);
    for (auto& v : wake.values) reply.add_values(std::move(v));
    Observe(it->second.op, it->second.arrived, reply);
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

void StoreService::RedeliverDeferred(ReplySink* session) {
  auto lock = LockStore();
  RedeliverLocked(session);
}

void StoreService::RedeliverLocked(ReplySink* session) {
  auto deferred = deferred_.find(session);
  if (deferred == deferred_.end()) return;
  std::deque<WaiterId>& waiters = deferred->second;
  std::vector<StoreResponse> replies;
  const size_t budget = session->RoomBytes();
  size_t produced = 0;
  while (!waiters.empty() && (replies.empty() || produced < budget)) {
    const WaiterId id = waiters.front();
    waiters.pop_front();
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    PendingWait& wait = it->second;
    // Read again: the reply is not out yet, so the values now are as good an
    // answer; a key deleted meanwhile parks the wait again.
    BlockingResult result = store_.MultiGet(wait.ns, wait.keys, id, wait.deadline);
    if (!result.ready) {
      timer_->Poke(wait.deadline);
      continue;
    }
    StoreResponse& reply = replies.emplace_back();
    reply.set_id(wait.request_id);
    SetStatus(result.status, &reply);
    for (auto& v : result.values) reply.add_values(std::move(v));
    Observe(wait.op, wait.arrived, reply);
    produced += reply.ByteSizeLong();
    auto parked = parked_.find(session);
    if (parked != parked_.end()) {
      parked->second.erase(id);
      if (parked->second.empty()) parked_.erase(parked);
    }
    pending_.erase(it);
  }
  // What is left goes out once the replies above are written (the loop only
  // stops early after making some).
  if (waiters.empty()) {
    deferred_.erase(deferred);
  } else {
    session->MarkDeferred();
  }
  // Under mu_, since the timer thread has no other hold on the session; the
  // lock order (mu_, then the session's, then the log's) allows it.
  if (log_) return AfterDurable(session, log_->Now(), std::move(replies), {});
  session->SendAll(&replies);
}

void StoreService::OpenSession() {
  auto lock = LockStore();
  ++sessions_open_;
}

void StoreService::CancelWaits(ReplySink* session) {
  auto lock = LockStore();
  CancelWaitsLocked(session);
}

void StoreService::EndSession(ReplySink* session) {
  auto lock = LockStore();
  --sessions_open_;
  CancelWaitsLocked(session);
}

void StoreService::CancelWaitsLocked(ReplySink* session) {
  deferred_.erase(session);
  kicked_.erase(session);
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
  auto lock = LockStore();
  store_.ExpireWaiters(now, &woken);
  DeliverLocked(woken);
  std::unordered_set<ReplySink*> kicked;
  kicked.swap(kicked_);
  for (ReplySink* session : kicked) RedeliverLocked(session);
  return store_.NextDeadline();
}

}  // namespace meshrun::rdzv
