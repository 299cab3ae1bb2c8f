#include "agent/file_timer.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace meshrun::agent {

absl::StatusOr<TimerRequest> ParseTimerRequest(std::string_view line) {
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(line, &root).ok())
    return absl::InvalidArgumentError("not a JSON object");
  const auto& fields = root.fields();
  auto number = [&](const char* name) -> absl::StatusOr<double> {
    auto it = fields.find(name);
    if (it == fields.end() || !it->second.has_number_value())
      return absl::InvalidArgumentError(absl::StrCat("no number \"", name, "\""));
    return it->second.number_value();
  };
  auto integer = [&](const char* name, double low,
                     double high) -> absl::StatusOr<double> {
    absl::StatusOr<double> value = number(name);
    if (!value.ok()) return value;
    if (*value != std::floor(*value) || *value < low || *value > high)
      return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is ", *value,
                                                     ", not a whole number in [", low,
                                                     ", ", high, "]"));
    return value;
  };
  TimerRequest request;
  absl::StatusOr<double> pid = integer("pid", 1, std::numeric_limits<pid_t>::max());
  if (!pid.ok()) return pid.status();
  request.pid = static_cast<pid_t>(*pid);
  absl::StatusOr<double> expiration = number("expiration_time");
  if (!expiration.ok()) return expiration.status();
  request.expiration_time = *expiration;
  absl::StatusOr<double> signal = integer("signal", -64, 64);
  if (!signal.ok()) return signal.status();
  request.signal = static_cast<int>(*signal);
  auto scope = fields.find("scope_id");
  if (scope == fields.end() || !scope->second.has_string_value())
    return absl::InvalidArgumentError("no string \"scope_id\"");
  request.scope_id = scope->second.string_value();
  return request;
}

void TimerTable::Apply(const TimerRequest& request) {
  auto key = std::make_pair(request.pid, request.scope_id);
  if (request.release()) {
    timers_.erase(key);
  } else {
    timers_[key] = request;
  }
}

std::vector<ExpiredWorker> TimerTable::TakeExpired(double now) {
  // pid -> its expired timers
  std::map<pid_t, std::vector<const TimerRequest*>> expired;
  for (const auto& [key, timer] : timers_) {
    if (timer.expiration_time <= now) expired[key.first].push_back(&timer);
  }
  std::vector<ExpiredWorker> out;
  for (auto& [pid, timers] : expired) {
    std::sort(timers.begin(), timers.end(),
              [](const TimerRequest* a, const TimerRequest* b) {
                return a->expiration_time < b->expiration_time;
              });
    auto with_signal = std::find_if(timers.begin(), timers.end(),
                                    [](const TimerRequest* t) { return t->signal > 0; });
    const TimerRequest* chosen =
        with_signal != timers.end() ? *with_signal : timers.front();
    out.push_back({pid, chosen->scope_id, chosen->expiration_time,
                   now - chosen->expiration_time,
                   with_signal != timers.end() ? chosen->signal : 0});
  }
  for (const ExpiredWorker& worker : out) Forget(worker.pid);
  std::sort(out.begin(), out.end(), [](const ExpiredWorker& a, const ExpiredWorker& b) {
    return a.expiration_time < b.expiration_time;
  });
  return out;
}

void TimerTable::Forget(pid_t pid) {
  auto it = timers_.lower_bound({pid, std::string()});
  while (it != timers_.end() && it->first.first == pid) it = timers_.erase(it);
}

std::optional<double> TimerTable::NextExpiration() const {
  std::optional<double> next;
  for (const auto& [key, timer] : timers_) {
    if (!next || timer.expiration_time < *next) next = timer.expiration_time;
  }
  return next;
}

}  // namespace meshrun::agent
