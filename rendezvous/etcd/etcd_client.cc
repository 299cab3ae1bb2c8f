#include "rendezvous/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace meshrun::rdzv {

namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// Worth the next member: this one is down, cut off, or without a raft
// leader ("etcdserver: no leader", "leader changed", "request timed out" all
// come as UNAVAILABLE).
bool TryAnotherMember(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

bool TokenExpired(const grpc::Status& status) {
  return absl::StrContains(status.error_message(), "invalid auth token");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& list) {
  std::vector<std::string> endpoints;
  std::set<std::string> seen;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    std::string endpoint(entry);
    // etcd's own spelling, http://host:port, is accepted too.
    for (const char* scheme : {"http://", "https://"}) {
      if (absl::StartsWith(endpoint, scheme)) endpoint = endpoint.substr(strlen(scheme));
    }
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (endpoint.empty() || colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd-endpoints: '", entry, "' is not HOST:PORT"));
    }
    if (!seen.insert(endpoint).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd-endpoints: ", endpoint, " is named twice"));
    }
    endpoints.push_back(endpoint);
  }
  return endpoints;
}

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options_.ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.ca_pem;
    ssl.pem_cert_chain = options_.cert_pem;
    ssl.pem_private_key = options_.key_pem;
    creds = grpc::SslCredentials(ssl);
  }
  for (const std::string& endpoint : options_.endpoints) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    // A member that went away is tried again soon after it is back, not after
    // gRPC's default backoff of up to two minutes.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    // Each connection attempt gets 2 s (etcdctl's dial timeout; gRPC's own
    // is 20 s), so an attempt on a member that was cut off does not hold
    // back the one after it came back. (At 100 ms, attempts failed under
    // load before the TCP handshake did.)
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
    // No keepalive pings: etcd closes connections that ping more often than
    // every 5 s, or without a call open (too_many_pings). A silent member is
    // left by the calls' own deadline, and the next call starts at the member
    // that answered.
    Member member;
    member.endpoint = endpoint;
    member.channel = grpc::CreateCustomChannel(endpoint, creds, args);
    member.kv = etcdserverpb::KV::NewStub(member.channel);
    member.lease = etcdserverpb::Lease::NewStub(member.channel);
    member.maintenance = etcdserverpb::Maintenance::NewStub(member.channel);
    member.auth = etcdserverpb::Auth::NewStub(member.channel);
    members_.push_back(std::move(member));
  }
  connection_driver_ = std::thread([this] { DriveConnections(); });
}

EtcdClient::~EtcdClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  connection_driver_.join();
}

// gRPC advances a connection attempt only while some thread polls, and a
// fail-fast call on a channel in TRANSIENT_FAILURE returns at once. So in a
// daemon that serves nothing yet (dialling etcd, standing by) no thread polls
// between calls, and an attempt (the TCP connect, then the member's HTTP/2
// SETTINGS) moves only with gRPC's backup poller, every 5 s: slower than the
// attempt's own 2 s deadline, so it never completes. A daemon started while
// its etcd was still coming up then never reached it (6 of 25 on an idle
// machine gave up after their 30 s dial timeout). This thread polls while any
// member is not connected.
void EtcdClient::DriveConnections() {
  constexpr auto kPollSlice = std::chrono::milliseconds(100);
  constexpr auto kReadyCheckEvery = std::chrono::milliseconds(250);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    bool polled = false;
    for (Member& member : members_) {
      const grpc_connectivity_state state =
          member.channel->GetState(/*try_to_connect=*/true);
      if (state == GRPC_CHANNEL_READY) continue;
      member.channel->WaitForStateChange(state,
                                         std::chrono::system_clock::now() + kPollSlice);
      polled = true;
    }
    lock.lock();
    if (!polled) stop_cv_.wait_for(lock, kReadyCheckEvery, [this] { return stopping_; });
  }
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  std::lock_guard<std::mutex> lock(mu_);
  if (!token_.empty()) context->AddMetadata("token", token_);
  return context;
}

absl::Status EtcdClient::Authenticate(Member& member) {
  etcdserverpb::AuthenticateRequest request;
  request.set_name(options_.user);
  request.set_password(options_.password);
  etcdserverpb::AuthenticateResponse reply;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  grpc::Status status = member.auth->Authenticate(&context, request, &reply);
  if (!status.ok()) return FromGrpc(status);
  std::lock_guard<std::mutex> lock(mu_);
  token_ = reply.token();
  return absl::OkStatus();
}

