#include "worker_lib/parallel/pp_schedule.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::worker::parallel {

std::string ScheduleName(Schedule schedule) {
  return schedule == Schedule::kGPipe ? "gpipe" : "1f1b";
}

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "gpipe") return Schedule::kGPipe;
  if (lower == "1f1b") return Schedule::kOneFOneB;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown pipeline schedule '", name, "' (expected gpipe or 1f1b)"));
}

std::string ActionName(const Action& action) {
  // Indexed by ActionKind.
  static constexpr const char* kPrefixes[] = {"RF", "F", "SF", "RB", "B", "SB"};
  return absl::StrCat(kPrefixes[static_cast<int>(action.kind)], action.microbatch);
}

std::string ActionsToString(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ", [](std::string* out, const Action& action) {
    out->append(ActionName(action));
  });
}

absl::Status ValidateSchedule(Schedule schedule, int num_stages, int microbatches) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline needs at least 1 stage, got ", num_stages));
  }
  if (microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline step needs at least 1 microbatch, got ", microbatches));
  }
  if (schedule == Schedule::kOneFOneB && microbatches < num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("1F1B needs at least ", num_stages,
                                                   " microbatches for ", num_stages,
                                                   " stages, got ", microbatches));
  }
  return absl::OkStatus();
}

namespace {

class Builder {
 public:
  Builder(int num_stages, int stage)
      : first_(stage == 0), last_(stage == num_stages - 1) {}

  void Forward(int m) {
    if (!first_) actions_.push_back({ActionKind::kRecvForward, m});
    actions_.push_back({ActionKind::kForward, m});
    if (!last_) actions_.push_back({ActionKind::kSendForward, m});
  }
  void Backward(int m) {
    if (!last_) actions_.push_back({ActionKind::kRecvBackward, m});
    actions_.push_back({ActionKind::kBackward, m});
    if (!first_) actions_.push_back({ActionKind::kSendBackward, m});
  }
  std::vector<Action> Take() { return std::move(actions_); }

 private:
  bool first_;
  bool last_;
  std::vector<Action> actions_;
};

}  // namespace

absl::StatusOr<std::vector<Action>> StageActions(Schedule schedule, int num_stages,
                                                 int stage, int microbatches) {
  if (absl::Status status = ValidateSchedule(schedule, num_stages, microbatches);
      !status.ok()) {
    return status;
  }
  if (stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline stage ", stage, " out of range for ", num_stages, " stages"));
  }
  Builder builder(num_stages, stage);
  if (schedule == Schedule::kGPipe) {
    for (int m = 0; m < microbatches; ++m) builder.Forward(m);
    for (int m = 0; m < microbatches; ++m) builder.Backward(m);
    return builder.Take();
  }
  // 1F1B (PipeDream-Flush, as Megatron-LM): stage s keeps at most
  // num_stages - s microbatches in flight.
  const int warmup = std::min(num_stages - stage - 1, microbatches);
  for (int m = 0; m < warmup; ++m) builder.Forward(m);
  for (int i = 0; i < microbatches - warmup; ++i) {
    builder.Forward(warmup + i);
    builder.Backward(i);
  }
  for (int m = microbatches - warmup; m < microbatches; ++m) builder.Backward(m);
  return builder.Take();
}

}  // namespace meshrun::worker::parallel
