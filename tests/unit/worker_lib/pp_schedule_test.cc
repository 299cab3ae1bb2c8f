#include "worker_lib/parallel/pp_schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace meshrun::worker::parallel {
namespace {

std::vector<Action> Actions(Schedule schedule, int stages, int stage, int microbatches) {
  auto actions = StageActions(schedule, stages, stage, microbatches);
  EXPECT_TRUE(actions.ok()) << actions.status();
  return actions.ok() ? *actions : std::vector<Action>{};
}

std::string Order(Schedule schedule, int stages, int stage, int microbatches) {
  return ActionsToString(Actions(schedule, stages, stage, microbatches));
}

TEST(PipelineSchedule, GPipeOrder) {
  EXPECT_EQ(Order(Schedule::kGPipe, 2, 0, 3),
            "F0 SF0 F1 SF1 F2 SF2 RB0 B0 RB1 B1 RB2 B2");
  EXPECT_EQ(Order(Schedule::kGPipe, 2, 1, 3),
            "RF0 F0 RF1 F1 RF2 F2 B0 SB0 B1 SB1 B2 SB2");
  EXPECT_EQ(Order(Schedule::kGPipe, 3, 1, 2),
            "RF0 F0 SF0 RF1 F1 SF1 RB0 B0 SB0 RB1 B1 SB1");
  // One stage: no communication at all.
  EXPECT_EQ(Order(Schedule::kGPipe, 1, 0, 2), "F0 F1 B0 B1");
}

TEST(PipelineSchedule, OneFOneBOrder) {
  // 4 stages, 4 microbatches: stage s warms up with 3 - s forwards.
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 0, 4),
            "F0 SF0 F1 SF1 F2 SF2 F3 SF3 RB0 B0 RB1 B1 RB2 B2 RB3 B3");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 1, 4),
            "RF0 F0 SF0 RF1 F1 SF1 RF2 F2 SF2 RB0 B0 SB0 RF3 F3 SF3 RB1 B1 SB1 "
            "RB2 B2 SB2 RB3 B3 SB3");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 3, 4),
            "RF0 F0 B0 SB0 RF1 F1 B1 SB1 RF2 F2 B2 SB2 RF3 F3 B3 SB3");
  // 2 stages, 4 microbatches: one warm-up forward on stage 0.
  EXPECT_EQ(Order(Schedule::kOneFOneB, 2, 0, 4),
            "F0 SF0 F1 SF1 RB0 B0 F2 SF2 RB1 B1 F3 SF3 RB2 B2 RB3 B3");
}

TEST(PipelineSchedule, OneFOneBRefusesFewerMicrobatchesThanStages) {
  auto actions = StageActions(Schedule::kOneFOneB, 4, 0, 2);
  ASSERT_FALSE(actions.ok());
  EXPECT_EQ(actions.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(actions.status().message(),
            "1F1B needs at least 4 microbatches for 4 stages, got 2");
  // Every stage refuses alike (they validate before communicating, so no rank hangs).
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_FALSE(StageActions(Schedule::kOneFOneB, 4, stage, 3).ok());
  }
  // GPipe has no such limit.
  EXPECT_TRUE(StageActions(Schedule::kGPipe, 4, 0, 2).ok());
  EXPECT_TRUE(StageActions(Schedule::kOneFOneB, 4, 0, 4).ok());
}

TEST(PipelineSchedule, RejectsBadArguments) {
  EXPECT_FALSE(StageActions(Schedule::kGPipe, 0, 0, 4).ok());
  EXPECT_FALSE(StageActions(Schedule::kGPipe, 2, 2, 4).ok());
  EXPECT_FALSE(StageActions(Schedule::kGPipe, 2, -1, 4).ok());
  EXPECT_FALSE(StageActions(Schedule::kGPipe, 2, 0, 0).ok());
}

