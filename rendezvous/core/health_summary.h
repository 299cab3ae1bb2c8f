#pragma once

// The one line that names a failed health check (--health-check), as the
// agent logs it and the daemon's status page shows it: the check, how it
// failed and the last line of its output. Pure.

#include <string>

#include "absl/strings/string_view.h"

namespace meshrun::rdzv {

// "health check 'CMD' failed (exit 1): <last line of output>".
std::string HealthSummary(absl::string_view check, absl::string_view outcome,
                          absl::string_view output);

}  // namespace meshrun::rdzv
