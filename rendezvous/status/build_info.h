#pragma once

// The version and git commit this build was made from: what `meshrun
// --version`, `meshrun-rdzvd --version`, /metrics (meshrun_build_info) and
// the status page show. The definition is generated at build time
// (cmake/MeshrunBuildInfo.cmake).

#include <string>

namespace meshrun::rdzv {

struct BuildInfo {
  const char* version;  // the project's, e.g. "0.1.0"
  // `git describe` of the source tree: 12 hex digits, "-dirty" with
  // uncommitted changes; "unknown" when built outside a git checkout.
  const char* commit;
};

BuildInfo GetBuildInfo();

// "PROGRAM VERSION (commit COMMIT)", the first line of --version.
std::string VersionLine(const std::string& program);

}  // namespace meshrun::rdzv
