#include "bench/sync_stream_store.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/client/store_client.h"

namespace meshrun::bench {

namespace {

namespace v1 = meshrun::v1;

class SyncStreamStore final : public BenchStore {
 public:
  SyncStreamStore(std::shared_ptr<grpc::Channel> channel,
                  std::chrono::milliseconds timeout)
      : stub_(v1::Store::NewStub(std::move(channel))), timeout_(timeout) {
    stream_ = stub_->Session(&context_);
  }
  ~SyncStreamStore() override {
    stream_->WritesDone();
    context_.TryCancel();
    (void)stream_->Finish();
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    v1::StoreRequest r;
    r.mutable_set()->set_key(key);
    r.mutable_set()->set_value(value);
    return Call(std::move(r)).status();
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    v1::StoreRequest r;
    r.set_timeout_ms(static_cast<uint32_t>(timeout_.count()));
    r.mutable_get()->set_key(key);
    auto reply = Call(std::move(r));
    if (!reply.ok()) return reply.status();
    if (reply->values_size() != 1) return absl::InternalError("malformed get reply");
    return std::move(*reply->mutable_values(0));
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    v1::StoreRequest r;
    r.mutable_add()->set_key(key);
    r.mutable_add()->set_delta(delta);
    auto reply = Call(std::move(r));
    if (!reply.ok()) return reply.status();
    return reply->number();
  }
  absl::Status Wait(const std::vector<std::string>& keys) override {
    v1::StoreRequest r;
    r.set_timeout_ms(static_cast<uint32_t>(timeout_.count()));
    for (const auto& k : keys) r.mutable_wait()->add_keys(k);
    return Call(std::move(r)).status();
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    v1::StoreRequest r;
    for (const auto& k : keys) r.mutable_check()->add_keys(k);
    auto reply = Call(std::move(r));
    if (!reply.ok()) return reply.status();
    return reply->flag();
  }

 private:
  absl::StatusOr<v1::StoreResponse> Call(v1::StoreRequest request) {
    request.set_id(++next_id_);
    request.set_ns("bench");
    v1::StoreResponse reply;
    if (!stream_->Write(request) || !stream_->Read(&reply))
      return absl::UnavailableError("store stream broke");
    if (reply.id() != request.id()) return absl::InternalError("reply out of order");
    if (reply.code() != v1::STORE_OK) return absl::UnknownError(reply.error());
    return reply;
  }

  std::unique_ptr<v1::Store::Stub> stub_;
  const std::chrono::milliseconds timeout_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StoreRequest, v1::StoreResponse>> stream_;
  uint64_t next_id_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchStore>> ConnectMeshrunSync(
    const std::string& target, std::shared_ptr<grpc::Channel> channel,
    std::chrono::milliseconds timeout) {
  if (!channel) channel = rdzv::MakeStoreChannel(target, /*own_connection=*/true);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + timeout))
    return absl::UnavailableError("cannot reach " + target);
  return std::unique_ptr<BenchStore>(new SyncStreamStore(std::move(channel), timeout));
}

}  // namespace meshrun::bench
