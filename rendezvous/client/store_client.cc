#include "rendezvous/client/store_client.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/client/endpoint_list.h"

namespace meshrun::rdzv {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreRequestBatch;
using meshrun::v1::StoreResponse;
using meshrun::v1::StoreResponseBatch;

namespace {

absl::Status FromReply(const StoreResponse& reply) {
  switch (reply.code()) {
    case meshrun::v1::STORE_OK:
      return absl::OkStatus();
    case meshrun::v1::STORE_DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(reply.error());
    case meshrun::v1::STORE_RESOURCE_EXHAUSTED:
      return absl::ResourceExhaustedError(reply.error());
    case meshrun::v1::STORE_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(reply.error());
    default:
      return absl::UnavailableError(reply.error());
  }
}

uint32_t ToTimeoutMs(std::chrono::milliseconds timeout) {
  // 0 on the wire means "server default": ask for at least 1 ms.
  auto ms = std::max<int64_t>(1, timeout.count());
  return static_cast<uint32_t>(std::min<int64_t>(ms, UINT32_MAX));
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeStoreChannel(const std::string& target,
                                                bool own_connection,
                                                const ClientSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Separate channels to one target silently share a TCP connection unless
  // each has its own subchannel pool.
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // After the daemon restarts, callers wait for the channel to reconnect:
  // keep gRPC's backoff between attempts short (its default grows to 120 s).
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: that is each attempt's connect
  // timeout (20 s), and a short one never lets a connection through a
  // flooded listener (a 10,000-client barrier stalled at 1 connected).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  // (A worker's store_tool gave up at its 5 s connect timeout on gRPC's
  // default attempt, when the list's first host had gone silent.)
  if (IsEndpointList(target))
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReplicaConnectTimeoutMs);
  return MakeChannel(target, security, args);
}

namespace {
// Requests that are safe to send again when the stream broke after sending
// them: the reads. No write is: the daemon may have applied it before the
// stream broke, and by the time it is repeated another client may have
// written the key again or deleted it, so a repeated set or multi_set would
// overwrite the newer value or bring the key back (waking its waiters), and
// an add or append would count twice. Deduplicating repeats by request id
// would need the daemon to remember ids across its own restart (the common
// reason a stream breaks, and with --state-dir the write survives it), i.e.
// to log them; a caller told UNAVAILABLE ("may or may not have applied") can
// decide instead, as with c10d's TCPStore, which repeats nothing.
bool SafeToRepeat(const StoreRequest& request) {
  switch (request.op_case()) {
    case StoreRequest::kGet:
    case StoreRequest::kWait:
    case StoreRequest::kCheck:
    case StoreRequest::kMultiGet:
    case StoreRequest::kNumKeys:
      return true;
    default:  // set, multi_set, add, append, compare_set, delete
      return false;
  }
}
}  // namespace

// The client's end of one Store.BatchSession stream, shared by every
// StoreClient on the same channel (or target). There is no I/O thread: the
// stream's operations complete on a completion queue of its own, and the
// calling threads poll it themselves (leader/follower):
//  - While any call is pending exactly one caller polls. It dispatches each
//    reply to its caller, keeps a read outstanding, and writes what queued
//    up; when its own reply arrives it hands the polling role to another
//    pending caller and returns.
//  - Writing: one write in flight at a time; requests queued behind it go
//    out together as one StoreRequestBatch when it completes. A new request
//    is also held back while a reply to a quick (never parked) request is
//    due, for the poller to send with the next batch.
// A lone caller thus writes and reads itself with no thread hand-off, and
// many callers share each gRPC message (gRPC's cost is per message). Only one
// thread at a time waits on the queue, and since async operations never run
// user code inline, all stream state can live under one mutex.
class StoreClient::Stream {
 public:
  // Opens the stream. REQUIRES: the channel is connected (or connecting).
  explicit Stream(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(meshrun::v1::Store::NewStub(channel_)) {
    call_ = stub_->PrepareAsyncBatchSession(&context_, &cq_);
    call_->StartCall(Tag(kStarted));
  }

  // REQUIRES: no Call() in progress (every StoreClient using it is gone).
  ~Stream() {
    context_.TryCancel();
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (!finished_) PollOnce(lock);
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // `sent` tells, after a failure, whether the request may have reached the
  // daemon (it was written before the stream broke).
  absl::StatusOr<StoreResponse> Call(StoreRequest request, bool* sent) {
    auto slot = std::make_shared<Slot>();
    *sent = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (broken_) return absl::UnavailableError(broken_reason_);
      // A write is not repeated once sent, so first learn what the stream
      // already knows: after the daemon went away while the stream was idle
      // (nobody polling), the failed read is due but not yet seen, and the
      // write would be sent into a dead stream and then not repeated.
      if (!polling_ && pending_.empty() && !SafeToRepeat(request)) {
        polling_ = true;
        while (!broken_ && !PollOnce(lock, nullptr, std::chrono::milliseconds(1))) {
        }
        polling_ = false;
        if (broken_) return absl::UnavailableError(broken_reason_);
      }
      const uint64_t id = next_id_++;
      request.set_id(id);
      slot->quick = AnsweredAtOnce(request);
      pending_.emplace(id, slot);
      outbox_.push_back(std::move(request));
      if (!polling_ || quick_written_ == 0) MaybeWrite();
      if (!polling_) PollUntilDone(lock, slot.get());
    }
    while (true) {
      {
        std::unique_lock<std::mutex> lock(slot->mu);
        slot->cv.wait(lock, [&] { return slot->done || slot->promoted; });
        if (slot->done) {
          *sent = slot->sent;
          return std::move(slot->reply);
        }
        slot->promoted = false;
      }
      // Asked to take over polling; someone may have beaten us to it (that
      // poller promotes another caller when it is done).
      std::unique_lock<std::mutex> lock(mu_);
      if (!polling_) PollUntilDone(lock, slot.get());
    }
  }

 private:
  // One pending call. Completed (and promoted) under its own mutex, not
  // mu_, so a woken caller does not queue up on the stream's lock; the
  // poller holds a reference, so signalling after the caller left is safe.
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;                    // guarded by mu
    bool promoted = false;                // guarded by mu; asked to become the poller
    bool quick = false;                   // never parked by the server; set before queued
    bool sent = false;                    // written to the stream; set before done
    absl::StatusOr<StoreResponse> reply;  // written before done, read after
  };
  using SlotPtr = std::shared_ptr<Slot>;

