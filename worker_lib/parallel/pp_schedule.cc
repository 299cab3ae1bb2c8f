#include "worker_lib/parallel/pp_schedule.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::worker::parallel {

std::string ScheduleName(Schedule schedule) {
  switch (schedule) {
    case Schedule::kGPipe:
      return "gpipe";
    case Schedule::kOneFOneB:
      return "1f1b";
    case Schedule::kInterleaved1F1B:
      return "interleaved";
  }
  return "unknown";
}

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "gpipe") return Schedule::kGPipe;
  if (lower == "1f1b") return Schedule::kOneFOneB;
  if (lower == "interleaved" || lower == "interleaved1f1b")
    return Schedule::kInterleaved1F1B;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown pipeline schedule '", name, "' (expected gpipe, 1f1b or interleaved)"));
}

std::string ActionName(const Action& action) {
  // Indexed by ActionKind.
  static constexpr const char* kPrefixes[] = {"RF", "F", "SF", "RB", "B", "SB"};
  std::string name =
      absl::StrCat(kPrefixes[static_cast<int>(action.kind)], action.microbatch);
  if (action.chunk != 0) absl::StrAppend(&name, ".", action.chunk);
  return name;
}

std::string ActionsToString(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ", [](std::string* out, const Action& action) {
    out->append(ActionName(action));
  });
}

absl::Status ValidateSchedule(Schedule schedule, int num_stages, int microbatches,
                              int virtual_stages) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline needs at least 1 stage, got ", num_stages));
  }
  if (microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline step needs at least 1 microbatch, got ", microbatches));
  }
  if (schedule != Schedule::kInterleaved1F1B) {
    if (virtual_stages != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          ScheduleName(schedule), " runs one stage per pipeline rank; ", virtual_stages,
          " virtual stages per rank need the interleaved schedule"));
    }
    if (schedule == Schedule::kOneFOneB && microbatches < num_stages) {
      return absl::InvalidArgumentError(absl::StrCat("1F1B needs at least ", num_stages,
                                                     " microbatches for ", num_stages,
                                                     " stages, got ", microbatches));
    }
    return absl::OkStatus();
  }
  if (virtual_stages < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved 1F1B needs at least 2 virtual stages per pipeline rank, got ",
        virtual_stages, " (with one, use 1f1b)"));
  }
  if (num_stages < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved 1F1B needs at least 2 pipeline ranks, got ", num_stages));
  }
  const int rounds = std::max(1, microbatches / num_stages);
  if (microbatches % rounds != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved 1F1B needs the microbatches to be a multiple of its number of "
        "rounds, max(1, ",
        microbatches, " / ", num_stages, ") = ", rounds, "; got ", microbatches));
  }
  return absl::OkStatus();
}

