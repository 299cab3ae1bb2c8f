#include "agent/refusal_log.h"

#include <spdlog/spdlog.h>

namespace meshrun::agent {

RefusalLog::~RefusalLog() {
  if (count_ > kLogged) spdlog::warn("{}: refused {} in all", channel_, count_);
}

void RefusalLog::Refuse(const std::string& what) {
  ++count_;
  if (count_ > kLogged) return;
  spdlog::warn("{}: refused {}{}", channel_, what,
               count_ == kLogged ? " (further refusals are counted, not logged)" : "");
}

}  // namespace meshrun::agent