  enum Op : uintptr_t { kStarted = 1, kRead, kWrite, kFinish };
  static void* Tag(Op op) { return reinterpret_cast<void*>(op); }

  static constexpr std::chrono::milliseconds kRepoll{1000};
  // Per message, to stay far below any gRPC message limit.
  static constexpr int kMaxClientBatch = 256;
  static constexpr size_t kMaxBatchBytes = 1 << 20;

  static void Complete(const SlotPtr& slot) {
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      slot->done = true;
    }
    slot->cv.notify_one();
  }

  // Requests the server answers without parking them. While one is in
  // flight a reply is sure to come soon, and with it the poller, who writes
  // what queued up meanwhile.
  static bool AnsweredAtOnce(const StoreRequest& request) {
    switch (request.op_case()) {
      case StoreRequest::kGet:
      case StoreRequest::kWait:
      case StoreRequest::kMultiGet:
        return false;
      default:
        return true;
    }
  }

  // REQUIRES: mu_ held. Starts writing the queue if the stream can take it.
  // (Async operations only start here; completions come through cq_.)
  void MaybeWrite() {
    if (!started_ || writing_ || broken_ || outbox_.empty()) return;
    batch_.Clear();
    size_t bytes = 0;
    while (!outbox_.empty() && batch_.requests_size() < kMaxClientBatch) {
      const size_t size = outbox_.front().ByteSizeLong();
      if (batch_.requests_size() > 0 && bytes + size > kMaxBatchBytes) break;
      bytes += size;
      auto it = pending_.find(outbox_.front().id());
      if (it != pending_.end()) {
        it->second->sent = true;
        if (it->second->quick) ++quick_written_;
      }
      *batch_.add_requests() = std::move(outbox_.front());
      outbox_.pop_front();
    }
    writing_ = true;
    call_->Write(batch_, Tag(kWrite));
  }