// What each of `num_stages` stages brings to a step of `microbatches`: the
// first stage a batch of `input_rows`, the last a target of `target_rows`
// and a loss function; the middle stages neither.
std::vector<StepArgs> Step(int num_stages, Schedule schedule, int microbatches,
                           int64_t input_rows, int64_t target_rows) {
  std::vector<StepArgs> stages(num_stages);
  for (StepArgs& args : stages) {
    args.schedule = schedule;
    args.microbatches = microbatches;
  }
  stages.front().input_rows = input_rows;
  stages.back().target_rows = target_rows;
  stages.back().has_loss_fn = true;
  return stages;
}

std::string Refusal(const std::vector<StepArgs>& stages) {
  absl::Status status = ValidateStep(stages);
  if (status.ok()) return "OK";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

// Every stage judges the step from all stages' arguments, so a problem only
// the first or the last stage can see is refused by all of them alike.
TEST(ValidateStep, JudgesTheWholeStepFromEveryStagesArguments) {
  const Schedule kG = Schedule::kGPipe;
  const Schedule k1 = Schedule::kOneFOneB;
  const int64_t kNone = StepArgs::kNotABatch;
  struct Case {
    std::vector<StepArgs> stages;
    std::string want;
  };
  const std::vector<Case> cases = {
      {Step(4, kG, 4, 32, 32), "OK"},
      {Step(4, k1, 8, 32, 32), "OK"},
      {Step(1, kG, 4, 32, 32), "OK"},
      {Step(3, kG, 4, 30, 30),
       "pipeline input of 30 rows does not split into 4 equal microbatches"},
      {Step(3, kG, 5, 32, 30),
       "pipeline input of 32 rows does not split into 5 equal microbatches"},
      {Step(3, kG, 4, 32, 30),
       "pipeline target of 30 rows does not split into 4 equal microbatches"},
      {Step(1, kG, 4, 32, 30),
       "pipeline target of 30 rows does not split into 4 equal microbatches"},
      {Step(3, kG, 4, 0, 0),
       "pipeline input of 0 rows does not split into 4 equal microbatches"},
      {Step(3, kG, 4, kNone, 32),
       "pipeline input must be a tensor of at least 1 dimension"},
      {Step(3, kG, 4, 32, kNone),
       "pipeline target must be a tensor of at least 1 dimension"},
      {Step(4, k1, 2, 32, 32), "1F1B needs at least 4 microbatches for 4 stages, got 2"},
      {Step(2, kG, 0, 32, 32), "a pipeline step needs at least 1 microbatch, got 0"},
      {{}, "a pipeline step needs a stage"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.stages.size() << " stages");
    EXPECT_EQ(Refusal(c.stages), c.want);
  }

  // The middle stages' batches are nobody's business (they pass none).
  std::vector<StepArgs> stages = Step(3, kG, 4, 32, 32);
  stages[1].input_rows = 7;
  stages[1].target_rows = 7;
  EXPECT_EQ(Refusal(stages), "OK");

  stages = Step(3, kG, 4, 32, 32);
  stages.back().has_loss_fn = false;
  EXPECT_EQ(Refusal(stages), "pipeline RunStep: no loss function");

  // Stages that were called differently are told so, instead of running
  // schedules that do not match.
  stages = Step(3, kG, 4, 32, 32);
  stages[2].microbatches = 8;
  EXPECT_EQ(Refusal(stages),
            "pipeline stages disagree on the step: stage 0 runs gpipe with 4 "
            "microbatches, stage 2 gpipe with 8; every stage must call RunStep with the "
            "same schedule and microbatches");
  stages = Step(2, Schedule::kInterleaved1F1B, 4, 32, 32);
  for (StepArgs& args : stages) args.virtual_stages = 2;
  EXPECT_EQ(Refusal(stages), "OK");
  stages[1].virtual_stages = 3;
  EXPECT_EQ(Refusal(stages),
            "pipeline stages disagree on the step: stage 0 runs interleaved with 4 "
            "microbatches x 2 chunks, stage 1 interleaved with 4 x 3 chunks; every stage "
            "must call RunStep with the same schedule and microbatches");
  stages = Step(2, Schedule::kInterleaved1F1B, 4, 32, 32);
  EXPECT_EQ(Refusal(stages),
            "interleaved 1F1B needs at least 2 virtual stages per pipeline rank, got 1 "
            "(with one, use 1f1b)");
  stages = Step(3, kG, 4, 32, 32);
  stages[1].schedule = k1;
  EXPECT_EQ(Refusal(stages),
            "pipeline stages disagree on the step: stage 0 runs gpipe with 4 "
            "microbatches, stage 1 1f1b with 4; every stage must call RunStep with the "
            "same schedule and microbatches");
}

TEST(PipelineSchedule, ParsesNames) {
  EXPECT_EQ(*ParseSchedule("gpipe"), Schedule::kGPipe);
  EXPECT_EQ(*ParseSchedule("1F1B"), Schedule::kOneFOneB);
  EXPECT_EQ(*ParseSchedule("interleaved"), Schedule::kInterleaved1F1B);
  EXPECT_EQ(*ParseSchedule("Interleaved1F1B"), Schedule::kInterleaved1F1B);
  EXPECT_FALSE(ParseSchedule("zb").ok());
  EXPECT_EQ(ParseSchedule("zb").status().message(),
            "unknown pipeline schedule 'zb' (expected gpipe, 1f1b or interleaved)");
  EXPECT_EQ(ScheduleName(Schedule::kOneFOneB), "1f1b");
  EXPECT_EQ(ScheduleName(Schedule::kInterleaved1F1B), "interleaved");
}

// Every microbatch is forwarded once, then backwarded once, on every stage;
// a stage receives before it computes and computes before it sends.
TEST(PipelineSchedule, EveryMicrobatchForwardedAndBackwardedOnce) {
  for (Schedule schedule : {Schedule::kGPipe, Schedule::kOneFOneB}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int microbatches = stages; microbatches <= 12; ++microbatches) {
        for (int stage = 0; stage < stages; ++stage) {
          SCOPED_TRACE(ScheduleName(schedule) + " stages " + std::to_string(stages) +
                       " stage " + std::to_string(stage) + " microbatches " +
                       std::to_string(microbatches));
          const bool first = stage == 0;
          const bool last = stage == stages - 1;
          std::map<std::pair<ActionKind, int>, int> position;
          const std::vector<Action> actions =
              Actions(schedule, stages, stage, microbatches);
          for (size_t i = 0; i < actions.size(); ++i) {
            const auto key = std::make_pair(actions[i].kind, actions[i].microbatch);
            EXPECT_EQ(position.count(key), 0u) << ActionName(actions[i]) << " twice";
            position[key] = static_cast<int>(i);
          }
          const size_t per_microbatch = 2 + (first ? 0 : 2) + (last ? 0 : 2);
          EXPECT_EQ(actions.size(), per_microbatch * microbatches);
          for (int m = 0; m < microbatches; ++m) {
            auto at = [&](ActionKind kind) {
              auto it = position.find({kind, m});
              return it == position.end() ? -1 : it->second;
            };
            const int forward = at(ActionKind::kForward);
            const int backward = at(ActionKind::kBackward);
            ASSERT_GE(forward, 0);
            ASSERT_GT(backward, forward);
            if (!first) {
              EXPECT_LT(at(ActionKind::kRecvForward), forward);
              EXPECT_GT(at(ActionKind::kSendBackward), backward);
            }
            if (!last) {
              EXPECT_GT(at(ActionKind::kSendForward), forward);
              EXPECT_GE(at(ActionKind::kRecvBackward), 0);
              EXPECT_LT(at(ActionKind::kRecvBackward), backward);
            }
            EXPECT_EQ(at(ActionKind::kRecvForward) >= 0, !first);
            EXPECT_EQ(at(ActionKind::kSendBackward) >= 0, !first);
            EXPECT_EQ(at(ActionKind::kSendForward) >= 0, !last);
            EXPECT_EQ(at(ActionKind::kRecvBackward) >= 0, !last);
          }
        }
      }
    }
  }
}

