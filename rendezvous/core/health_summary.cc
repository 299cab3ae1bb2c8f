#include "rendezvous/core/health_summary.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace meshrun::rdzv {

std::string HealthSummary(absl::string_view check, absl::string_view outcome,
                          absl::string_view output) {
  absl::string_view last = absl::StripTrailingAsciiWhitespace(output);
  if (size_t newline = last.rfind('\n'); newline != absl::string_view::npos)
    last = last.substr(newline + 1);
  return absl::StrCat("health check '", check, "' failed (", outcome, ")",
                      last.empty() ? "" : ": ", last);
}

}  // namespace meshrun::rdzv
