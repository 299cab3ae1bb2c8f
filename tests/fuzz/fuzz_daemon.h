#pragma once

// The real daemon (Store and Rendezvous services, validation, KvStore,
// RendezvousState) for the fuzz targets, in the fuzzer's process: reached
// through an in-process channel (no socket), or through one loopback
// connection for clients that watch connectivity (rdzv::StoreClient; gRPC's
// in-process channels do not support that). One daemon serves a whole
// fuzzing session; the sequence fuzzer gives each input its own prefix for
// run ids and namespaces so inputs do not see each other's state.

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "rendezvous/client/store_client.h"
#include "rendezvous/server/daemon.h"

namespace meshrun::fuzz {

struct FuzzDaemon {
  std::unique_ptr<rdzv::Daemon> daemon;
  std::shared_ptr<grpc::Channel> channel;           // in-process
  std::shared_ptr<grpc::Channel> loopback_channel;  // 127.0.0.1, one connection
  uint64_t inputs = 0;

  static FuzzDaemon& Get() {
    static FuzzDaemon* instance = [] {
      auto* self = new FuzzDaemon();
      rdzv::DaemonOptions options;
      options.host = "127.0.0.1";
      options.port = 0;
      // Small limits, so inputs reach them; short default waits, so a parked
      // request with timeout 0 ends quickly.
      options.store.limits.max_value_bytes = 1 << 20;
      options.store.limits.max_keys_per_namespace = 4096;
      options.store.limits.max_bytes_per_namespace = 16 << 20;
      options.store.limits.max_keys_per_request = 1024;
      options.store.default_timeout = std::chrono::milliseconds(20);
      options.max_message_bytes = 4 << 20;
      auto started = rdzv::Daemon::Start(options);
      if (!started.ok()) {
        std::fprintf(stderr, "fuzz: cannot start the daemon: %s\n",
                     std::string(started.status().message()).c_str());
        std::abort();
      }
      self->daemon = std::move(*started);
      self->channel = self->daemon->InProcessChannel();
      self->loopback_channel =
          rdzv::MakeStoreChannel(self->daemon->endpoint(), /*own_connection=*/true);
      return self;
    }();
    return *instance;
  }

  // A fresh prefix per input ("i17-").
  std::string NextPrefix() { return "i" + std::to_string(++inputs) + "-"; }
};

}  // namespace meshrun::fuzz
