#pragma once

// Sharded checkpoints of a user's torch::nn::Module and its optimizer, in
// checkpoint.h's files: each rank writes what it holds, and a load fills
// each rank's own part from whatever layout wrote them (FSDP, TP, FSDP + TP,
// DDP, one process), as torch.distributed.checkpoint does with resharding.
//
//   SaveModule(dir, "rank-" + std::to_string(rank), *model, &optimizer);
//   ...barrier...
//   LoadModule(dir, *model, &optimizer);   // after building the new layout
//
// Entries are named by the module's state dict: every parameter and buffer
// by its named_parameters() / named_buffers() name (sharded ones with their
// global shape, ShardedParams of module_params.h), and the optimizer's state
// per parameter as "<name>.<field>" (optimizer_state.h: Adam's and AdamW's
// step, exp_avg, exp_avg_sq, ...; SGD's momentum_buffer; RMSprop's and
// Adagrad's). An optimizer state tensor is sharded as its parameter, so it
// is resharded with it. A load creates the state an optimizer has not made
// yet (before its first step). Other optimizers: INVALID_ARGUMENT (save the
// module alone, optimizer null).
//
// Replicated entries are written by every rank that holds them (harmless
// duplicates). Not collective.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace meshrun::worker::parallel {

// Which of the module's parameters and buffers a save or a load takes (a
// pipeline stage's, of a root whose other parts other ranks train); null:
// all of them.
using TensorFilter = std::function<bool(const at::Tensor&)>;

absl::Status SaveModule(const std::string& dir, const std::string& tag,
                        const torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer = nullptr,
                        const TensorFilter& only = nullptr);

// Fails, changing nothing, when an entry is missing, of another global
// shape, or not fully covered (checkpoint.h's LoadShards).
absl::Status LoadModule(const std::string& dir, torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer = nullptr,
                        const TensorFilter& only = nullptr);

}  // namespace meshrun::worker::parallel