// Runs all stages' action lists against each other, one action at a time, in
// a simulated network. Sends are buffered (posted without waiting, as pp.cc
// does with isend) or rendezvous (the sender waits for the receiver, as a
// blocking send would). Receives match by (source stage, direction,
// microbatch). Returns false on deadlock.
struct SimulationResult {
  bool completed = false;
  std::string stuck;  // each stage's next action when stuck
  std::vector<int>
      peak_in_flight;   // per stage: most microbatches forwarded, not backwarded
  int undelivered = 0;  // messages never received (must be 0)
};

SimulationResult Simulate(Schedule schedule, int stages, int microbatches,
                          bool buffered_sends) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s)
    lists.push_back(Actions(schedule, stages, s, microbatches));
  std::vector<size_t> next(stages, 0);
  // (from, to, is_forward, microbatch) posted and not yet received.
  std::set<std::tuple<int, int, bool, int>> in_network;
  std::vector<std::set<int>> forwarded(stages), backwarded(stages),
      received_forward(stages), received_backward(stages);
  SimulationResult result;
  result.peak_in_flight.assign(stages, 0);

  auto message_of = [&](int s, const Action& a,
                        int* peer) -> std::tuple<int, int, bool, int> {
    switch (a.kind) {
      case ActionKind::kSendForward:
        *peer = s + 1;
        return {s, s + 1, true, a.microbatch};
      case ActionKind::kRecvForward:
        *peer = s - 1;
        return {s - 1, s, true, a.microbatch};
      case ActionKind::kSendBackward:
        *peer = s - 1;
        return {s, s - 1, false, a.microbatch};
      case ActionKind::kRecvBackward:
        *peer = s + 1;
        return {s + 1, s, false, a.microbatch};
      default:
        *peer = -1;
        return {};
    }
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      if (next[s] == lists[s].size()) continue;
      const Action& a = lists[s][next[s]];
      const int m = a.microbatch;
      bool done = false;
      int peer = -1;
      switch (a.kind) {
        case ActionKind::kForward:
          // Input available: the first stage has it; others must have received it.
          EXPECT_TRUE(s == 0 || received_forward[s].count(m)) << "F" << m << " before RF";
          forwarded[s].insert(m);
          done = true;
          break;
        case ActionKind::kBackward:
          EXPECT_TRUE(forwarded[s].count(m)) << "B" << m << " before F";
          EXPECT_TRUE(s == stages - 1 || received_backward[s].count(m));
          backwarded[s].insert(m);
          done = true;
          break;
        case ActionKind::kSendForward:
        case ActionKind::kSendBackward: {
          auto message = message_of(s, a, &peer);
          EXPECT_TRUE(peer >= 0 && peer < stages);
          if (buffered_sends) {
            in_network.insert(message);
            done = true;
          } else {
            // Rendezvous: completes together with the peer's matching receive.
            const Action want{a.kind == ActionKind::kSendForward
                                  ? ActionKind::kRecvForward
                                  : ActionKind::kRecvBackward,
                              m};
            if (next[peer] < lists[peer].size() && lists[peer][next[peer]] == want) {
              (a.kind == ActionKind::kSendForward ? received_forward
                                                  : received_backward)[peer]
                  .insert(m);
              ++next[peer];
              done = true;
            }
          }
          break;
        }
        case ActionKind::kRecvForward:
        case ActionKind::kRecvBackward: {
          auto message = message_of(s, a, &peer);
          if (in_network.erase(message)) {
            (a.kind == ActionKind::kRecvForward ? received_forward : received_backward)[s]
                .insert(m);
            done = true;
          }
          break;
        }
      }
      if (done) {
        ++next[s];
        progress = true;
        const int in_flight = static_cast<int>(forwarded[s].size()) -
                              static_cast<int>(backwarded[s].size());
        result.peak_in_flight[s] = std::max(result.peak_in_flight[s], in_flight);
      }
    }
  }
  result.completed = true;
  for (int s = 0; s < stages; ++s) {
    if (next[s] != lists[s].size()) {
      result.completed = false;
      result.stuck +=
          "stage " + std::to_string(s) + " at " + ActionName(lists[s][next[s]]) + "; ";
    }
  }
  result.undelivered = static_cast<int>(in_network.size());
  return result;
}