template <typename Call>
absl::Status EtcdClient::OnSomeMember(const char* what, Call&& call) {
  size_t first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = current_;
  }
  grpc::Status last;
  for (size_t i = 0; i < members_.size(); ++i) {
    const size_t index = (first + i) % members_.size();
    Member& member = members_[index];
    grpc::Status status = call(member);
    if (!status.ok() && TokenExpired(status) && !options_.user.empty()) {
      if (absl::Status auth = Authenticate(member); auth.ok()) status = call(member);
    }
    if (status.ok() || !TryAnotherMember(status)) {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = index;
      return status.ok()
                 ? absl::OkStatus()
                 : absl::Status(FromGrpc(status).code(),
                                absl::StrCat("etcd ", what, " at ", member.endpoint, ": ",
                                             status.error_message()));
    }
    last = status;
    spdlog::debug("etcd {} at {}: {}; trying the next member", what, member.endpoint,
                  status.error_message());
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd ", what, ": no member answered (last: ", last.error_message(), ")"));
}

absl::Status EtcdClient::Check() {
  absl::Status unreachable = absl::UnavailableError("no etcd endpoint given");
  for (Member& member : members_) {
    etcdserverpb::StatusResponse reply;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
    grpc::Status status = member.maintenance->Status(&context, {}, &reply);
    if (!status.ok()) {
      // A gRPC server without etcd's services answers UNIMPLEMENTED; an
      // HTTP/1 server fails the HTTP/2 handshake in so many words. (A member
      // still starting fails it too, as "handshaker shutdown": unreachable.)
      const bool not_etcd = status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
                            status.error_code() == grpc::StatusCode::INTERNAL ||
                            absl::StrContains(status.error_message(), "http1") ||
                            absl::StrContains(status.error_message(), "HTTP/1");
      if (not_etcd) {
        return absl::InvalidArgumentError(
            absl::StrCat(member.endpoint, " does not answer as etcd's v3 API (",
                         status.error_message(), ")"));
      }
      unreachable = absl::UnavailableError(
          absl::StrCat("etcd at ", member.endpoint, ": ", status.error_message()));
      continue;
    }
    if (reply.version().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          member.endpoint, " answered etcd's Status without a version: not etcd"));
    }
    if (!options_.user.empty()) {
      if (absl::Status auth = Authenticate(member); !auth.ok()) {
        if (auth.code() == absl::StatusCode::kUnavailable ||
            auth.code() == absl::StatusCode::kDeadlineExceeded) {
          unreachable = auth;
          continue;
        }
        return absl::InvalidArgumentError(absl::StrCat("etcd at ", member.endpoint,
                                                       " refused user ", options_.user,
                                                       ": ", auth.message()));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    current_ = static_cast<size_t>(&member - members_.data());
    return absl::OkStatus();
  }
  return unreachable;
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request) {
  etcdserverpb::RangeResponse reply;
  absl::Status status = OnSomeMember("range", [&](Member& member) {
    auto context = Context();
    return member.kv->Range(context.get(), request, &reply);
  });
  if (!status.ok()) return status;
  return reply;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse reply;
  absl::Status status = OnSomeMember("txn", [&](Member& member) {
    auto context = Context();
    return member.kv->Txn(context.get(), request, &reply);
  });
  if (!status.ok()) return status;
  return reply;
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse reply;
  absl::Status status = OnSomeMember("lease grant", [&](Member& member) {
    auto context = Context();
    return member.lease->LeaseGrant(context.get(), request, &reply);
  });
  if (!status.ok()) return status;
  if (!reply.error().empty())
    return absl::InternalError("etcd lease grant: " + reply.error());
  return reply;
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease_id) {
  int64_t ttl = 0;
  absl::Status status = OnSomeMember("lease keep-alive", [&](Member& member) {
    auto context = Context();
    auto stream = member.lease->LeaseKeepAlive(context.get());
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease_id);
    etcdserverpb::LeaseKeepAliveResponse reply;
    if (stream->Write(request) && stream->WritesDone() && stream->Read(&reply)) {
      ttl = reply.ttl();
      context->TryCancel();
    }
    grpc::Status finished = stream->Finish();
    if (finished.error_code() == grpc::StatusCode::CANCELLED) return grpc::Status::OK;
    if (finished.ok() && reply.id() == 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "keep-alive stream ended unanswered");
    }
    return finished;
  });
  if (!status.ok()) return status;
  return ttl;
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease_id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse reply;
  return OnSomeMember("lease revoke", [&](Member& member) {
    auto context = Context();
    return member.lease->LeaseRevoke(context.get(), request, &reply);
  });
}

std::string EtcdClient::current_endpoint() {
  std::lock_guard<std::mutex> lock(mu_);
  return members_.empty() ? std::string() : members_[current_].endpoint;
}

}  // namespace meshrun::rdzv
