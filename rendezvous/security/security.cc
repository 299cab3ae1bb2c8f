#include "rendezvous/security/security.h"

#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>
#include <spdlog/spdlog.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "rendezvous/client/endpoint_list.h"

namespace meshrun::rdzv {

namespace {

constexpr char kCertMarker[] = "CERTIFICATE";
constexpr char kKeyMarker[] = "PRIVATE KEY";

absl::Status LoadTls(const std::string& cert_path, const std::string& key_path,
                     absl::string_view cert_flag, absl::string_view key_flag,
                     std::string* cert_pem, std::string* key_pem) {
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_flag, " and ", key_flag, " must be given together"));
  }
  if (cert_path.empty()) return absl::OkStatus();
  auto cert = ReadPemFile(cert_path, cert_flag, kCertMarker);
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(key_path, key_flag, kKeyMarker);
  if (!key.ok()) return key.status();
  *cert_pem = std::move(*cert);
  *key_pem = std::move(*key);
  return absl::OkStatus();
}

// The server's check, run by gRPC's server auth filter on every call before
// the call reaches a service. State is shared by all of a server's
// connections.
class TokenProcessor {
 public:
  explicit TokenProcessor(std::string token)
      : expected_(absl::StrCat(kBearerPrefix, token)),
        limiter_(5, std::chrono::seconds(10)) {}

  static void Process(void* state, grpc_auth_context* /*context*/,
                      const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb cb, void* user_data) {
    auto* self = static_cast<TokenProcessor*>(state);
    const grpc_metadata* found = nullptr;
    for (size_t i = 0; i < num_md; ++i) {
      absl::string_view key(
          reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].key)),
          GRPC_SLICE_LENGTH(md[i].key));
      if (key == kAuthMetadataKey) {
        found = &md[i];
        break;
      }
    }
    if (found == nullptr) {
      self->Refuse("no token", cb, user_data);
      return;
    }
    absl::string_view value(
        reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(found->value)),
        GRPC_SLICE_LENGTH(found->value));
    if (!TokensEqual(value, self->expected_)) {
      self->Refuse("wrong token", cb, user_data);
      return;
    }
    // Consumed: handlers never see the token.
    cb(user_data, found, 1, nullptr, 0, GRPC_STATUS_OK, nullptr);
  }

  static void Destroy(void* state) { delete static_cast<TokenProcessor*>(state); }

 private:
  void Refuse(const char* why, grpc_process_auth_metadata_done_cb cb, void* user_data) {
    std::optional<uint64_t> log;
    {
      std::lock_guard<std::mutex> lock(mu_);
      log = limiter_.Allow(LogRateLimiter::Clock::now());
    }
    if (log) {
      if (*log > 0) {
        spdlog::warn("refused a call: {} ({} more refusals not logged)", why, *log);
      } else {
        spdlog::warn("refused a call: {}", why);
      }
    }
    const std::string message =
        absl::StrCat("meshrun rendezvous daemon: ", why,
                     " (set the shared token with --token-file, MESHRUN_RDZV_TOKEN or "
                     "MESHRUN_RDZV_TOKEN_FILE)");
    cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
  }

  const std::string expected_;
  std::mutex mu_;
  LogRateLimiter limiter_;  // guarded by mu_
};

// gRPC's C++ insecure credentials cannot take an auth metadata processor, so
// both kinds of server credentials are made with the C API and wrapped.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* creds) : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {
    // Not used: the token check is installed on creds_ directly.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  grpc_server_credentials* const creds_;
};

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthMetadataKey, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat(kBearerPrefix, token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(&header_);
  }

 private:
  // The channel owns its factories, so this outlives every call.
  const std::string header_;
};

}  // namespace

