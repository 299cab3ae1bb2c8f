#include "rendezvous/store_client.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "meshrun/v1/store.grpc.pb.h"

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
                                                bool own_connection) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Separate channels to one target silently share a TCP connection unless
  // each has its own subchannel pool.
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The client's end of one Store.BatchSession stream, shared by every
// StoreClient on the same channel (or target). There is no I/O thread: the
// calling threads do the stream's I/O themselves (leader/follower), on
// gRPC's synchronous API.
//  - Writing: a caller that finds no write in flight writes its request, then
//    keeps writing whatever other threads queued meanwhile, as one
//    StoreRequestBatch per write, until the queue is empty.
//  - Reading: while any call is pending exactly one caller reads replies and
//    hands each to its caller; when its own reply arrives it passes the reader
//    role to another pending caller and returns.
// A lone caller thus writes and reads itself with no thread hand-off, and
// many callers share each gRPC message (gRPC's cost is per message).
// grpc calls are made outside mu_; at most one Write and one Read are in
// flight at a time, which gRPC's sync streams allow from different threads.
class StoreClient::Stream {
 public:
  // Opens the stream. REQUIRES: the channel is connected (or connecting).
  explicit Stream(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(meshrun::v1::Store::NewStub(channel_)) {
    stream_ = stub_->BatchSession(&context_);
  }

  // REQUIRES: no Call() in progress (every StoreClient using it is gone).
  ~Stream() {
    if (finished_) return;
    context_.TryCancel();
    (void)stream_->Finish();
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  absl::StatusOr<StoreResponse> Call(StoreRequest request) {
    auto slot = std::make_shared<Slot>();
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (broken_) return absl::UnavailableError(broken_reason_);
      const uint64_t id = next_id_++;
      request.set_id(id);
      slot->quick = AnsweredAtOnce(request);
      pending_.emplace(id, slot);
      outbox_.push_back(std::move(request));
      if (!reading_) {
        ReadUntilDone(lock, slot.get());  // writes the queue first
      } else if (!writing_ && quick_written_ == 0) {
        // The reader may be blocked on parked waits only: write now.
        WriteQueued(lock);
      }
      // Otherwise the reader writes the queue, as one batch, once the reply
      // to a quick request in flight arrives.
    }
    while (true) {
      {
        std::unique_lock<std::mutex> lock(slot->mu);
        slot->cv.wait(lock, [&] { return slot->done || slot->promoted; });
        if (slot->done) return std::move(slot->reply);
        slot->promoted = false;
      }
      // Asked to take over reading; someone may have beaten us to it (that
      // reader promotes another caller when it is done).
      std::unique_lock<std::mutex> lock(mu_);
      if (!reading_) ReadUntilDone(lock, slot.get());
    }
  }

 private:
  // One pending call. Completed (and promoted) under its own mutex, not
  // mu_, so a woken caller does not queue up on the stream's lock; the
  // reader holds a reference, so signalling after the caller left is safe.
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;                    // guarded by mu
    bool promoted = false;                // guarded by mu; asked to become the reader
    bool quick = false;                   // never parked by the server; set before queued
    absl::StatusOr<StoreResponse> reply;  // written before done, read after
  };
  using SlotPtr = std::shared_ptr<Slot>;

