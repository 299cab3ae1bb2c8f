#pragma once

// Pipeline plans as plain data: which parts of a model each stage holds, and the
// schedules, i.e. the ordered actions one pipeline rank performs in one
// training step (forward / backward of a microbatch, and the sends and
// receives that connect it to its neighbours). Pure: no tensors, no I/O; pp.h
// executes the list over a process group, and the unit tests simulate all
// ranks at once to check matching and deadlock freedom.
//
// Stages and ranks. GPipe and 1F1B run one stage per rank (stage = rank in
// the pp group). Interleaved 1F1B runs V > 1 "virtual stages" (chunks) per
// rank: a model cut into pp * V stages, chunk c of rank r holding global
// stage c * pp + r (round robin, as torch.distributed.pipelining assigns
// them), so activations travel rank 0 -> 1 -> ... -> pp-1 -> 0 (next chunk)
// -> ... and gradients the opposite way. An action names its chunk (always
// 0 for GPipe and 1F1B).
//
// Communication model the schedules are built for (and pp.h implements):
// sends are posted without waiting (isend; completed at the end of the step),
// receives block until their message has arrived. Messages are matched by
// (peer, direction, stage, microbatch), not by arrival order. Under that
// model every schedule here completes. With blocking (rendezvous) sends 1F1B
// would deadlock in its steady phase — stage s sends an activation downstream
// while stage s+1 sends a gradient upstream — which is why sends are not
// waited on.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

enum class Schedule {
  kGPipe,            // all forwards, then all backwards
  kOneFOneB,         // warm-up forwards, then one forward / one backward, then cool-down
  kInterleaved1F1B,  // 1F1B over V > 1 chunks per rank (torch's ScheduleInterleaved1F1B)
};

// "gpipe" / "1f1b" / "interleaved".
std::string ScheduleName(Schedule schedule);
// Parses "gpipe", "1f1b", "interleaved" or "interleaved1f1b" (case-insensitive).
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);

// "stage" below is the action's global stage (its chunk's, with interleaving).
enum class ActionKind {
  kRecvForward,   // receive microbatch m's activation from stage - 1
  kForward,       // run the stage's module on microbatch m
  kSendForward,   // send microbatch m's output to stage + 1
  kRecvBackward,  // receive the gradient of microbatch m's output from stage + 1
  kBackward,      // backpropagate microbatch m through the stage
  kSendBackward,  // send the gradient of microbatch m's input to stage - 1
};

struct Action {
  ActionKind kind;
  int microbatch;
  int chunk = 0;  // the rank's virtual stage: global stage chunk * pp + rank

  bool operator==(const Action& other) const {
    return kind == other.kind && microbatch == other.microbatch && chunk == other.chunk;
  }
};

// "F3", "B0", "RF2" (recv forward), "SF2", "RB1", "SB1"; chunks other than 0
// after a dot: "F3.1" is microbatch 3's forward through chunk 1.
std::string ActionName(const Action& action);
// Actions joined by spaces.
std::string ActionsToString(const std::vector<Action>& actions);

// Checks a step of `microbatches` over `num_stages` pipeline ranks with
// `virtual_stages` chunks each: num_stages >= 1, microbatches >= 1, and
//  - GPipe and 1F1B: one chunk per rank ("gpipe runs one stage per pipeline
//    rank; 2 virtual stages per rank need the interleaved schedule"); 1F1B
//    microbatches >= num_stages ("1F1B needs at least 4 microbatches for 4
//    stages, got 2").
//  - interleaved 1F1B: at least 2 ranks and 2 chunks per rank; the
//    microbatches a multiple of the schedule's number of rounds,
//    max(1, M / pp) — torch 2.15's rule (no longer M % pp == 0): pp = 4
//    takes M = 1..8, 10, 12, 15, 16 but not 9 ("interleaved 1F1B needs the
//    microbatches to be a multiple of its number of rounds, max(1, 9 / 4) =
//    2; got 9").
// INVALID_ARGUMENT otherwise.
absl::Status ValidateSchedule(Schedule schedule, int num_stages, int microbatches,
                              int virtual_stages = 1);

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
  int virtual_stages = 1;            // chunks per rank
  int64_t input_rows = kNotABatch;   // dim 0 of the input; read on the first stage
  int64_t target_rows = kNotABatch;  // dim 0 of the target; read on the last stage
  bool has_loss_fn = false;          // read on the last stage
  // The input's shape and dtype as one number (first stage), and the one
  // whose activation shapes this stage holds from earlier steps (0: none).
  // pp.cc's header skipping; ValidateStep ignores them.
  int64_t input_shape_key = 0;
  int64_t cached_shape_key = 0;
};

