#pragma once

// absl::Status -> grpc::Status for the services' replies (the codes share
// their numbering).

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace meshrun::rdzv {

inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace meshrun::rdzv