  // REQUIRES: lock holds mu_ and !polling_. Polls until `mine` is answered,
  // then hands polling to another pending call, if any. Returns with mu_.
  void PollUntilDone(std::unique_lock<std::mutex>& lock, Slot* mine) {
    {
      // A promoted caller may have been answered by another poller before
      // it got here. (Slots are completed only while polling_ is set, so
      // with mu_ held and !polling_ this is final.)
      std::lock_guard<std::mutex> slot_lock(mine->mu);
      if (mine->done) return;
    }
    polling_ = true;
    while (!PollOnce(lock, mine)) {
    }
    polling_ = false;
    MaybeWrite();  // what queued up behind the last reply goes out now
    if (!pending_.empty()) {
      SlotPtr next = pending_.begin()->second;
      {
        std::lock_guard<std::mutex> slot_lock(next->mu);
        next->promoted = true;
      }
      next->cv.notify_one();
    }
  }

  // REQUIRES: lock holds mu_; the caller is the only poller. Handles one
  // completion; true once `mine` (if given) is answered.
  //
  // With `wait`: polls at most that long, and with no `mine`, is true only
  // once a poll found nothing due.
  bool PollOnce(std::unique_lock<std::mutex>& lock, Slot* mine = nullptr,
                std::optional<std::chrono::milliseconds> wait = std::nullopt) {
    void* tag = nullptr;
    bool ok = false;
    lock.unlock();
    // Bounded: with thousands of streams in one process, each polled by its
    // own thread, a completion was seen to go unnoticed until the thread
    // polled again; a timeout re-polls. Not much shorter: 2,500 threads
    // re-polling every 50 ms kept gRPC's pollers so busy that a
    // 10,000-client barrier never finished (with 1 s: 17.6 s, loaded).
    const auto next = cq_.AsyncNext(
        &tag, &ok, std::chrono::system_clock::now() + wait.value_or(kRepoll));
    lock.lock();
    if (next == grpc::CompletionQueue::TIMEOUT) return mine == nullptr;
    if (next == grpc::CompletionQueue::SHUTDOWN) return true;  // not while calls pend
    bool mine_done = false;
    switch (static_cast<Op>(reinterpret_cast<uintptr_t>(tag))) {
      case kStarted:
        if (ok) {
          started_ = true;
          call_->Read(&inbox_, Tag(kRead));
          MaybeWrite();
        } else {
          StartFinish();
        }
        break;
      case kRead:
        if (!ok) {
          StartFinish();
          break;
        }
        for (StoreResponse& reply : *inbox_.mutable_responses()) {
          auto it = pending_.find(reply.id());
          if (it == pending_.end()) continue;
          if (it->second->quick) --quick_written_;
          answered_.push_back(std::move(it->second));
          pending_.erase(it);
          answered_.back()->reply = std::move(reply);
        }
        call_->Read(&inbox_, Tag(kRead));
        MaybeWrite();
        // A slot is touched by its caller only once done is set.
        lock.unlock();
        for (const SlotPtr& slot : answered_) {
          if (slot.get() == mine) mine_done = true;
          Complete(slot);
        }
        lock.lock();
        answered_.clear();
        break;
      case kWrite:
        writing_ = false;
        // A failed write means the stream is dead; the failed read says so.
        if (ok) {
          MaybeWrite();
        } else {
          MarkBroken();
        }
        if (read_failed_) StartFinish();
        break;
      case kFinish:
        finished_ = true;
        broken_reason_ = "store stream to the rendezvous daemon ended: " +
                         (status_.ok() ? std::string("closed by the server")
                                       : status_.error_message());
        for (auto& [id, slot] : pending_) {
          // A refused token or a refused message stays recognisable (the
          // caller must not send it again); anything else is "gone".
          switch (status_.error_code()) {
            case grpc::StatusCode::UNAUTHENTICATED:
              slot->reply = absl::UnauthenticatedError(broken_reason_);
              break;
            case grpc::StatusCode::RESOURCE_EXHAUSTED:
              slot->reply = absl::ResourceExhaustedError(broken_reason_);
              break;
            case grpc::StatusCode::INVALID_ARGUMENT:
              slot->reply = absl::InvalidArgumentError(broken_reason_);
              break;
            default:
              slot->reply = absl::UnavailableError(broken_reason_);
          }
          if (slot.get() == mine) mine_done = true;
          Complete(slot);
        }
        pending_.clear();
        outbox_.clear();
        quick_written_ = 0;
        break;
    }
    return mine_done || (mine == nullptr && !wait);
  }

