#pragma once

// The values of meshrun's flags, parsed: pure, and each error message without
// the flag's name (launch_config.cc puts "--flag: " before it).

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/launch_config.h"

namespace meshrun::launcher {

// "expected <expected>, got '<text>'".
std::string Got(absl::string_view expected, absl::string_view text);

std::optional<int> ParseInt(absl::string_view text);
// Seconds as a decimal number, possibly fractional, kept to the millisecond.
std::optional<std::chrono::milliseconds> ParseSeconds(absl::string_view text);
// N or MIN:MAX.
std::optional<std::pair<int, int>> ParseNnodes(absl::string_view text);
// Letters, digits, '.', '-', '_'; ':' and '%' only in an IPv6 literal.
bool ValidHost(absl::string_view host, bool ipv6);
std::optional<int> ParsePort(absl::string_view text);
// "host", "host:port", "[v6]", "[v6]:port"; nullopt port when none given.
absl::StatusOr<std::pair<std::string, std::optional<int>>> ParseEndpoint(
    absl::string_view text);
// A comma-separated list of ParseEndpoint's forms: no empty entry, and no
// endpoint twice (an entry without a port counts as `default_port`).
absl::StatusOr<std::vector<std::pair<std::string, std::optional<int>>>> ParseEndpointList(
    absl::string_view text, int default_port);
// --rdzv-conf's K=V,... (torch's keys and spellings).
absl::StatusOr<RdzvConf> ParseRdzvConf(absl::string_view text);
// -r / -t: "3" for every rank, or "0:1,1:2".
std::optional<StdStreamsSpec> ParseStdStreams(absl::string_view text);
std::optional<std::set<int>> ParseLocalRanks(absl::string_view text);
// --signals-to-handle: names as in Python's signal module, no repeats.
absl::StatusOr<std::vector<int>> ParseSignals(absl::string_view text);
// --log-line-prefix-template: string.Template syntax, known names only.
absl::Status ValidatePrefixTemplate(absl::string_view text);

}  // namespace meshrun::launcher
