#include "rendezvous/store_client.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <unordered_map>

#include "meshrun/v1/store.grpc.pb.h"

namespace meshrun::rdzv {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreResponse;

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

// The client's end of one Store.Session stream. Requests from many threads
// are written one at a time in arrival order; replies are matched by id.
// gRPC calls are made outside mu_, since a reaction may run inline.
class StoreClient::Stream final
    : public grpc::ClientBidiReactor<StoreRequest, StoreResponse> {
 public:
  explicit Stream(std::shared_ptr<grpc::Channel> channel)
      : stub_(meshrun::v1::Store::NewStub(std::move(channel))) {}

  ~Stream() override {
    context_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
  }

  void Start() {
    stub_->async()->Session(&context_, this);
    AddHold();  // keeps OnDone away while the read loop runs
    StartRead(&reply_);
    StartCall();
  }

  absl::StatusOr<StoreResponse> Call(StoreRequest request) {
    std::promise<absl::StatusOr<StoreResponse>> promise;
    auto future = promise.get_future();
    StoreRequest* to_write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return absl::UnavailableError(broken_reason_);
      uint64_t id = next_id_++;
      request.set_id(id);
      pending_.emplace(id, std::move(promise));
      outbox_.push_back(std::move(request));
      if (!writing_) {
        writing_ = true;
        to_write = &outbox_.front();
      }
    }
    if (to_write) StartWrite(to_write);
    return future.get();
  }

  void OnWriteDone(bool ok) override {
    StoreRequest* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outbox_.pop_front();
      if (ok && !outbox_.empty()) {
        next = &outbox_.front();
      } else {
        writing_ = false;
      }
      // On !ok the stream is broken; OnDone fails everything still pending.
    }
    if (next) StartWrite(next);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      RemoveHold();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(reply_.id());
      if (it != pending_.end()) {
        it->second.set_value(std::move(reply_));
        pending_.erase(it);
      }
    }
    reply_.Clear();
    StartRead(&reply_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    broken_reason_ =
        "store stream to the rendezvous daemon ended: " +
        (status.ok() ? std::string("closed by the server") : status.error_message());
    for (auto& [id, promise] : pending_)
      promise.set_value(absl::UnavailableError(broken_reason_));
    pending_.clear();
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  std::unique_ptr<meshrun::v1::Store::Stub> stub_;
  grpc::ClientContext context_;
  StoreResponse reply_;  // owned by the read loop
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<StoreRequest> outbox_;  // guarded by mu_; front is being written
  std::unordered_map<uint64_t, std::promise<absl::StatusOr<StoreResponse>>>
      pending_;                // guarded by mu_
  uint64_t next_id_ = 1;       // guarded by mu_
  bool writing_ = false;       // guarded by mu_
  bool broken_ = false;        // guarded by mu_
  std::string broken_reason_;  // guarded by mu_
  bool done_ = false;          // guarded by mu_
};

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(
    StoreClientOptions options) {
  if (!options.channel) {
    if (options.target.empty())
      return absl::InvalidArgumentError("store client: no daemon endpoint given");
    options.channel = MakeStoreChannel(options.target, /*own_connection=*/false);
  }
  auto deadline = std::chrono::system_clock::now() + options.connect_timeout;
  if (!options.channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(
        "cannot reach the rendezvous daemon at " +
        (options.target.empty() ? std::string("its channel") : options.target) +
        " within " + std::to_string(options.connect_timeout.count()) + " ms");
  }
  auto stream = std::make_shared<Stream>(options.channel);
  stream->Start();
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
