#include "rendezvous/status/status_http.h"

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "rendezvous/status/metrics.h"

namespace meshrun::rdzv {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding of a query value ('+' is a space, as forms send it).
std::string Decode(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 &&
               HexValue(text[i + 2]) >= 0) {
      out.push_back(
          static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::string QueryValue(absl::string_view query, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(query, '&')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(pair, '=');
    if (kv.first == name) return Decode(kv.second);
  }
  return {};
}

HttpReply Text(int status, std::string body) {
  HttpReply reply;
  reply.status = status;
  reply.body = std::move(body);
  return reply;
}

}  // namespace

HttpReply RouteStatusRequest(const StatusRoutes& routes, const std::string& method,
                             const std::string& target) {
  absl::string_view path = target;
  absl::string_view query;
  if (size_t q = path.find('?'); q != absl::string_view::npos) {
    query = path.substr(q + 1);
    path = path.substr(0, q);
  }
  const bool known =
      path == "/" || path == "/index.html" || path == "/api/status" || path == "/metrics";
  if (!known) return Text(404, "not found; try /, /api/status or /metrics\n");
  if (method != "GET" && method != "HEAD") {
    HttpReply reply = Text(405, "method not allowed; use GET\n");
    reply.headers.emplace_back("Allow", "GET, HEAD");
    return reply;
  }
  if (path == "/metrics") {
    HttpReply reply = Text(200, routes.metrics_text());
    reply.content_type = kPrometheusContentType;
    return reply;
  }
  if (path == "/api/status") {
    const std::string run_id = QueryValue(query, "run");
    std::string body = routes.status_json(run_id);
    if (body.empty()) return Text(404, "the daemon knows no run " + run_id + "\n");
    HttpReply reply = Text(200, std::move(body));
    reply.content_type = "application/json";
    return reply;
  }
  HttpReply reply = Text(200, StatusPageHtml());
  reply.content_type = "text/html; charset=utf-8";
  // The page needs nothing from anywhere else; say so to the browser.
  reply.headers.emplace_back(
      "Content-Security-Policy",
      "default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'; connect-src 'self'; img-src data:");
  return reply;
}

}  // namespace meshrun::rdzv
