#pragma once

// Pipeline plans as plain data: which layers each stage holds, and the
// schedules, i.e. the: the ordered actions one stage performs in
// one training step (forward / backward of a microbatch, and the sends and
// receives that connect it to its neighbours). Pure: no tensors, no I/O; pp.h
// executes the list over a process group, and the unit tests simulate all
// stages at once to check matching and deadlock freedom.
//
// Communication model the schedules are built for (and pp.h implements):
// sends are posted without waiting (isend; completed at the end of the step),
// receives block until their message has arrived. Messages are matched by
// (peer, direction, microbatch), not by arrival order. Under that model every
// schedule here completes. With blocking (rendezvous) sends 1F1B would
// deadlock in its steady phase — stage s sends an activation downstream while
// stage s+1 sends a gradient upstream — which is why sends are not waited on.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

enum class Schedule {
  kGPipe,    // all forwards, then all backwards
  kOneFOneB  // warm-up forwards, then one forward / one backward, then cool-down
};

// "gpipe" / "1f1b".
std::string ScheduleName(Schedule schedule);
// Parses "gpipe" or "1f1b" (case-insensitive).
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);

enum class ActionKind {
  kRecvForward,   // receive microbatch m's activation from stage - 1
  kForward,       // run this stage's layers on microbatch m
  kSendForward,   // send microbatch m's output to stage + 1
  kRecvBackward,  // receive the gradient of microbatch m's output from stage + 1
  kBackward,      // backpropagate microbatch m through this stage
  kSendBackward,  // send the gradient of microbatch m's input to stage - 1
};

struct Action {
  ActionKind kind;
  int microbatch;

  bool operator==(const Action& other) const {
    return kind == other.kind && microbatch == other.microbatch;
  }
};

// "F3", "B0", "RF2" (recv forward), "SF2", "RB1", "SB1".
std::string ActionName(const Action& action);
// Actions joined by spaces.
std::string ActionsToString(const std::vector<Action>& actions);

// Checks `num_stages` >= 1, 0 <= stage < num_stages, `microbatches` >= 1,
// and for 1F1B microbatches >= num_stages ("1F1B needs at least 4
// microbatches for 4 stages, got 2"). INVALID_ARGUMENT otherwise.
absl::Status ValidateSchedule(Schedule schedule, int num_stages, int microbatches);

// What one stage brings to a step. Only the first stage sees the input batch
// and only the last the target, so a step the stages cannot all run is
// visible to some stages only; RunStep (pp.h) exchanges these between all
// stages before any activation is sent and has every stage judge all of them
// with ValidateStep, so that every stage refuses such a step with the same
// error instead of waiting for messages that will never come.
struct StepArgs {
  // Rows of a batch that is not a tensor of at least one dimension.
  static constexpr int64_t kNotABatch = -1;

  Schedule schedule = Schedule::kGPipe;
  int microbatches = 0;
  int64_t input_rows = kNotABatch;   // dim 0 of the input; read on the first stage
  int64_t target_rows = kNotABatch;  // dim 0 of the target; read on the last stage
  bool has_loss_fn = false;          // read on the last stage
};

// Judges one step from every stage's StepArgs (`stages[s]` from stage s):
// the stages agree on schedule and microbatches; ValidateSchedule; the first
// stage's input and the last stage's target split into `microbatches` equal
// row blocks ("pipeline input of 30 rows does not split into 4 equal
// microbatches"); the last stage has a loss function. The first failure as
// INVALID_ARGUMENT, the same on every stage given the same `stages`.
absl::Status ValidateStep(const std::vector<StepArgs>& stages);

// The actions of `stage` (of `num_stages`) for one step of `microbatches`.
// The first stage neither receives activations nor sends gradients; the last
// neither sends activations nor receives gradients.
//   GPipe:  [RF m, F m, SF m] for m = 0..M-1, then [RB m, B m, SB m] for m = 0..M-1.
//   1F1B:   W = num_stages - stage - 1 warm-up forwards; then M - W rounds of
//           [RF, F, SF of the next forward; RB, B, SB of the oldest pending
//           backward]; then the W remaining backwards.
absl::StatusOr<std::vector<Action>> StageActions(Schedule schedule, int num_stages,
                                                 int stage, int microbatches);

// Stage boundaries of a model of `layer_weights.size()` layers over
// `num_stages` stages: num_stages + 1 indices 0 = b0 < b1 < ... = #layers,
// stage s holding layers [b_s, b_{s+1}).
//  - `split_points` given: they are b1..b_{num_stages-1} (strictly increasing,
//    inside (0, #layers)).
//  - otherwise balanced by weight (parameter count): each layer with weight
//    opens a block that the weightless layers after it (activations) join,
//    and the blocks are split into contiguous stages minimising the heaviest
//    stage (ties: the earliest cut). Needs at least num_stages weighted layers.
// Deterministic: every rank computes the same plan from the same model.
absl::StatusOr<std::vector<int>> StageBoundaries(
    const std::vector<int64_t>& layer_weights, int num_stages,
    const std::vector<int>& split_points = {});

}  // namespace meshrun::worker::parallel
