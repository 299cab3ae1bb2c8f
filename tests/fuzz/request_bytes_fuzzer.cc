// Arbitrary bytes as each request message of the daemon: the first byte picks
// a method of the Store or Rendezvous service, the rest is sent as that
// method's request, unparsed, so the daemon's own deserialisation, validation
// and handlers take it. The same bytes are also parsed here and validated
// directly, which exercises request_validation without gRPC in between.

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

#include "meshrun/v1/rendezvous.pb.h"
#include "meshrun/v1/store.pb.h"
#include "rendezvous/core/request_validation.h"
#include "tests/fuzz/fuzz_daemon.h"

namespace {

namespace v1 = meshrun::v1;
using meshrun::rdzv::RequestLimits;

constexpr const char* kMethods[] = {
    "/meshrun.v1.Store/Session",
    "/meshrun.v1.Store/BatchSession",
    "/meshrun.v1.Rendezvous/Join",
    "/meshrun.v1.Rendezvous/Heartbeat",
    "/meshrun.v1.Rendezvous/ReportFailure",
    "/meshrun.v1.Rendezvous/ReportSuccess",
    "/meshrun.v1.Rendezvous/Leave",
    "/meshrun.v1.Rendezvous/Close",
};
constexpr size_t kNumMethods = sizeof(kMethods) / sizeof(kMethods[0]);

template <typename Message, typename Validate>
void ParseAndValidate(const uint8_t* data, size_t size, Validate validate) {
  Message message;
  if (message.ParseFromArray(data, static_cast<int>(size))) (void)validate(message);
}

void ValidateLocally(size_t method, const uint8_t* data, size_t size) {
  const RequestLimits limits;
  switch (method) {
    case 0:
      ParseAndValidate<v1::StoreRequest>(data, size, [&](const v1::StoreRequest& r) {
        return meshrun::rdzv::ValidateStoreRequest(r, limits);
      });
      break;
    case 1:
      ParseAndValidate<v1::StoreRequestBatch>(
          data, size, [&](const v1::StoreRequestBatch& batch) {
            for (const auto& r : batch.requests())
              (void)meshrun::rdzv::ValidateStoreRequest(r, limits);
            return absl::OkStatus();
          });
      break;
    case 2:
      ParseAndValidate<v1::JoinRequest>(data, size, [&](const v1::JoinRequest& r) {
        return meshrun::rdzv::ValidateJoin(r, limits);
      });
      break;
    case 3:
      ParseAndValidate<v1::HeartbeatRequest>(
          data, size, [&](const v1::HeartbeatRequest& r) {
            return meshrun::rdzv::ValidateHeartbeat(r, limits);
          });
      break;
    case 4:
      ParseAndValidate<v1::FailureReport>(data, size, [&](const v1::FailureReport& r) {
        return meshrun::rdzv::ValidateFailureReport(r, limits);
      });
      break;
    case 5:
      ParseAndValidate<v1::SuccessReport>(data, size, [&](const v1::SuccessReport& r) {
        return meshrun::rdzv::ValidateSuccessReport(r, limits);
      });
      break;
    case 6:
      ParseAndValidate<v1::LeaveRequest>(data, size, [&](const v1::LeaveRequest& r) {
        return meshrun::rdzv::ValidateLeave(r, limits);
      });
      break;
    case 7:
      ParseAndValidate<v1::CloseRequest>(data, size, [&](const v1::CloseRequest& r) {
        return meshrun::rdzv::ValidateClose(r, limits);
      });
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs every string field with invalid UTF-8 it parses (here and in
  // the daemon); a fuzzer makes thousands a second.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t method = data[0] % kNumMethods;
  ++data;
  --size;
  ValidateLocally(method, data, size);

  auto& daemon = meshrun::fuzz::FuzzDaemon::Get();
  daemon.inputs++;
  grpc::GenericStub stub(daemon.channel);
  grpc::ClientContext context;
  // Streams stay open on the server (a Join waits for its round, a get for
  // its key): the deadline ends them, as a vanishing client would.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(20));
  grpc::Slice slice(data, size);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  stub.UnaryCall(&context, kMethods[method], grpc::StubOptions(), &request, &response,
                 [&](grpc::Status) {
                   std::lock_guard<std::mutex> lock(mu);
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return 0;
}
