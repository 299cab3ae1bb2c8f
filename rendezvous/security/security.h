#pragma once

// Authentication and TLS of the rendezvous daemon's gRPC traffic.
//
// Server: with a token configured, every call of every service (present and
// future: the check sits in gRPC's transport, before any handler runs) must
// carry `authorization: Bearer <token>`; anything else is answered
// UNAUTHENTICATED and logged, rate-limited. With a certificate and key the
// server speaks TLS only; with a client CA it also requires and verifies
// client certificates.
//
// Client: a channel made by MakeChannel() sends the token on every call and
// speaks TLS when a CA is given.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/security/auth.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ServerCredentials;
}  // namespace grpc

namespace meshrun::rdzv {

struct ServerSecurity {
  std::string token;         // empty: calls need no token
  std::string tls_cert_pem;  // with tls_key_pem: serve TLS only
  std::string tls_key_pem;
  std::string tls_client_ca_pem;  // non-empty: require verified client certs

  bool tls() const { return !tls_cert_pem.empty(); }
};

struct ClientSecurity {
  std::string token;         // empty: send none
  std::string tls_ca_pem;    // non-empty: TLS, trusting this CA
  std::string tls_cert_pem;  // optional client certificate and key
  std::string tls_key_pem;

  bool tls() const { return !tls_ca_pem.empty(); }
  // Tells configurations apart exactly (for caches keyed by target).
  std::string Fingerprint() const;
};

// Paths and token source as given on a command line or in the environment.
struct ClientSecurityFiles {
  std::string token_file;  // --token-file
  std::string tls_ca;      // --tls-ca
  std::string tls_cert;    // --tls-cert
  std::string tls_key;     // --tls-key
};

// Loads the files. The token comes from `token_file` when set, else from the
// environment (TokenFromEnvironment). A cert without a key (or the reverse),
// or a client cert without a CA, is refused.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const ClientSecurityFiles& files,
                                                  const GetEnv& getenv_fn);
// Everything from the environment: MESHRUN_RDZV_TOKEN(_FILE) and
// MESHRUN_RDZV_TLS_{CA,CERT,KEY} (paths); what workers use.
absl::StatusOr<ClientSecurity> ClientSecurityFromEnvironment(const GetEnv& getenv_fn);

struct ServerSecurityFiles {
  std::string token_file;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
};
absl::StatusOr<ServerSecurity> LoadServerSecurity(const ServerSecurityFiles& files,
                                                  const GetEnv& getenv_fn);

// Credentials for ServerBuilder::AddListeningPort. Errors (rate-limited) go
// to spdlog's default logger.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const ServerSecurity& security);

// A channel to the daemon at `endpoint` ("host:port", any gRPC target, or a
// list of replicas "h1:p1,h2:p2": rendezvous/client/endpoint_list.h, which
// resolves a list's host names now) that authenticates every call as
// `security` says. With TLS, every replica of a list must hold a certificate
// valid for the list's first host name.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const ClientSecurity& security,
                                           const grpc::ChannelArguments& args);
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const ClientSecurity& security);

}  // namespace meshrun::rdzv