  // REQUIRES: mu_ held. The stream is over: no new writes; learn its status
  // once no write is in flight.
  void StartFinish() {
    MarkBroken();
    read_failed_ = true;
    if (writing_ || finish_started_) return;
    finish_started_ = true;
    call_->Finish(&status_, Tag(kFinish));
  }

  // REQUIRES: mu_ held. Until Finish tells why, a generic reason.
  void MarkBroken() {
    if (!broken_) broken_reason_ = "store stream to the rendezvous daemon broke";
    broken_ = true;
  }

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<meshrun::v1::Store::Stub> stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<StoreRequestBatch, StoreResponseBatch>>
      call_;
  std::mutex mu_;
  // The rest is guarded by mu_ (the messages are also in use by gRPC while
  // their operation is in flight).
  StoreRequestBatch batch_;
  StoreResponseBatch inbox_;
  grpc::Status status_;
  std::deque<StoreRequest> outbox_;
  std::unordered_map<uint64_t, SlotPtr> pending_;
  std::vector<SlotPtr> answered_;  // the poller's scratch list
  uint64_t next_id_ = 1;
  size_t quick_written_ = 0;  // quick requests written and not answered
  bool polling_ = false;
  bool started_ = false;
  bool writing_ = false;
  bool read_failed_ = false;
  bool finish_started_ = false;
  bool broken_ = false;
  bool finished_ = false;
  std::string broken_reason_;
};

namespace {

// Streams shared by StoreClients of this process, by channel or by target.
// Entries expire with their stream; a broken stream is replaced.
class StreamRegistry {
 public:
  static StreamRegistry& Get() {
    static auto* registry = new StreamRegistry();  // never destroyed
    return *registry;
  }
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<void>> streams;  // guarded by mu
  size_t cleaned_size = 0;                                       // guarded by mu
};

std::string RegistryKey(const StoreClientOptions& options) {
  if (options.channel)
    return "channel:" +
           std::to_string(reinterpret_cast<uintptr_t>(options.channel.get()));
  // Clients with another token or TLS setup need a channel of their own.
  return "target:" + options.target + "\n" + options.security.Fingerprint();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(
    StoreClientOptions options) {
  if (!options.channel && options.target.empty())
    return absl::InvalidArgumentError("store client: no daemon endpoint given");
  // Keyed before a channel is made, so every client of one target shares.
  std::string registry_key = RegistryKey(options);
  if (!options.channel && options.share_stream) {
    // The channel of a live shared stream, if any, is the one to use.
    std::lock_guard<std::mutex> lock(StreamRegistry::Get().mu);
    auto& streams = StreamRegistry::Get().streams;
    if (auto it = streams.find(registry_key); it != streams.end()) {
      if (auto stream = std::static_pointer_cast<Stream>(it->second.lock()))
        options.channel = stream->channel();
    }
  }
  if (!options.channel)
    options.channel =
        MakeStoreChannel(options.target, /*own_connection=*/false, options.security);
  std::unique_ptr<StoreClient> client(new StoreClient(std::move(options)));
  client->registry_key_ = std::move(registry_key);
  auto stream = client->OpenStream(
      nullptr, std::chrono::system_clock::now() + client->options_.connect_timeout);
  if (!stream.ok()) return stream.status();
  client->stream_ = std::move(*stream);
  return client;
}

absl::StatusOr<std::shared_ptr<StoreClient::Stream>> StoreClient::OpenStream(
    const std::shared_ptr<Stream>& broken,
    std::chrono::system_clock::time_point deadline) {
  auto& registry = StreamRegistry::Get();
  if (options_.share_stream) {
    std::lock_guard<std::mutex> lock(registry.mu);
    auto it = registry.streams.find(registry_key_);
    if (it != registry.streams.end()) {
      auto stream = std::static_pointer_cast<Stream>(it->second.lock());
      // Another client may have replaced the broken stream already.
      if (stream && stream != broken && !stream->broken()) return stream;
    }
  }
  if (!options_.channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(
        "cannot reach the rendezvous daemon at " +
        (options_.target.empty() ? std::string("its channel") : options_.target) +
        " within " + std::to_string(options_.connect_timeout.count()) + " ms");
  }
  auto stream = std::make_shared<Stream>(options_.channel);
  if (options_.share_stream) {
    std::lock_guard<std::mutex> lock(registry.mu);
    // Another thread may have opened one meanwhile; either is fine to use.
    registry.streams[registry_key_] = stream;
    // Forget expired entries now and then, so the map stays small.
    if (registry.streams.size() > 2 * registry.cleaned_size + 16) {
      for (auto i = registry.streams.begin(); i != registry.streams.end();)
        i = i->second.expired() ? registry.streams.erase(i) : std::next(i);
      registry.cleaned_size = registry.streams.size();
    }
  }
  return stream;
}

absl::StatusOr<StoreResponse> StoreClient::Call(StoreRequest request) {
  const auto started = std::chrono::steady_clock::now();
  const uint32_t timeout_ms = request.timeout_ms();
  // Reconnecting may take until the daemon is back (a restart), bounded by
  // connect_timeout from the first failure.
  std::optional<std::chrono::system_clock::time_point> reconnect_deadline;
  while (true) {
    std::shared_ptr<Stream> stream;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream = stream_;
    }
    if (stream->broken()) {
      if (!reconnect_deadline)
        reconnect_deadline = std::chrono::system_clock::now() + options_.connect_timeout;
      auto fresh = OpenStream(stream, *reconnect_deadline);
      if (!fresh.ok()) return fresh.status();
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_ == stream) stream_ = *fresh;
      continue;
    }
    if (timeout_ms > 0) {
      // A retried wait keeps its original deadline.
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - started);
      request.set_timeout_ms(static_cast<uint32_t>(
          std::max<int64_t>(1, static_cast<int64_t>(timeout_ms) - spent.count())));
    }
    bool sent = false;
    auto reply = stream->Call(request, &sent);
    if (reply.ok() || !stream->broken()) return reply;
    // Only a lost connection is worth another stream: a refused token, or a
    // message the daemon refuses (too large), is refused again.
    if (reply.status().code() != absl::StatusCode::kUnavailable) return reply;
    // Nor is a stream that keeps breaking: repeating is bounded by
    // connect_timeout from the first failure, even while the channel stays
    // connected.
    const auto now = std::chrono::system_clock::now();
    if (!reconnect_deadline) {
      reconnect_deadline = now + options_.connect_timeout;
    } else if (now >= *reconnect_deadline) {
      return reply;
    }
    if (sent && !SafeToRepeat(request)) {
      return absl::UnavailableError(
          std::string(reply.status().message()) +
          " (the daemon may or may not have applied this request; not repeated)");
    }
  }
}