TEST(PipelineSchedule, SimulatedExecutionCompletesWithoutDeadlock) {
  for (Schedule schedule : {Schedule::kGPipe, Schedule::kOneFOneB}) {
    for (int stages = 1; stages <= 8; ++stages) {
      for (int microbatches = stages; microbatches <= 16; ++microbatches) {
        SCOPED_TRACE(ScheduleName(schedule) + " stages " + std::to_string(stages) +
                     " microbatches " + std::to_string(microbatches));
        SimulationResult run =
            Simulate(schedule, stages, microbatches, /*buffered=*/true);
        EXPECT_TRUE(run.completed) << run.stuck;
        // Every send was received.
        EXPECT_EQ(run.undelivered, 0);
        for (int s = 0; s < stages; ++s) {
          if (schedule == Schedule::kGPipe) {
            EXPECT_EQ(run.peak_in_flight[s], microbatches);
          } else {
            // 1F1B's point: bounded activation memory, independent of M.
            EXPECT_EQ(run.peak_in_flight[s], stages - s) << "stage " << s;
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, GPipeAlsoCompletesWithBlockingSends) {
  for (int stages = 1; stages <= 6; ++stages) {
    for (int microbatches = 1; microbatches <= 8; ++microbatches) {
      SimulationResult run = Simulate(Schedule::kGPipe, stages, microbatches,
                                      /*buffered=*/false);
      EXPECT_TRUE(run.completed) << run.stuck;
    }
  }
}

// Why pp.cc posts sends without waiting: with blocking sends, 1F1B's steady
// phase deadlocks (the simulator detects it).
TEST(PipelineSchedule, OneFOneBDeadlocksWithBlockingSends) {
  SimulationResult run = Simulate(Schedule::kOneFOneB, 2, 4, /*buffered=*/false);
  EXPECT_FALSE(run.completed);
  EXPECT_EQ(run.stuck, "stage 0 at SF1; stage 1 at SB0; ");
}

// Interleaved 1F1B: the order of a rank's computations is torch 2.15's
// ScheduleInterleaved1F1B's (these strings are its
// _calculate_single_rank_operations, printed with the same names; the
// schedule was also compared with torch's for every valid M <= 20, pp 2..5,
// V 2..4).
std::string Computations(int pp, int rank, int chunks, int microbatches) {
  auto actions = RankActions(Schedule::kInterleaved1F1B, pp, rank, chunks, microbatches);
  EXPECT_TRUE(actions.ok()) << actions.status();
  if (!actions.ok()) return "";
  std::vector<Action> computations;
  for (const Action& action : *actions) {
    if (action.kind == ActionKind::kForward || action.kind == ActionKind::kBackward)
      computations.push_back(action);
  }
  return ActionsToString(computations);
}

TEST(InterleavedSchedule, ComputesInTorchsOrder) {
  EXPECT_EQ(Computations(2, 0, 2, 4),
            "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(Computations(2, 1, 2, 4),
            "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  EXPECT_EQ(Computations(4, 0, 2, 8),
            "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 F6 B0.1 F7 B1.1 F4.1 B2.1 F5.1 B3.1 "
            "F6.1 B0 F7.1 B1 B2 B3 B4.1 B5.1 B6.1 B7.1 B4 B5 B6 B7");
  EXPECT_EQ(Computations(4, 3, 2, 8),
            "F0 F1 F2 F3 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4 B0 F5 B1 F6 B2 F7 B3 "
            "F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4 B5 B6 B7");
  // Fewer microbatches than ranks: one round of 3.
  EXPECT_EQ(Computations(3, 2, 3, 3),
            "F0 F1 F2 F0.1 F1.1 F2.1 F0.2 B0.2 F1.2 B1.2 F2.2 B2.2 B0.1 B1.1 B2.1 B0 B1 "
            "B2");
}

// The communication around the computations: rank 0 holds stages 0 and 2
// of 4, rank 1 stages 1 and 3 (the last: no send after its forward).
TEST(InterleavedSchedule, CommunicatesAroundEachComputation) {
  auto rank0 = RankActions(Schedule::kInterleaved1F1B, 2, 0, 2, 2);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_EQ(ActionsToString(*rank0),
            "F0 SF0 F1 SF1 RF0.1 F0.1 SF0.1 RF1.1 F1.1 SF1.1 RB0.1 B0.1 SB0.1 RB1.1 "
            "B1.1 SB1.1 RB0 B0 RB1 B1");
  auto rank1 = RankActions(Schedule::kInterleaved1F1B, 2, 1, 2, 2);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(ActionsToString(*rank1),
            "RF0 F0 SF0 RF1 F1 SF1 RF0.1 F0.1 B0.1 SB0.1 RF1.1 F1.1 B1.1 SB1.1 RB0 B0 "
            "SB0 RB1 B1 SB1");
  // One chunk per rank: RankActions is StageActions.
  EXPECT_EQ(*RankActions(Schedule::kOneFOneB, 4, 1, 1, 4),
            *StageActions(Schedule::kOneFOneB, 4, 1, 4));
}

TEST(InterleavedSchedule, ValidationErrors) {
  const Schedule kI = Schedule::kInterleaved1F1B;
  struct Case {
    Schedule schedule;
    int pp, microbatches, chunks;
    std::string want;
  };
  const std::vector<Case> cases = {
      {kI, 2, 4, 2, "OK"},
      {kI, 4, 3, 2, "OK"},   // one round of 3 (torch 2.15 allows M < pp)
      {kI, 4, 10, 2, "OK"},  // two rounds of 5
      {kI, 4, 7, 3, "OK"},   // one round of 7
      {kI, 4, 9, 2,
       "interleaved 1F1B needs the microbatches to be a multiple of its number of "
       "rounds, max(1, 9 / 4) = 2; got 9"},
      {kI, 3, 7, 2,
       "interleaved 1F1B needs the microbatches to be a multiple of its number of "
       "rounds, max(1, 7 / 3) = 2; got 7"},
      {kI, 2, 4, 1,
       "interleaved 1F1B needs at least 2 virtual stages per pipeline rank, got 1 "
       "(with one, use 1f1b)"},
      {kI, 1, 4, 2, "interleaved 1F1B needs at least 2 pipeline ranks, got 1"},
      {kI, 2, 0, 2, "a pipeline step needs at least 1 microbatch, got 0"},
      {Schedule::kOneFOneB, 2, 4, 2,
       "1f1b runs one stage per pipeline rank; 2 virtual stages per rank need the "
       "interleaved schedule"},
      {Schedule::kGPipe, 2, 4, 3,
       "gpipe runs one stage per pipeline rank; 3 virtual stages per rank need the "
       "interleaved schedule"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << ScheduleName(c.schedule) << " pp " << c.pp
                                      << " M " << c.microbatches << " V " << c.chunks);
    absl::Status status = ValidateSchedule(c.schedule, c.pp, c.microbatches, c.chunks);
    EXPECT_EQ(status.ok() ? "OK" : std::string(status.message()), c.want);
    // RankActions refuses alike, on every rank.
    for (int rank = 0; rank < c.pp; ++rank) {
      auto actions = RankActions(c.schedule, c.pp, rank, c.chunks, c.microbatches);
      EXPECT_EQ(actions.ok() ? "OK" : std::string(actions.status().message()), c.want);
    }
  }
  EXPECT_FALSE(RankActions(kI, 2, 2, 2, 4).ok());
  EXPECT_FALSE(RankActions(kI, 2, -1, 2, 4).ok());
  EXPECT_EQ(StageActions(kI, 2, 0, 4).status().message(),
            "StageActions plans one stage per rank; interleaved 1F1B needs RankActions");
}

// All ranks' action lists run against each other under pp_schedule.h's
// communication model: a send is posted and the rank moves on; a receive
// waits for its message, matched by (sender rank, receiver rank, direction,
// stage boundary, microbatch). Checks each computation's inputs are there
// when it runs, and that each (stage, microbatch) is forwarded and
// backwarded exactly once.
struct RankSimulation {
  bool completed = false;
  std::string stuck;                // each unfinished rank's next action
  int undelivered = 0;              // messages never received
  int forwards = 0;                 // (stage, microbatch) forwarded, over all ranks
  int backwards = 0;                // ... and backwarded
  std::vector<int> peak_in_flight;  // per rank: forwards not yet backwarded
};

RankSimulation SimulateRanks(Schedule schedule, int pp, int chunks, int microbatches) {
  const int stages = pp * chunks;
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < pp; ++r) {
    auto actions = RankActions(schedule, pp, r, chunks, microbatches);
    EXPECT_TRUE(actions.ok()) << actions.status();
    lists.push_back(actions.ok() ? *actions : std::vector<Action>{});
  }
  // (from rank, to rank, is_forward, boundary stage b (between b and b + 1),
  // microbatch) posted and not yet received.
  using Message = std::tuple<int, int, bool, int, int>;
  std::set<Message> in_network;
  // Per (global stage, microbatch).
  std::set<std::pair<int, int>> forwarded, backwarded, got_activation, got_gradient;
  std::vector<size_t> next(pp, 0);
  RankSimulation result;
  result.peak_in_flight.assign(pp, 0);
  std::vector<int> in_flight(pp, 0);

  auto rank_of = [&](int stage) { return stage % pp; };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      if (next[r] == lists[r].size()) continue;
      const Action& a = lists[r][next[r]];
      const int g = a.chunk * pp + r;
      const int m = a.microbatch;
      const std::pair<int, int> key{g, m};
      EXPECT_TRUE(a.chunk >= 0 && a.chunk < chunks) << ActionName(a);
      EXPECT_TRUE(m >= 0 && m < microbatches) << ActionName(a);
      bool done = true;
      switch (a.kind) {
        case ActionKind::kForward:
          EXPECT_TRUE(g == 0 || got_activation.count(key)) << ActionName(a);
          EXPECT_TRUE(forwarded.insert(key).second) << "twice: " << ActionName(a);
          ++result.forwards;
          result.peak_in_flight[r] = std::max(result.peak_in_flight[r], ++in_flight[r]);
          break;
        case ActionKind::kBackward:
          EXPECT_TRUE(forwarded.count(key)) << ActionName(a) << " before its forward";
          EXPECT_TRUE(g == stages - 1 || got_gradient.count(key)) << ActionName(a);
          EXPECT_TRUE(backwarded.insert(key).second) << "twice: " << ActionName(a);
          ++result.backwards;
          --in_flight[r];
          break;
        case ActionKind::kSendForward:
          EXPECT_TRUE(forwarded.count(key)) << ActionName(a) << " before its forward";
          EXPECT_LT(g, stages - 1);
          EXPECT_TRUE(in_network.insert({r, rank_of(g + 1), true, g, m}).second);
          break;
        case ActionKind::kSendBackward:
          EXPECT_TRUE(backwarded.count(key)) << ActionName(a) << " before its backward";
          EXPECT_GT(g, 0);
          EXPECT_TRUE(in_network.insert({r, rank_of(g - 1), false, g - 1, m}).second);
          break;
        case ActionKind::kRecvForward:
          done = in_network.erase({rank_of(g - 1), r, true, g - 1, m}) > 0;
          if (done) got_activation.insert(key);
          break;
        case ActionKind::kRecvBackward:
          done = in_network.erase({rank_of(g + 1), r, false, g, m}) > 0;
          if (done) got_gradient.insert(key);
          break;
      }
      if (done) {
        ++next[r];
        progress = true;
      }
    }
  }
  result.completed = true;
  for (int r = 0; r < pp; ++r) {
    if (next[r] != lists[r].size()) {
      result.completed = false;
      result.stuck +=
          "rank " + std::to_string(r) + " at " + ActionName(lists[r][next[r]]) + "; ";
    }
  }
  result.undelivered = static_cast<int>(in_network.size());
  return result;
}

TEST(InterleavedSchedule, SimulatedExecutionCompletesWithoutDeadlock) {
  for (int pp : {2, 3, 4}) {
    for (int chunks : {2, 3}) {
      // Every valid microbatch count up to 4 rounds, and a few more.
      for (int microbatches = 1; microbatches <= 4 * pp + 3; ++microbatches) {
        SCOPED_TRACE(::testing::Message()
                     << "pp " << pp << " V " << chunks << " M " << microbatches);
        if (!ValidateSchedule(Schedule::kInterleaved1F1B, pp, microbatches, chunks)
                 .ok()) {
          continue;
        }
        RankSimulation run =
            SimulateRanks(Schedule::kInterleaved1F1B, pp, chunks, microbatches);
        EXPECT_TRUE(run.completed) << run.stuck;
        EXPECT_EQ(run.undelivered, 0);
        EXPECT_EQ(run.forwards, pp * chunks * microbatches);
        EXPECT_EQ(run.backwards, pp * chunks * microbatches);
        for (int r = 0; r < pp; ++r) {
          // Bounded activation memory: the warm-up's forwards plus the one
          // of each steady round.
          const int rounds = std::max(1, microbatches / pp);
          const int warmup =
              std::min((chunks - 1) * (microbatches / rounds) + 2 * (pp - 1 - r),
                       chunks * microbatches);
          EXPECT_LE(run.peak_in_flight[r], warmup + 1) << "rank " << r;
        }
      }
    }
  }
}

// The same simulator agrees with the single-stage schedules' (V = 1).
TEST(InterleavedSchedule, SimulatorAlsoRunsOneStagePerRank) {
  for (Schedule schedule : {Schedule::kGPipe, Schedule::kOneFOneB}) {
    for (int pp = 1; pp <= 4; ++pp) {
      for (int microbatches = pp; microbatches <= 8; ++microbatches) {
        RankSimulation run = SimulateRanks(schedule, pp, 1, microbatches);
        EXPECT_TRUE(run.completed) << run.stuck;
        EXPECT_EQ(run.undelivered, 0);
        EXPECT_EQ(run.forwards, pp * microbatches);
      }
    }
  }
}

using Cut = std::vector<std::pair<int, int>>;

Cut CutOf(int parts, int stages) {
  auto cut = CutParts(parts, stages);
  EXPECT_TRUE(cut.ok()) << cut.status();
  return cut.ok() ? *cut : Cut{};
}

TEST(CutParts, SplitsContiguouslyTheFirstStagesOneLonger) {
  // Seed 003's MLP, 4 Linears: one each over 4 stages, two each over 2.
  EXPECT_EQ(CutOf(4, 4), (Cut{{0, 0}, {1, 1}, {2, 2}, {3, 3}}));
  EXPECT_EQ(CutOf(4, 2), (Cut{{0, 1}, {2, 3}}));
  EXPECT_EQ(CutOf(4, 1), (Cut{{0, 3}}));
  // The GPT of 2 blocks (embeddings, blocks, head: 4 parts) over 3 stages.
  EXPECT_EQ(CutOf(4, 3), (Cut{{0, 1}, {2, 2}, {3, 3}}));
  // 8 parts over 4 x 2 interleaved stages: rank 0 holds stages 0 and 4.
  EXPECT_EQ(CutOf(8, 8)[4], (std::pair<int, int>{4, 4}));
  EXPECT_EQ(CutOf(7, 3), (Cut{{0, 2}, {3, 4}, {5, 6}}));
}

TEST(CutParts, RefusesMoreStagesThanParts) {
  auto too_many = CutParts(4, 6);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().message(),
            "cannot cut a model of 4 parts into 6 pipeline stages");
  EXPECT_FALSE(CutParts(4, 0).ok());
}

}  // namespace
}  // namespace meshrun::worker::parallel
