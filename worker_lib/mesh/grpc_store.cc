#include "worker_lib/mesh/grpc_store.h"

#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rendezvous/client/store_client.h"

namespace meshrun::worker {

namespace {

std::string ToString(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> ToBytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// c10d's kNoTimeout (0) means "wait forever"; the wire's longest wait is
// 2^32-1 ms (49 days), which is forever enough.
std::chrono::milliseconds WireTimeout(std::chrono::milliseconds timeout) {
  if (timeout == c10d::Store::kNoTimeout || timeout.count() < 0)
    return std::chrono::milliseconds(std::numeric_limits<uint32_t>::max());
  return timeout;
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<GrpcStore>> GrpcStore::Connect(
    GrpcStoreOptions options) {
  if (!options.security) {
    auto from_env = rdzv::ClientSecurityFromEnvironment(std::getenv);
    if (!from_env.ok()) return from_env.status();
    options.security = std::move(*from_env);
  }
  rdzv::StoreClientOptions client_options;
  client_options.target = options.endpoint;
  client_options.channel =
      rdzv::MakeStoreChannel(options.endpoint, options.own_connection, *options.security);
  client_options.ns = options.ns;
  client_options.timeout = WireTimeout(options.timeout);
  client_options.connect_timeout = options.connect_timeout;
  auto client = rdzv::StoreClient::Connect(std::move(client_options));
  if (!client.ok()) return client.status();
  return c10::make_intrusive<GrpcStore>(
      std::shared_ptr<rdzv::StoreClient>(std::move(*client)), options.endpoint,
      options.timeout);
}

GrpcStore::GrpcStore(std::shared_ptr<rdzv::StoreClient> client, std::string endpoint,
                     std::chrono::milliseconds timeout)
    : c10d::Store(timeout), client_(std::move(client)), endpoint_(std::move(endpoint)) {}

GrpcStore::~GrpcStore() = default;

const std::string& GrpcStore::ns() const { return client_->ns(); }

namespace {

// Throws the c10::Error a failed call becomes: one line, no C++ backtrace.
[[noreturn]] void Throw(const GrpcStore& store, const char* op,
                        const absl::Status& status,
                        std::chrono::milliseconds timeout = {}) {
  std::string where = absl::StrCat(" (meshrun store ", store.endpoint(), ", namespace '",
                                   store.ns(), "')");
  if (absl::IsDeadlineExceeded(status)) {
    // The daemon's message names the keys still missing.
    throw StoreTimeoutError(absl::StrCat("Wait timeout after ", timeout.count(),
                                         " ms in ", op, ": ", status.message(), where));
  }
  std::string message;
  if (absl::IsUnavailable(status)) {
    message =
        absl::StrCat("meshrun store ", op,
                     " failed, the daemon is unreachable: ", status.message(), where);
  } else {
    message = absl::StrCat("meshrun store ", op, ": ", status.message(), where);
  }
  throw StoreError(std::move(message));
}

}  // namespace

void GrpcStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  if (absl::Status s = client_->Set(key, ToString(value)); !s.ok())
    Throw(*this, "set", s);
}

std::vector<uint8_t> GrpcStore::compareSet(const std::string& key,
                                           const std::vector<uint8_t>& expected_value,
                                           const std::vector<uint8_t>& desired_value) {
  auto result =
      client_->CompareSet(key, ToString(expected_value), ToString(desired_value));
  if (!result.ok()) Throw(*this, "compareSet", result.status());
  return ToBytes(*result);
}

std::vector<uint8_t> GrpcStore::get(const std::string& key) { return get(key, timeout_); }

std::vector<uint8_t> GrpcStore::get(const std::string& key,
                                    std::chrono::milliseconds timeout) {
  auto result = client_->Get(key, WireTimeout(timeout));
  if (!result.ok()) Throw(*this, "get", result.status(), timeout);
  return ToBytes(*result);
}

int64_t GrpcStore::add(const std::string& key, int64_t value) {
  auto result = client_->Add(key, value);
  if (!result.ok()) Throw(*this, "add", result.status());
  return *result;
}

bool GrpcStore::deleteKey(const std::string& key) {
  auto result = client_->Delete(key);
  if (!result.ok()) Throw(*this, "deleteKey", result.status());
  return *result;
}

bool GrpcStore::check(const std::vector<std::string>& keys) {
  auto result = client_->Check(keys);
  if (!result.ok()) Throw(*this, "check", result.status());
  return *result;
}

int64_t GrpcStore::getNumKeys() {
  auto result = client_->NumKeys();
  if (!result.ok()) Throw(*this, "getNumKeys", result.status());
  return *result;
}

void GrpcStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  if (absl::Status s = client_->Wait(keys, WireTimeout(timeout)); !s.ok())
    Throw(*this, "wait", s, timeout);
}

c10::intrusive_ptr<c10d::Store> GrpcStore::clone() {
  return c10::make_intrusive<GrpcStore>(client_, endpoint_, timeout_);
}

std::vector<std::vector<uint8_t>> GrpcStore::multiGet(
    const std::vector<std::string>& keys) {
  // The client's MultiGet waits with the connect-time timeout; waiting first
  // honours setTimeout().
  wait(keys, timeout_);
  auto result = client_->MultiGet(keys);
  if (!result.ok()) Throw(*this, "multiGet", result.status(), timeout_);
  std::vector<std::vector<uint8_t>> values;
  values.reserve(result->size());
  for (const std::string& value : *result) values.push_back(ToBytes(value));
  return values;
}

void GrpcStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::vector<uint8_t>>& values) {
  if (keys.size() != values.size()) {
    throw StoreError(
        absl::StrCat("multiSet: ", keys.size(), " keys but ", values.size(), " values"));
  }
  std::vector<std::pair<std::string, std::string>> entries;
  entries.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    entries.emplace_back(keys[i], ToString(values[i]));
  if (absl::Status s = client_->MultiSet(entries); !s.ok()) Throw(*this, "multiSet", s);
}

void GrpcStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  if (absl::Status s = client_->Append(key, ToString(value)); !s.ok())
    Throw(*this, "append", s);
}

}  // namespace meshrun::worker