StoreClient::StoreClient(StoreClientOptions options) : options_(std::move(options)) {}

StoreClient::~StoreClient() = default;

const std::string& StoreClient::ns() const { return options_.ns; }
std::chrono::milliseconds StoreClient::timeout() const { return options_.timeout; }

namespace {
template <typename Fill>
StoreRequest MakeRequest(const std::string& ns, Fill fill) {
  StoreRequest request;
  request.set_ns(ns);
  fill(request);
  return request;
}
}  // namespace

absl::Status StoreClient::Set(const std::string& key, const std::string& value) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.mutable_set()->set_key(key);
    r.mutable_set()->set_value(value);
  }));
  return reply.ok() ? FromReply(*reply) : reply.status();
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key) {
  return Get(key, options_.timeout);
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key,
                                             std::chrono::milliseconds timeout) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.set_timeout_ms(ToTimeoutMs(timeout));
    r.mutable_get()->set_key(key);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  if (reply->values_size() != 1) return absl::InternalError("malformed get reply");
  return std::move(*reply->mutable_values(0));
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.mutable_add()->set_key(key);
    r.mutable_add()->set_delta(delta);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->number();
}

absl::StatusOr<std::string> StoreClient::CompareSet(const std::string& key,
                                                    const std::string& expected,
                                                    const std::string& desired) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    auto* op = r.mutable_compare_set();
    op->set_key(key);
    op->set_expected(expected);
    op->set_desired(desired);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  if (reply->values_size() != 1)
    return absl::InternalError("malformed compare_set reply");
  return std::move(*reply->mutable_values(0));
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys) {
  return Wait(keys, options_.timeout);
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.set_timeout_ms(ToTimeoutMs(timeout));
    for (const auto& k : keys) r.mutable_wait()->add_keys(k);
    if (keys.empty()) r.mutable_wait();
  }));
  return reply.ok() ? FromReply(*reply) : reply.status();
}