  static void Complete(const SlotPtr& slot) {
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      slot->done = true;
    }
    slot->cv.notify_one();
  }

  // Per message, to stay far below any gRPC message limit.
  static constexpr int kMaxClientBatch = 256;
  static constexpr size_t kMaxBatchBytes = 1 << 20;

  // REQUIRES: lock holds mu_ and !writing_. Writes until the queue is empty.
  void WriteQueued(std::unique_lock<std::mutex>& lock) {
    writing_ = true;
    while (!outbox_.empty() && !broken_) {
      batch_.Clear();
      size_t bytes = 0;
      while (!outbox_.empty() && batch_.requests_size() < kMaxClientBatch) {
        const size_t size = outbox_.front().ByteSizeLong();
        if (batch_.requests_size() > 0 && bytes + size > kMaxBatchBytes) break;
        bytes += size;
        auto it = pending_.find(outbox_.front().id());
        if (it != pending_.end() && it->second->quick) ++quick_written_;
        *batch_.add_requests() = std::move(outbox_.front());
        outbox_.pop_front();
      }
      lock.unlock();
      const bool ok = stream_->Write(batch_);
      lock.lock();
      // A failed write means the stream is dead; the reader learns why from
      // Read() and Finish() and fails every pending call.
      if (!ok) break;
    }
    outbox_.clear();  // non-empty only once broken
    writing_ = false;
    writer_cv_.notify_all();
  }

  // REQUIRES: lock holds mu_ and !reading_. Reads replies until `mine` is
  // answered, then hands the reader role to another pending call, if any.
  // Returns with mu_ held.
  void ReadUntilDone(std::unique_lock<std::mutex>& lock, Slot* mine) {
    reading_ = true;
    std::vector<SlotPtr> answered;
    bool mine_done = false;
    while (!mine_done) {
      if (!writing_ && !outbox_.empty()) WriteQueued(lock);
      if (broken_) break;  // Break() already answered everyone
      lock.unlock();
      const bool ok = stream_->Read(&inbox_);
      if (ok) {
        // Replies are moved into their slots without mu_; a slot is only
        // touched by its caller once done is set.
        lock.lock();
        for (StoreResponse& reply : *inbox_.mutable_responses()) {
          auto it = pending_.find(reply.id());
          if (it == pending_.end()) continue;
          if (it->second->quick) --quick_written_;
          answered.push_back(std::move(it->second));
          pending_.erase(it);
          answered.back()->reply = std::move(reply);
        }
        lock.unlock();
        for (const SlotPtr& slot : answered) {
          if (slot.get() == mine) mine_done = true;
          Complete(slot);
        }
        answered.clear();
        lock.lock();
      } else {
        lock.lock();
        Break(lock);
        mine_done = true;
      }
    }
    reading_ = false;
    if (!pending_.empty()) {
      SlotPtr next = pending_.begin()->second;
      {
        std::lock_guard<std::mutex> slot_lock(next->mu);
        next->promoted = true;
      }
      next->cv.notify_one();
    }
  }

  // REQUIRES: lock holds mu_, the caller is the reader, and Read() failed.
  // Learns the stream's status and fails every pending call with it.
  void Break(std::unique_lock<std::mutex>& lock) {
    broken_ = true;
    writer_cv_.wait(lock, [this] { return !writing_; });
    lock.unlock();
    const grpc::Status status = stream_->Finish();
    lock.lock();
    finished_ = true;
    broken_reason_ =
        "store stream to the rendezvous daemon ended: " +
        (status.ok() ? std::string("closed by the server") : status.error_message());
    for (auto& [id, slot] : pending_) {
      slot->reply = absl::UnavailableError(broken_reason_);
      Complete(slot);
    }
    pending_.clear();
    outbox_.clear();
    quick_written_ = 0;
  }

  // Requests the server answers without parking them. While one is in
  // flight a reply is sure to come soon, so the reader will be back to write
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

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<meshrun::v1::Store::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<StoreRequestBatch, StoreResponseBatch>>
      stream_;
  StoreRequestBatch batch_;   // used by the writer only
  StoreResponseBatch inbox_;  // used by the reader only
  std::mutex mu_;
  std::condition_variable writer_cv_;              // signalled when writing_ turns false
  std::deque<StoreRequest> outbox_;                // guarded by mu_
  std::unordered_map<uint64_t, SlotPtr> pending_;  // guarded by mu_
  uint64_t next_id_ = 1;                           // guarded by mu_
  // Quick requests written and not answered yet.
  size_t quick_written_ = 0;   // guarded by mu_
  bool writing_ = false;       // guarded by mu_
  bool reading_ = false;       // guarded by mu_
  bool broken_ = false;        // guarded by mu_
  bool finished_ = false;      // guarded by mu_
  std::string broken_reason_;  // guarded by mu_
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
  return "target:" + options.target;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(
    StoreClientOptions options) {
  if (!options.channel && options.target.empty())
    return absl::InvalidArgumentError("store client: no daemon endpoint given");
  auto& registry = StreamRegistry::Get();
  const std::string key = RegistryKey(options);
  if (options.share_stream) {
    std::lock_guard<std::mutex> lock(registry.mu);
    auto it = registry.streams.find(key);
    if (it != registry.streams.end()) {
      auto stream = std::static_pointer_cast<Stream>(it->second.lock());
      if (stream && !stream->broken())
        return std::unique_ptr<StoreClient>(
            new StoreClient(std::move(options), std::move(stream)));
    }
  }
  if (!options.channel)
    options.channel = MakeStoreChannel(options.target, /*own_connection=*/false);
  auto deadline = std::chrono::system_clock::now() + options.connect_timeout;
  if (!options.channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(
        "cannot reach the rendezvous daemon at " +
        (options.target.empty() ? std::string("its channel") : options.target) +
        " within " + std::to_string(options.connect_timeout.count()) + " ms");
  }
  auto stream = std::make_shared<Stream>(options.channel);
  if (options.share_stream) {
    std::lock_guard<std::mutex> lock(registry.mu);
    // Another thread may have opened one meanwhile; either is fine to use.
    auto& entry = registry.streams[key];
    entry = stream;
    // Forget expired entries now and then, so the map stays small.
    if (registry.streams.size() > 2 * registry.cleaned_size + 16) {
      for (auto i = registry.streams.begin(); i != registry.streams.end();)
        i = i->second.expired() ? registry.streams.erase(i) : std::next(i);
      registry.cleaned_size = registry.streams.size();
    }
  }
  return std::unique_ptr<StoreClient>(
      new StoreClient(std::move(options), std::move(stream)));
}

