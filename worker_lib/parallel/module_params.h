#pragma once

// The Params (param.h) behind a user module's sharded parameters: what
// ParallelizeModule (parallelize.h) and FullyShard (fully_shard.h) did to
// each, so that FullyShard shards a TP shard again (FSDP + TP) and
// FullTensor reassembles any of them. Keyed by the tensor the module has
// registered (its TensorImpl). Thread-safe. ForEachSubmodule, ModuleParams
// and ShardedParams skip the hooks' own child module (module_hooks.h).

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// `param` is what `registered` holds. Not an owner: whoever sharded the
// tensor keeps `param` alive (the module's hooks); ParamOf is null after.
void RecordParam(const at::Tensor& registered, std::shared_ptr<Param> param);
// The Param recorded for `registered`, or null.
std::shared_ptr<Param> ParamOf(const at::Tensor& registered);

struct NamedParam {
  std::string name;
  std::shared_ptr<Param> param;
};

// Every parameter of `module` and its submodules once (a tied one under its
// first name), by its state-dict name, in named_parameters() order: the
// Param recorded for it (a shard: its data() is the registered tensor), or
// else one over the module's own tensor (Param::OfLeaf).
std::vector<NamedParam> ModuleParams(const torch::nn::Module& module);

// Calls `visit` on `module` and every module below it, depth first in
// registration order, with its path ("" for `module`, "blocks.0" below).
void ForEachSubmodule(
    torch::nn::Module& module,
    const std::function<void(torch::nn::Module&, const std::string& path)>& visit);

// The sharded parameters of `module` and its submodules, by their names
// relative to it ("blocks.0.fc1.weight"), in named_parameters() order (a
// tied one once): FullTensor(*param) gives each one's global value. Empty
// for a module never sharded.
std::vector<NamedParam> ShardedParams(const torch::nn::Module& module);

}  // namespace meshrun::worker::parallel
