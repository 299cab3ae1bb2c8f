// The launcher's value parsers (launcher/value_parsers.h).

#include "launcher/value_parsers.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <csignal>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace meshrun::launcher {

namespace {

// Larger second counts are typos, and would overflow milliseconds in int64.
constexpr double kMaxSeconds = 1e9;
constexpr int kMaxPort = 65535;

constexpr absl::string_view kRdzvConfKeys[] = {
    "cas_backoff_max_seconds",
    "close_timeout",
    "is_host",
    "join_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "last_call_timeout",
    "read_timeout",
    "store_type",
    "timeout",
};

absl::StatusOr<bool> ParseBool(absl::string_view key, absl::string_view text) {
  // torch's RendezvousParameters.get_as_bool spellings.
  std::string lower = absl::AsciiStrToLower(text);
  for (absl::string_view yes : {"1", "true", "t", "yes", "y"}) {
    if (lower == yes) return true;
  }
  for (absl::string_view no : {"0", "false", "f", "no", "n"}) {
    if (lower == no) return false;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": ", Got("a boolean (1/0, true/false, yes/no)", text)));
}

struct SignalName {
  absl::string_view name;
  int number;
};

// The signals a launcher can sensibly forward. SIGCHLD, SIGPIPE and the like
// are the agent's own business.
const SignalName kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
    {"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
    {"SIGALRM", SIGALRM}, {"SIGXCPU", SIGXCPU}, {"SIGCONT", SIGCONT},
};

constexpr absl::string_view kPrefixPlaceholders[] = {"role_name", "rank", "local_rank",
                                                     "hostname", "host"};

}  // namespace

std::string Got(absl::string_view expected, absl::string_view text) {
  return absl::StrCat("expected ", expected, ", got '", text, "'");
}

std::optional<int> ParseInt(absl::string_view text) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// Seconds as a decimal number, possibly fractional, kept to the millisecond.
std::optional<std::chrono::milliseconds> ParseSeconds(absl::string_view text) {
  double seconds = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) ||
      seconds < 0 || seconds > kMaxSeconds) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

std::optional<std::pair<int, int>> ParseNnodes(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() > 2) return std::nullopt;
  std::optional<int> min = ParseInt(parts[0]);
  std::optional<int> max = parts.size() == 2 ? ParseInt(parts[1]) : min;
  if (!min || !max || *min < 1 || *min > *max) return std::nullopt;
  return std::make_pair(*min, *max);
}

// Letters, digits, '.', '-', '_' (torch's hostname rule); ':' and '%' (zone)
// only inside brackets, where they belong to an IPv6 literal.
bool ValidHost(absl::string_view host, bool ipv6) {
  if (host.empty()) return false;
  return std::all_of(host.begin(), host.end(), [ipv6](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
           c == '_' || (ipv6 && (c == ':' || c == '%'));
  });
}

std::optional<int> ParsePort(absl::string_view text) {
  if (text.empty() || text.size() > 5) return std::nullopt;
  std::optional<int> port = ParseInt(text);
  if (!port || *port < 0 || *port > kMaxPort || text[0] == '-' || text[0] == '+') {
    return std::nullopt;
  }
  return port;
}

// "host", "host:port", "[v6]", "[v6]:port". nullopt port when none given.
absl::StatusOr<std::pair<std::string, std::optional<int>>> ParseEndpoint(
    absl::string_view text) {
  const std::string kExpected = "HOST[:PORT] with PORT in 0..65535, IPv6 as [ADDR]:PORT";
  absl::string_view host = text;
  std::optional<absl::string_view> port_text;
  bool ipv6 = false;
  if (absl::StartsWith(text, "[")) {
    size_t close = text.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(Got(kExpected, text));
    }
    host = text.substr(1, close - 1);
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return absl::InvalidArgumentError(Got(kExpected, text));
      port_text = rest.substr(1);
    }
    ipv6 = true;
  } else {
    size_t colons = std::count(text.begin(), text.end(), ':');
    if (colons > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(Got(kExpected, text), " (put IPv6 addresses in brackets)"));
    }
    if (colons == 1) {
      size_t colon = text.find(':');
      host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
    }
  }
  if (!ValidHost(host, ipv6)) return absl::InvalidArgumentError(Got(kExpected, text));
  std::optional<int> port;
  if (port_text.has_value()) {
    port = ParsePort(*port_text);
    if (!port) return absl::InvalidArgumentError(Got(kExpected, text));
  }
  return std::make_pair(std::string(host), port);
}