StoreClient::StoreClient(StoreClientOptions options, std::shared_ptr<Stream> stream)
    : options_(std::move(options)), stream_(std::move(stream)) {}

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
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
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
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.set_timeout_ms(ToTimeoutMs(timeout));
    r.mutable_get()->set_key(key);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  if (reply->values_size() != 1) return absl::InternalError("malformed get reply");
  return std::move(*reply->mutable_values(0));
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
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
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
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
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.set_timeout_ms(ToTimeoutMs(timeout));
    for (const auto& k : keys) r.mutable_wait()->add_keys(k);
    if (keys.empty()) r.mutable_wait();
  }));
  return reply.ok() ? FromReply(*reply) : reply.status();
}

absl::StatusOr<bool> StoreClient::Delete(const std::string& key) {
  auto reply = stream_->Call(MakeRequest(
      options_.ns, [&](StoreRequest& r) { r.mutable_delete_()->set_key(key); }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->flag();
}

absl::StatusOr<int64_t> StoreClient::NumKeys() {
  auto reply = stream_->Call(
      MakeRequest(options_.ns, [&](StoreRequest& r) { r.mutable_num_keys(); }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->number();
}

absl::StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    auto* op = r.mutable_check();
    for (const auto& k : keys) op->add_keys(k);
  }));
  if (!reply.ok()) return reply.status();
  if (absl::Status s = FromReply(*reply); !s.ok()) return s;
  return reply->flag();
}

absl::StatusOr<std::vector<std::string>> StoreClient::MultiGet(
    const std::vector<std::string>& keys) {
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
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
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
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
  auto reply = stream_->Call(MakeRequest(options_.ns, [&](StoreRequest& r) {
    r.mutable_append()->set_key(key);
    r.mutable_append()->set_value(value);
  }));
  return reply.ok() ? FromReply(*reply) : reply.status();
}

}  // namespace meshrun::rdzv
