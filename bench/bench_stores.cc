#include "bench/bench_stores.h"

#include <grpcpp/grpcpp.h>

#include <exception>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "rendezvous/client/store_client.h"

namespace meshrun::bench {

namespace {

constexpr char kBenchNamespace[] = "bench";

class MeshrunStore final : public BenchStore {
 public:
  explicit MeshrunStore(std::unique_ptr<rdzv::StoreClient> client)
      : client_(std::move(client)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return client_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    return client_->Get(key);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return client_->Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys) override {
    return client_->Wait(keys);
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    return client_->Check(keys);
  }

 private:
  std::unique_ptr<rdzv::StoreClient> client_;
};

absl::Status FromException(const char* op, const std::exception& e) {
  std::string what = e.what();
  // c10 appends a C++ backtrace to its messages; one line is enough here.
  if (auto newline = what.find('\n'); newline != std::string::npos) what.resize(newline);
  return absl::UnavailableError(std::string("TCPStore ") + op + ": " + what);
}

class TorchStore final : public BenchStore {
 public:
  explicit TorchStore(std::unique_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return FromException("set", e);
    }
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    try {
      auto value = store_->get(key);
      return std::string(value.begin(), value.end());
    } catch (const std::exception& e) {
      return FromException("get", e);
    }
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      return FromException("add", e);
    }
  }
  absl::Status Wait(const std::vector<std::string>& keys) override {
    try {
      store_->wait(keys);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return FromException("wait", e);
    }
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    try {
      return store_->check(keys);
    } catch (const std::exception& e) {
      return FromException("check", e);
    }
  }

 private:
  std::unique_ptr<c10d::TCPStore> store_;
};

class TorchServer final : public TcpStoreServer {
 public:
  explicit TorchServer(std::unique_ptr<c10d::TCPStore> store)
      : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  std::unique_ptr<c10d::TCPStore> store_;
};

}  // namespace

const char* ToString(Impl impl) {
  switch (impl) {
    case Impl::kMeshrun:
      return "meshrun";
    case Impl::kTcpStore:
      return "tcpstore";
    case Impl::kMeshrunSync:
      return "meshrun-sync";
    case Impl::kMeshrunTcpStore:
      return "meshrun-tcpstore";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<BenchStore>> ConnectMeshrun(
    const std::string& target, std::shared_ptr<grpc::Channel> channel,
    std::chrono::milliseconds timeout) {
  rdzv::StoreClientOptions options;
  options.target = target;
  options.channel = channel ? std::move(channel)
                            : rdzv::MakeStoreChannel(target, /*own_connection=*/true);
  options.ns = kBenchNamespace;
  options.timeout = timeout;
  options.connect_timeout = timeout;
  auto client = rdzv::StoreClient::Connect(std::move(options));
  if (!client.ok()) return client.status();
  return std::unique_ptr<BenchStore>(new MeshrunStore(std::move(*client)));
}

absl::StatusOr<std::unique_ptr<BenchStore>> ConnectTcpStore(
    const std::string& host, int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    return std::unique_ptr<BenchStore>(
        new TorchStore(std::make_unique<c10d::TCPStore>(host, options)));
  } catch (const std::exception& e) {
    return FromException("connect", e);
  }
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  // The peer is torch 2's TCPStore as torch serves it: the libuv server, its
  // default (said here so that a libtorch without libuv cannot slip in the
  // classic server unnoticed: it would only warn and fall back).
  options.useLibUV = true;
  std::unique_ptr<c10d::TCPStore> store;
  try {
    store = std::make_unique<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    return FromException("server start", e);
  }
  if (!store->isLibUvBackend())
    return absl::FailedPreconditionError(
        "TCPStore server start: libtorch fell back to the classic server, not libuv");
  return std::unique_ptr<TcpStoreServer>(new TorchServer(std::move(store)));
}

}  // namespace meshrun::bench