namespace {

// The first failure of `what`'s batch of `rows` rows split into `microbatches`.
absl::Status ValidateBatch(const std::string& what, int64_t rows, int microbatches) {
  if (rows == StepArgs::kNotABatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline ", what, " must be a tensor of at least 1 dimension"));
  }
  if (rows == 0 || rows % microbatches != 0) {  // 0 rows: no microbatch to run
    return absl::InvalidArgumentError(absl::StrCat("pipeline ", what, " of ", rows,
                                                   " rows does not split into ",
                                                   microbatches, " equal microbatches"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStep(const std::vector<StepArgs>& stages) {
  if (stages.empty()) return absl::InvalidArgumentError("a pipeline step needs a stage");
  const StepArgs& first = stages.front();
  const StepArgs& last = stages.back();
  // "gpipe with 4 microbatches", "interleaved with 4 microbatches x 2 chunks"
  // (the unit given once, on stage 0's).
  auto runs = [](const StepArgs& args, bool units) {
    std::string text = absl::StrCat(ScheduleName(args.schedule), " with ",
                                    args.microbatches, units ? " microbatches" : "");
    if (args.virtual_stages != 1)
      absl::StrAppend(&text, " x ", args.virtual_stages, " chunks");
    return text;
  };
  for (size_t s = 1; s < stages.size(); ++s) {
    if (stages[s].schedule != first.schedule ||
        stages[s].microbatches != first.microbatches ||
        stages[s].virtual_stages != first.virtual_stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline stages disagree on the step: stage 0 runs ", runs(first, true),
          ", stage ", s, " ", runs(stages[s], false),
          "; every stage must call RunStep with the same schedule and microbatches"));
    }
  }
  const int num_stages = static_cast<int>(stages.size());
  if (absl::Status status = ValidateSchedule(first.schedule, num_stages,
                                             first.microbatches, first.virtual_stages);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateBatch("input", first.input_rows, first.microbatches);
      !status.ok()) {
    return status;
  }
  if (!last.has_loss_fn)
    return absl::InvalidArgumentError("pipeline RunStep: no loss function");
  return ValidateBatch("target", last.target_rows, first.microbatches);
}

namespace {

// Appends a rank's computations with the communication around them.
class Builder {
 public:
  // Global stages: chunk c of this rank is c * pp + rank, of pp * chunks.
  Builder(int pp, int rank, int chunks) : pp_(pp), rank_(rank), last_(pp * chunks - 1) {}

  void Forward(int m, int chunk = 0) {
    const int stage = chunk * pp_ + rank_;
    if (stage != 0) actions_.push_back({ActionKind::kRecvForward, m, chunk});
    actions_.push_back({ActionKind::kForward, m, chunk});
    if (stage != last_) actions_.push_back({ActionKind::kSendForward, m, chunk});
  }
  void Backward(int m, int chunk = 0) {
    const int stage = chunk * pp_ + rank_;
    if (stage != last_) actions_.push_back({ActionKind::kRecvBackward, m, chunk});
    actions_.push_back({ActionKind::kBackward, m, chunk});
    if (stage != 0) actions_.push_back({ActionKind::kSendBackward, m, chunk});
  }
  std::vector<Action> Take() { return std::move(actions_); }

 private:
  int pp_;
  int rank_;
  int last_;
  std::vector<Action> actions_;
};

// Interleaved 1F1B's order (RankActions in the header), after torch 2.15's
// ScheduleInterleaved1F1B: the rank's j-th forward and k-th backward go
// through the chunks in blocks of `per_round` microbatches, forwards from the
// first chunk up, backwards from the last chunk down; the warm-up is what
// keeps the ranks' 1F1B phases aligned (rank r's first backward can only
// come once the microbatch has gone through every later stage and back).
std::vector<Action> InterleavedActions(int pp, int rank, int chunks, int microbatches) {
  const int rounds = std::max(1, microbatches / pp);
  const int per_round = microbatches / rounds;
  const int computations = microbatches * chunks;  // forwards, and backwards
  const int warmup =
      std::min((chunks - 1) * per_round + 2 * (pp - 1 - rank), computations);
  std::vector<int> next_forward(chunks, 0);  // per chunk: its next microbatch
  std::vector<int> next_backward(chunks, 0);
  Builder builder(pp, rank, chunks);
  auto forward = [&](int j) {
    const int chunk = (j / per_round) % chunks;
    builder.Forward(next_forward[chunk]++, chunk);
  };
  auto backward = [&](int k) {
    const int chunk = chunks - 1 - (k / per_round) % chunks;
    builder.Backward(next_backward[chunk]++, chunk);
  };
  for (int j = 0; j < warmup; ++j) forward(j);
  for (int k = 0; k < computations - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  for (int k = computations - warmup; k < computations; ++k) backward(k);
  return builder.Take();
}

}  // namespace

absl::StatusOr<std::vector<Action>> StageActions(Schedule schedule, int num_stages,
                                                 int stage, int microbatches) {
  if (schedule == Schedule::kInterleaved1F1B) {
    return absl::InvalidArgumentError(
        "StageActions plans one stage per rank; interleaved 1F1B needs RankActions");
  }
  if (absl::Status status = ValidateSchedule(schedule, num_stages, microbatches);
      !status.ok()) {
    return status;
  }
  if (stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline stage ", stage, " out of range for ", num_stages, " stages"));
  }
  Builder builder(num_stages, stage, 1);
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

absl::StatusOr<std::vector<Action>> RankActions(Schedule schedule, int pp, int rank,
                                                int virtual_stages, int microbatches) {
  if (absl::Status status = ValidateSchedule(schedule, pp, microbatches, virtual_stages);
      !status.ok()) {
    return status;
  }
  if (schedule != Schedule::kInterleaved1F1B)
    return StageActions(schedule, pp, rank, microbatches);
  if (rank < 0 || rank >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline rank ", rank, " out of range for ", pp, " ranks"));
  }
  return InterleavedActions(pp, rank, virtual_stages, microbatches);
}

absl::StatusOr<std::vector<std::pair<int, int>>> CutParts(int parts, int stages) {
  if (stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline needs at least 1 stage, got ", stages));
  }
  if (parts < stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot cut a model of ", parts, " parts into ", stages, " pipeline stages"));
  }
  std::vector<std::pair<int, int>> cut;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int count = parts / stages + (s < parts % stages ? 1 : 0);
    cut.emplace_back(first, first + count - 1);
    first += count;
  }
  return cut;
}

}  // namespace meshrun::worker::parallel