absl::StatusOr<bool> StoreClient::Delete(const std::string& key) {
  auto reply = Call(MakeRequest(
      options_.ns, [&](StoreRequest& r) { r.mutable_delete_()->set_key(key); }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->flag();
}

absl::StatusOr<int64_t> StoreClient::NumKeys() {
  auto reply =
      Call(MakeRequest(options_.ns, [&](StoreRequest& r) { r.mutable_num_keys(); }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->number();
}

absl::StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    auto* op = r.mutable_check();
    for (const auto& k : keys) op->add_keys(k);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->flag();
}

absl::StatusOr<std::vector<std::string>> StoreClient::MultiGet(
    const std::vector<std::string>& keys) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.set_timeout_ms(ToTimeoutMs(options_.timeout));
    auto* op = r.mutable_multi_get();
    for (const auto& k : keys) op->add_keys(k);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  if (reply->values_size() != static_cast<int>(keys.size()))
    return absl::InternalError("malformed multi_get reply");
  return std::vector<std::string>(reply->values().begin(), reply->values().end());
}

absl::Status StoreClient::MultiSet(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    auto* op = r.mutable_multi_set();
    for (const auto& [k, v] : entries) {
      auto* kv = op->add_entries();
      kv->set_key(k);
      kv->set_value(v);
    }
  }));
  return reply.ok() ? FromReply(*reply) : reply.status();
}

absl::Status StoreClient::Append(const std::string& key, const std::string& value) {
  auto reply = Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.mutable_append()->set_key(key);
    r.mutable_append()->set_value(value);
  }));
  return reply.ok() ? FromReply(*reply) : reply.status();
}

}  // namespace meshrun::rdzv