std::string ClientSecurity::Fingerprint() const {
  // Length-prefixed, so different settings never produce the same string.
  return absl::StrCat(token.size(), ":", token, tls_ca_pem.size(), ":", tls_ca_pem,
                      tls_cert_pem.size(), ":", tls_cert_pem, tls_key_pem);
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const ClientSecurityFiles& files,
                                                  const GetEnv& getenv_fn) {
  ClientSecurity security;
  auto token = files.token_file.empty() ? TokenFromEnvironment(getenv_fn)
                                        : ReadTokenFile(files.token_file);
  if (!token.ok()) return token.status();
  security.token = std::move(*token);
  if (!files.tls_cert.empty() && files.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls-cert needs --tls-ca (the daemon's CA)");
  }
  if (auto s = LoadTls(files.tls_cert, files.tls_key, "--tls-cert", "--tls-key",
                       &security.tls_cert_pem, &security.tls_key_pem);
      !s.ok()) {
    return s;
  }
  if (!files.tls_ca.empty()) {
    auto ca = ReadPemFile(files.tls_ca, "--tls-ca", kCertMarker);
    if (!ca.ok()) return ca.status();
    security.tls_ca_pem = std::move(*ca);
  }
  return security;
}

absl::StatusOr<ClientSecurity> ClientSecurityFromEnvironment(const GetEnv& getenv_fn) {
  auto path = [&](const char* name) {
    const char* value = getenv_fn(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  ClientSecurityFiles files;
  files.tls_ca = path(kTlsCaEnv);
  files.tls_cert = path(kTlsCertEnv);
  files.tls_key = path(kTlsKeyEnv);
  return LoadClientSecurity(files, getenv_fn);
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const ServerSecurityFiles& files,
                                                  const GetEnv& getenv_fn) {
  ServerSecurity security;
  auto token = files.token_file.empty() ? TokenFromEnvironment(getenv_fn)
                                        : ReadTokenFile(files.token_file);
  if (!token.ok()) return token.status();
  security.token = std::move(*token);
  if (auto s = LoadTls(files.tls_cert, files.tls_key, "--tls-cert", "--tls-key",
                       &security.tls_cert_pem, &security.tls_key_pem);
      !s.ok()) {
    return s;
  }
  if (!files.tls_client_ca.empty()) {
    if (!security.tls()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    auto ca = ReadPemFile(files.tls_client_ca, "--tls-client-ca", kCertMarker);
    if (!ca.ok()) return ca.status();
    security.tls_client_ca_pem = std::move(*ca);
  }
  return security;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const ServerSecurity& security) {
  if (!security.tls() && security.token.empty()) return grpc::InsecureServerCredentials();
  grpc_server_credentials* creds = nullptr;
  if (security.tls()) {
    grpc_ssl_pem_key_cert_pair pair{security.tls_key_pem.c_str(),
                                    security.tls_cert_pem.c_str()};
    const bool verify_clients = !security.tls_client_ca_pem.empty();
    creds = grpc_ssl_server_credentials_create_ex(
        verify_clients ? security.tls_client_ca_pem.c_str() : nullptr, &pair, 1,
        verify_clients ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        nullptr);
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  if (!security.token.empty()) {
    grpc_auth_metadata_processor processor{&TokenProcessor::Process,
                                           &TokenProcessor::Destroy,
                                           new TokenProcessor(security.token)};
    grpc_server_credentials_set_auth_metadata_processor(creds, processor);
  }
  return std::make_shared<CoreServerCredentials>(creds);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const ClientSecurity& security,
                                           const grpc::ChannelArguments& given_args) {
  const ChannelTarget resolved = ResolveChannelTarget(endpoint);
  const std::string& target = resolved.target;
  grpc::ChannelArguments args = given_args;
  if (!resolved.unresolved.empty()) {
    spdlog::warn("rendezvous endpoint list {}: {} did not resolve; left out", endpoint,
                 absl::StrJoin(resolved.unresolved, ", "));
  }
  // A sockaddr target names no host: check every replica's certificate
  // against the list's first host name.
  if (security.tls() && !resolved.tls_name.empty())
    args.SetSslTargetNameOverride(resolved.tls_name);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (security.tls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = security.tls_ca_pem;
    ssl.pem_private_key = security.tls_key_pem;
    ssl.pem_cert_chain = security.tls_cert_pem;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  if (security.token.empty()) return grpc::CreateCustomChannel(target, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args,
                                                                 std::move(interceptors));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const ClientSecurity& security) {
  return MakeChannel(endpoint, security, grpc::ChannelArguments());
}

}  // namespace meshrun::rdzv