// Judges one step from every stage's StepArgs (`stages[s]` from pp rank s):
// the stages agree on schedule, microbatches and virtual stages;
// ValidateSchedule; the first rank's input and the last rank's target (they
// hold the first and the last global stage) split into `microbatches` equal
// row blocks ("pipeline input of 30 rows does not split into 4 equal
// microbatches"); the last rank has a loss function. The first failure as
// INVALID_ARGUMENT, the same on every stage given the same `stages`.
absl::Status ValidateStep(const std::vector<StepArgs>& stages);

// The actions of `stage` (of `num_stages`) for one step of `microbatches`.
// The first stage neither receives activations nor sends gradients; the last
// neither sends activations nor receives gradients.
//   GPipe:  [RF m, F m, SF m] for m = 0..M-1, then [RB m, B m, SB m] for m = 0..M-1.
//   1F1B:   W = num_stages - stage - 1 warm-up forwards; then M - W rounds of
//           [RF, F, SF of the next forward; RB, B, SB of the oldest pending
//           backward]; then the W remaining backwards.
// GPipe and 1F1B only (their actions are all chunk 0); RankActions covers
// every schedule.
absl::StatusOr<std::vector<Action>> StageActions(Schedule schedule, int num_stages,
                                                 int stage, int microbatches);

// The actions of pp rank `rank` (of `pp`) holding `virtual_stages` chunks,
// for one step of `microbatches` (ValidateSchedule's rules). With one chunk,
// StageActions. Interleaved 1F1B orders the rank's M * V forwards and its
// M * V backwards as torch 2.15's ScheduleInterleaved1F1B does: with
// R = max(1, M / pp) rounds of N = M / R microbatches,
//  - the j-th forward runs chunk (j / N) % V, the k-th backward chunk
//    V - 1 - (k / N) % V, each chunk taking its microbatches in order 0..M-1
//    (depth first: N microbatches through a chunk, then on to the next);
//  - W = min((V - 1) * N + 2 * (pp - 1 - rank), M * V) warm-up forwards,
//    then M * V - W rounds of [one forward, one backward], then the W
//    remaining backwards.
// Receives come right before the computation that needs them, sends right
// after the one that produced them, as in StageActions. Stage 0 (rank 0,
// chunk 0) receives no activation; the last stage (rank pp - 1, chunk V - 1)
// sends none and receives no gradient.
absl::StatusOr<std::vector<Action>> RankActions(Schedule schedule, int pp, int rank,
                                                int virtual_stages, int microbatches);

// The parts [first, last] of each of `stages` pipeline stages when a model
// of `parts` parts (layers, blocks) is cut as evenly as it goes: contiguous,
// the first parts % stages stages one part longer (TorchTitan's even
// split; ModuleTrainer's cut of pp x virtual stages, the interleaved rank r
// holding stages r, r + pp, ...). INVALID_ARGUMENT for fewer than one stage
// or more stages than parts. Deterministic: every rank cuts alike.
absl::StatusOr<std::vector<std::pair<int, int>>> CutParts(int parts, int stages);

}  // namespace meshrun::worker::parallel