absl::StatusOr<std::vector<std::pair<std::string, std::optional<int>>>> ParseEndpointList(
    absl::string_view text, int default_port) {
  std::vector<std::pair<std::string, std::optional<int>>> endpoints;
  std::vector<std::pair<std::string, int>> seen;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty entry in the endpoint list '", text, "'"));
    }
    auto parsed = ParseEndpoint(entry);
    if (!parsed.ok()) return parsed.status();
    std::pair<std::string, int> key{parsed->first, parsed->second.value_or(default_port)};
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", entry, "' appears twice in the endpoint list '", text, "'"));
    }
    seen.push_back(std::move(key));
    endpoints.push_back(*std::move(parsed));
  }
  return endpoints;
}

absl::StatusOr<RdzvConf> ParseRdzvConf(absl::string_view text) {
  RdzvConf conf;
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return conf;
  bool saw_timeout = false, saw_join_timeout = false;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (key.empty()) {
      return absl::InvalidArgumentError(Got("KEY=VALUE,KEY=VALUE,...", text));
    }
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", key, "' needs a value"));
    }
    auto seconds = [&](std::chrono::milliseconds* field) -> absl::Status {
      std::optional<std::chrono::milliseconds> parsed = ParseSeconds(value);
      if (!parsed || parsed->count() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": ", Got("a positive number of seconds", value)));
      }
      *field = *parsed;
      return absl::OkStatus();
    };
    absl::Status status;
    if (key == "join_timeout" || key == "timeout") {
      (key == "timeout" ? saw_timeout : saw_join_timeout) = true;
      status = seconds(&conf.join_timeout);
    } else if (key == "last_call_timeout") {
      status = seconds(&conf.last_call_timeout);
    } else if (key == "close_timeout") {
      status = seconds(&conf.close_timeout);
    } else if (key == "keep_alive_interval") {
      status = seconds(&conf.keep_alive_interval);
    } else if (key == "read_timeout") {
      status = seconds(&conf.read_timeout);
    } else if (key == "keep_alive_max_attempt") {
      std::optional<int> attempts = ParseInt(value);
      if (!attempts || *attempts < 1) {
        status = absl::InvalidArgumentError(
            absl::StrCat(key, ": ", Got("an integer >= 1", value)));
      } else {
        conf.keep_alive_max_attempt = *attempts;
      }
    } else if (key == "cas_backoff_max_seconds") {
      // torch's c10d backend waits this long after a lost compare-and-set;
      // the daemon joins nodes server-side, so no agent ever loses one.
      if (!ParseSeconds(value)) {
        status = absl::InvalidArgumentError(
            absl::StrCat(key, ": ", Got("a non-negative number of seconds", value)));
      }
    } else if (key == "store_type") {
      if (absl::AsciiStrToLower(value) != "tcp") {
        status = absl::InvalidArgumentError(absl::StrCat(
            key,
            ": meshrun's rendezvous is its daemon over TCP, so only 'tcp' is "
            "accepted, got '",
            value, "'"));
      }
    } else if (key == "is_host") {
      absl::StatusOr<bool> is_host = ParseBool(key, value);
      if (is_host.ok()) conf.is_host = *is_host;
      status = is_host.status();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", key, "'; valid keys: ", absl::StrJoin(kRdzvConfKeys, ", ")));
    }
    if (!status.ok()) return status;
  }
  if (saw_timeout && saw_join_timeout) {
    return absl::InvalidArgumentError(
        "'timeout' and 'join_timeout' are the same setting; give one");
  }
  return conf;
}

