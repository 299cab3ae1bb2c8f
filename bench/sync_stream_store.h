#pragma once

// Diagnostic only (store_bench --peers ...,meshrun-sync): a Store.Session
// client on gRPC's synchronous API, where the calling thread writes the
// request and reads the reply itself. It exists to measure what
// rdzv::StoreClient's design (callback reactor + a promise the caller blocks
// on, i.e. two thread hand-offs per operation) costs; it is not a product
// client: one thread at a time, replies in order, no parked-wait multiplexing.

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench/bench_stores.h"

namespace grpc {
class Channel;
}

namespace meshrun::bench {

absl::StatusOr<std::unique_ptr<BenchStore>> ConnectMeshrunSync(
    const std::string& target, std::shared_ptr<grpc::Channel> channel,
    std::chrono::milliseconds timeout);

}  // namespace meshrun::bench
