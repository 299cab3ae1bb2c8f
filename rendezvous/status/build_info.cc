#include "rendezvous/status/build_info.h"

namespace meshrun::rdzv {

std::string VersionLine(const std::string& program) {
  const BuildInfo info = GetBuildInfo();
  return program + " " + info.version + " (commit " + info.commit + ")";
}

}  // namespace meshrun::rdzv