// torchrun's Std.from_str, except that local ranks may have several digits
// (torch's regex takes one, so "10:1" fails there for no good reason).
std::optional<StdStreamsSpec> ParseStdStreams(absl::string_view text) {
  auto stream = [](absl::string_view s) -> std::optional<StdStreams> {
    if (s.size() != 1 || s[0] < '0' || s[0] > '3') return std::nullopt;
    return static_cast<StdStreams>(s[0] - '0');
  };
  StdStreamsSpec spec;
  if (text.find(':') == absl::string_view::npos) {
    std::optional<StdStreams> all = stream(text);
    if (!all) return std::nullopt;
    spec.all_ranks = *all;
    return spec;
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    if (kv.size() != 2) return std::nullopt;
    std::optional<int> local_rank = ParseInt(kv[0]);
    std::optional<StdStreams> value = stream(kv[1]);
    if (!local_rank || *local_rank < 0 || !value) return std::nullopt;
    spec.by_local_rank[*local_rank] = *value;
  }
  return spec;
}

std::optional<std::set<int>> ParseLocalRanks(absl::string_view text) {
  std::set<int> ranks;
  if (absl::StripAsciiWhitespace(text).empty()) return ranks;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::optional<int> rank = ParseInt(absl::StripAsciiWhitespace(item));
    if (!rank || *rank < 0) return std::nullopt;
    ranks.insert(*rank);
  }
  return ranks;
}

// Names as in Python's signal module; "TERM" and lower case are forgiven.
absl::StatusOr<std::vector<int>> ParseSignals(absl::string_view text) {
  std::vector<int> numbers;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(item));
    if (!absl::StartsWith(name, "SIG")) name = absl::StrCat("SIG", name);
    if (name == "SIGKILL" || name == "SIGSTOP") {
      return absl::InvalidArgumentError(absl::StrCat(name, " cannot be caught"));
    }
    auto it = std::find_if(std::begin(kSignals), std::end(kSignals),
                           [&](const SignalName& s) { return s.name == name; });
    if (it == std::end(kSignals)) {
      std::vector<absl::string_view> valid;
      for (const SignalName& s : kSignals) valid.push_back(s.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown signal '", item, "'; valid: ", absl::StrJoin(valid, ",")));
    }
    if (std::find(numbers.begin(), numbers.end(), it->number) == numbers.end()) {
      numbers.push_back(it->number);
    }
  }
  return numbers;
}

// Python string.Template syntax as torch uses it ($$, $name, ${name}), but an
// unknown name is an error here: safe_substitute would print it literally on
// every line, which is never what was meant.
absl::Status ValidatePrefixTemplate(absl::string_view text) {
  auto known = [](absl::string_view name) {
    return std::find(std::begin(kPrefixPlaceholders), std::end(kPrefixPlaceholders),
                     name) != std::end(kPrefixPlaceholders);
  };
  auto ident_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) continue;
    char next = text[i + 1];
    absl::string_view name;
    if (next == '$') {
      ++i;
      continue;
    } else if (next == '{') {
      size_t close = text.find('}', i + 2);
      if (close == absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("unclosed '${' in '", text, "'"));
      }
      name = text.substr(i + 2, close - i - 2);
      i = close;
    } else if (std::isalpha(static_cast<unsigned char>(next)) || next == '_') {
      size_t end = i + 1;
      while (end < text.size() && ident_char(text[end])) ++end;
      name = text.substr(i + 1, end - i - 1);
      i = end - 1;
    } else {
      continue;  // a lone '$' stays literal, as with safe_substitute
    }
    if (!known(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown placeholder '", name, "' in '", text,
                       "'; valid: ${role_name}, ${rank}, ${local_rank}, ${hostname}, "
                       "${host}"));
    }
  }
  return absl::OkStatus();
}

}  // namespace meshrun::launcher
