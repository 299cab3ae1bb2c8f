#pragma once

// The routes of the daemon's HTTP port, apart from the server: which path
// and method get what. Pure; the daemon supplies the bodies.
//
//   GET /            the status page (HTML + JS, no external resources)
//   GET /api/status  the StatusSnapshot as JSON (?run=ID for one run)
//   GET /metrics     Prometheus text
// HEAD works wherever GET does; other methods get 405, other paths 404.

#include <functional>
#include <string>

#include "rendezvous/status/http_server.h"

namespace meshrun::rdzv {

struct StatusRoutes {
  std::function<std::string()> metrics_text;
  // The run id is empty for every run; nullopt-like "" body means unknown run.
  std::function<std::string(const std::string& run_id)> status_json;
};

HttpReply RouteStatusRequest(const StatusRoutes& routes, const std::string& method,
                             const std::string& target);

// The page served at /: self-contained HTML, CSS and JS.
const std::string& StatusPageHtml();

}  // namespace meshrun::rdzv
