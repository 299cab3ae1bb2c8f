// FullyShard's lifecycle (fully_shard.h) where real training goes, under
// meshrun, each case against module_net.h's single-process training:
//
//   --case exception   a backward that throws (caught) in the middle, after
//                      some units' post-backward, then the step again and
//                      the rest: every loss and the final parameters equal
//                      a run without it (--ddp: DistributedDataParallel
//                      instead of FullyShard)
//   --case tied        a weight tied across two units: one parameter, its
//                      gradient summed once, parity with one process
//   --case threads     two sharded models (each over its own group) trained
//                      from two threads at once, each against its reference
//   --case frozen      the blocks' Linears frozen (LoRA-style): the gathered
//                      bytes seen between units in backward stay within the
//                      root, the unit and one prefetch, as with them trained
//   --case writes      writes to a module's tensors after sharding: inside
//                      Gathered they reach the shards; outside, elementwise
//                      ones land in this rank's rows, full-shape ones fail
//   --case eval        many forwards under no_grad: nothing stays gathered
//                      (the root included), and memory does not grow
//   --case rebuild     models destroyed and built again at the same address,
//                      many times: each trains as the reference does and
//                      counts only its own units' gathers
//   --case accumulate  two forwards before one backward (gradient
//                      accumulation): the all-gather and reduce-scatter
//                      counts, against FSDP2's (fsdp_counts.py)
//
// --device cuda: every case on the GPU of LOCAL_RANK over NCCL, against a
// reference trained on that GPU (scripts/device-check.sh).
//
//   meshrun --standalone --nproc-per-node=2 fsdp_lifecycle_worker --case tied

#include <torch/csrc/autograd/custom_function.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_hooks.h"

namespace meshrun::worker::parallel::testing {
namespace {

// Where every case trains (--device), set once by main before any case.
WorkerDevice& Where() {
  static WorkerDevice where;
  return where;
}

// `model` moved to Where()'s device (before FullyShard, which shards what
// it finds there).
template <typename Model>
Model Placed(Model model) {
  model->to(Where().device);
  return model;
}

// Step `step`'s synthetic batch on Where()'s device.
Batch BatchOf(int step) {
  Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
  return {data.input.to(Where().device), data.target.to(Where().device)};
}

// Identity in forward; runs `fn` in backward (a probe, or a throw).
struct Tap : torch::autograd::Function<Tap> {
  struct Callback : torch::CustomClassHolder {
    explicit Callback(std::function<void()> fn) : fn(std::move(fn)) {}
    std::function<void()> fn;
  };
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            std::function<void()> fn) {
    ctx->saved_data["fn"] =
        c10::IValue::make_capsule(c10::make_intrusive<Callback>(std::move(fn)));
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::static_intrusive_pointer_cast<Callback>(ctx->saved_data["fn"].toCapsule())->fn();
    return {grads[0], at::Tensor()};
  }
};

// module_net.h's Net with a Tap after every block.
struct TappedNetImpl : NetImpl {
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = Forward(in, x);
    for (size_t i = 0; i < blocks->size(); ++i) {
      h = Forward((*blocks)[i]->as<BlockImpl>(), h);
      if (after_block) h = Tap::apply(h, [this, i] { after_block(i); });
    }
    return Forward(head, norm->forward(h));
  }
  std::function<void(size_t)> after_block;
};

std::shared_ptr<TappedNetImpl> MakeTappedNet() {
  torch::manual_seed(kModelSeed);
  return std::make_shared<TappedNetImpl>();
}

size_t ParamBytes(const torch::nn::Module& module) {
  size_t total = 0;
  for (const auto& item : module.named_parameters()) total += item.value().nbytes();
  return total;
}

// Each registered tensor once (libtorch's parameters() lists a tied one
// once per registration).
std::vector<at::Tensor> UniqueParams(const torch::nn::Module& module) {
  std::vector<at::Tensor> unique;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& param : module.parameters()) {
    if (seen.insert(param.unsafeGetTensorImpl()).second) unique.push_back(param);
  }
  return unique;
}

void ShardBlocksAndRoot(torch::nn::Module& net, torch::nn::ModuleList& blocks,
                        const ProcessGroupPtr& group) {
  for (const auto& block : *blocks) CheckOk(FullyShard(*block, "fsdp", group), "block");
  CheckOk(FullyShard(net, "fsdp", group), "root");
}

// One training step on batch `batch`, this rank's rows; this rank's loss.
template <typename Model>
at::Tensor StepLoss(Model& net, torch::optim::Optimizer& optimizer, const World& world,
                    int batch) {
  Batch data = BatchOf(batch);
  optimizer.zero_grad();
  at::Tensor loss =
      MseLoss(Forward(net, DataShard(data.input, world.size(), world.rank())),
              DataShard(data.target, world.size(), world.rank()));
  loss.backward();
  optimizer.step();
  return loss;
}

// The same; the global loss.
template <typename Model>
double Step(Model& net, torch::optim::Optimizer& optimizer, World& world, int step) {
  return MeanOver(*world.group(), StepLoss(net, optimizer, world, step));
}

void Done(const World& world) {
  std::printf("DONE rank %d\n", world.rank());
  std::fflush(stdout);
}

int Exception(World& world, bool ddp, int steps, int bad_step) {
  const ModuleReference reference = TrainModuleReference(steps, Where().device);
  auto net = Placed(MakeTappedNet());
  std::unique_ptr<DistributedDataParallel> replicas;
  if (ddp) {
    replicas = ValueOrFail(DistributedDataParallel::Wrap(*net, world.group()), "Wrap");
  } else {
    ShardBlocksAndRoot(*net, net->blocks, world.group());
  }
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  bool armed = false;
  // Block 0's Tap: reached in backward after blocks 2 and 1 (and the head)
  // are done, before block 0 and the root.
  net->after_block = [&armed](size_t block) {
    if (armed && block == 0) throw std::runtime_error("injected failure in backward");
  };
  for (int step = 0; step < steps; ++step) {
    if (step == bad_step) {
      Batch data = BatchOf(step);
      optimizer.zero_grad();
      at::Tensor loss =
          MseLoss(Forward(net, DataShard(data.input, world.size(), world.rank())),
                  DataShard(data.target, world.size(), world.rank()));
      armed = true;
      bool threw = false;
      try {
        loss.backward();
      } catch (const std::exception& e) {
        threw = std::string(e.what()).find("injected failure") != std::string::npos;
      }
      armed = false;
      if (!threw) Fail("the injected failure did not come out of backward");
      if (world.rank() == 0) std::printf("step %d backward threw, caught\n", step);
    }
    const double loss = Step(net, optimizer, world, step);
    ExpectClose("loss at step " + std::to_string(step), loss, reference.losses[step]);
    if (world.rank() == 0) std::printf("step %d loss %.6f\n", step, loss);
  }
  ExpectModuleParams(*net, reference.params);
  if (!ddp && UnshardedBytes(*net) != 0)
    Fail("gathered storage alive after the last step");
  Done(world);
  return 0;
}

// Two blocks sharing one weight `w` ([kDim, kDim]), each a unit.
struct TiedBlockImpl : torch::nn::Module {
  TiedBlockImpl(const at::Tensor& shared, int64_t dim)
      : norm(register_module("norm",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, dim))),
        w(register_parameter("w", shared)) {}
  at::Tensor forward(const at::Tensor& x) {
    return x + Forward(fc, at::gelu(at::matmul(norm->forward(x), w.t())));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
  at::Tensor w;
};
TORCH_MODULE(TiedBlock);

struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl()
      : in(register_module("in", torch::nn::Linear(kIn, kDim))),
        shared(torch::randn({kDim, kDim}) / std::sqrt(static_cast<double>(kDim))),
        block0(register_module("block0", TiedBlock(shared, kDim))),
        block1(register_module("block1", TiedBlock(shared, kDim))),
        head(register_module("head", torch::nn::Linear(kDim, kOut))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = Forward(in, x);
    h = Forward(block0, h);
    h = Forward(block1, h);
    return Forward(head, h);
  }
  torch::nn::Linear in;
  at::Tensor shared;
  TiedBlock block0, block1;
  torch::nn::Linear head;
};
TORCH_MODULE(TiedNet);

TiedNet MakeTiedNet() {
  torch::manual_seed(kModelSeed);
  return TiedNet();
}

int Tied(World& world, int steps) {
  // The reference: the same model, whole, in this process.
  TiedNet whole = MakeTiedNet();
  const ModuleReference reference =
      TrainWhole(whole, UniqueParams(*whole), steps, Where().device);
  TiedNet net = Placed(MakeTiedNet());
  CheckOk(FullyShard(*net->block0, "fsdp", world.group()), "block0");
  CheckOk(FullyShard(*net->block1, "fsdp", world.group()), "block1");
  CheckOk(FullyShard(*net, "fsdp", world.group()), "root");
  // One parameter: block1 registers block0's shard.
  const auto params = net->named_parameters();
  if (params["block0.w"].unsafeGetTensorImpl() !=
      params["block1.w"].unsafeGetTensorImpl())
    Fail("the tied weight is two parameters after FullyShard");
  const std::vector<NamedParam> sharded = ShardedParams(*net);
  if (sharded.size() != UniqueParams(*net).size())
    Fail("ShardedParams lists " + std::to_string(sharded.size()) +
         " parameters, expected " + std::to_string(UniqueParams(*net).size()));
  torch::optim::AdamW optimizer(UniqueParams(*net), Adam());
  for (int step = 0; step < steps; ++step) {
    const double loss = Step(net, optimizer, world, step);
    ExpectClose("loss at step " + std::to_string(step), loss, reference.losses[step]);
    if (world.rank() == 0) std::printf("step %d loss %.6f\n", step, loss);
  }
  for (const NamedParam& named : sharded) {
    ExpectClose("final " + named.name, FullTensor(*named.param),
                reference.params.at(named.name));
  }
  if (world.rank() == 0) std::printf("TIED one parameter, %zu in all\n", sharded.size());
  if (UnshardedBytes(*net) != 0) Fail("gathered storage alive after the last step");
  Done(world);
  return 0;
}

int Threads(World& world, int steps) {
  const ModuleReference reference = TrainModuleReference(8, Where().device);
  std::vector<int> everyone;
  for (int rank = 0; rank < world.size(); ++rank) everyone.push_back(rank);
  // Each model over a group of its own: collectives of the two threads
  // never meet.
  std::vector<ProcessGroupPtr> groups;
  for (int i = 0; i < 2; ++i)
    groups.push_back(ValueOrFail(NewGroup(world, everyone), "group"));
  // Built here: MakeNet seeds the process's generator.
  std::vector<Net> nets;
  for (int i = 0; i < 2; ++i) {
    nets.push_back(Placed(MakeNet()));
    ShardBlocksAndRoot(*nets.back(), nets.back()->blocks, groups[i]);
  }
  std::vector<std::string> failures(2);
  auto train = [&](int which) {
    try {
      Net& net = nets[which];
      torch::optim::AdamW optimizer(net->parameters(), Adam());
      for (int step = 0; step < steps; ++step) {
        // The reference's batches, over and over.
        at::Tensor loss = StepLoss(net, optimizer, world, step % 8);
        if (step < 8) {
          const double global = MeanOver(*groups[which], loss);
          if (std::abs(global - reference.losses[step]) >
              1e-5 * std::abs(reference.losses[step])) {
            failures[which] = "model " + std::to_string(which) + " step " +
                              std::to_string(step) + " loss " + std::to_string(global);
            return;
          }
        }
        if (UnshardedBytes(*net) != 0) {
          failures[which] = "gathered storage alive between steps";
          return;
        }
      }
    } catch (const std::exception& e) {
      failures[which] = e.what();
    }
  };
  std::thread second(train, 1);
  train(0);
  second.join();
  for (const std::string& failure : failures) {
    if (!failure.empty()) Fail(failure);
  }
  if (world.rank() == 0) std::printf("THREADS 2 models, %d steps each\n", steps);
  for (int step = 0; step < std::min(steps, 8); ++step) {
    if (world.rank() == 0)
      std::printf("step %d loss %.6f\n", step, reference.losses[step]);
  }
  Done(world);
  return 0;
}

int Frozen(World& world, bool freeze, int steps) {
  auto net = Placed(MakeTappedNet());
  const size_t all_bytes = ParamBytes(*net);
  size_t root_bytes = all_bytes;
  size_t block_bytes = 0;
  for (const auto& block : *net->blocks) {
    root_bytes -= ParamBytes(*block);
    block_bytes = std::max(block_bytes, ParamBytes(*block));
  }
  if (freeze) {
    for (const auto& block : *net->blocks) {
      auto* impl = block->as<BlockImpl>();
      for (auto* linear : {impl->fc1.get(), impl->fc2.get()}) {
        for (at::Tensor& tensor : linear->parameters()) tensor.requires_grad_(false);
      }
    }
  }
  ShardBlocksAndRoot(*net, net->blocks, world.group());
  size_t peak = 0;
  net->after_block = [&](size_t /*block*/) {
    peak = std::max(peak, UnshardedBytes(*net));
  };
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& param : net->parameters()) {
    if (param.requires_grad()) trainable.push_back(param);
  }
  torch::optim::AdamW optimizer(trainable, Adam());
  for (int step = 0; step < steps; ++step) {
    const double loss = Step(net, optimizer, world, step);
    if (world.rank() == 0) std::printf("step %d loss %.6f\n", step, loss);
  }
  // Between two units in backward: the root (kept, as FSDP2 keeps it), the
  // unit whose backward comes next (prefetched), at most one more. Padding
  // rows add a little.
  const size_t bound = (root_bytes + 2 * block_bytes) * 11 / 10;
  if (world.rank() == 0) {
    std::printf("PEAK %zu bound %zu root %zu block %zu all %zu frozen %d\n", peak, bound,
                root_bytes, block_bytes, all_bytes, freeze ? 1 : 0);
  }
  if (peak > bound)
    Fail("peak gathered " + std::to_string(peak) + " bytes > " + std::to_string(bound));
  if (UnshardedBytes(*net) != 0) Fail("gathered storage alive after the last step");
  Done(world);
  return 0;
}

int Writes(World& world) {
  Net net = Placed(MakeNet());
  ShardBlocksAndRoot(*net, net->blocks, world.group());
  auto full_of = [&](const std::string& name) {
    for (const NamedParam& named : ShardedParams(*net)) {
      if (named.name == name) return FullTensor(*named.param);
    }
    Fail("no parameter " + name);
    return at::Tensor();
  };
  // A custom init inside Gathered reaches the shards (every rank's rows).
  {
    Gathered gathered(*net);
    at::NoGradGuard no_grad;
    net->head->weight.fill_(0.25);
    (*net->blocks)[1]->as<BlockImpl>()->fc1->bias.copy_(at::arange(60, at::kFloat) /
                                                        100.0);
  }
  if (UnshardedBytes(*net) != 0) Fail("gathered storage alive after Gathered");
  ExpectClose("head.weight after the init", full_of("head.weight"),
              at::full({kOut, kDim}, 0.25));
  ExpectClose("blocks.1.fc1.bias after the init", full_of("blocks.1.fc1.bias"),
              at::arange(60, at::kFloat) / 100.0);
  // Outside, the module's tensors are this rank's rows of the shards (as
  // FSDP2's module attributes are the sharded DTensors then): an elementwise
  // write lands in the shards, a full-shape one is refused.
  {
    at::NoGradGuard no_grad;
    net->head->weight.fill_(0.5);
  }
  ExpectClose("head.weight after a write outside", full_of("head.weight"),
              at::full({kOut, kDim}, 0.5));
  std::string refused;
  try {
    at::NoGradGuard no_grad;
    net->head->weight.copy_(at::zeros({kOut, kDim}));
  } catch (const std::exception& e) {
    refused = e.what();
    refused = refused.substr(0, refused.find('\n'));
  }
  if (refused.empty()) Fail("a full-shape write outside Gathered was not refused");
  ExpectClose("head.weight after the refused write", full_of("head.weight"),
              at::full({kOut, kDim}, 0.5));
  // Training goes on from the written values, as it does in one process.
  Net reference = Placed(MakeNet());
  {
    at::NoGradGuard no_grad;
    reference->head->weight.fill_(0.5);
    (*reference->blocks)[1]->as<BlockImpl>()->fc1->bias.copy_(at::arange(60, at::kFloat) /
                                                              100.0);
  }
  torch::optim::AdamW reference_optimizer(reference->parameters(), Adam());
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  for (int step = 0; step < 3; ++step) {
    Batch data = BatchOf(step);
    reference_optimizer.zero_grad();
    at::Tensor want = MseLoss(reference->forward(data.input), data.target);
    want.backward();
    reference_optimizer.step();
    const double loss = Step(net, optimizer, world, step);
    ExpectClose("loss at step " + std::to_string(step), loss, want.item<double>());
    if (world.rank() == 0) std::printf("step %d loss %.6f\n", step, loss);
  }
  if (world.rank() == 0) std::printf("REFUSED %s\n", refused.c_str());
  Done(world);
  return 0;
}

// Resident set size, in KiB.
long RssKib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// A root and three blocks of one bias-free Linear each: the units' lifecycle
// as in Net, at a fifth of its operators a forward (100,000 forwards are a
// few seconds of CPU, not half a minute that a busy machine stretches).
struct SlimNetImpl : torch::nn::Module {
  SlimNetImpl()
      : in(register_module("in", Bare(kIn, 8))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", Bare(8, kOut))) {
    for (int i = 0; i < kBlocks; ++i) blocks->push_back(Bare(8, 8));
  }
  static torch::nn::Linear Bare(int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = in->forward(x);
    for (const auto& block : *blocks) h = Forward(block->as<torch::nn::LinearImpl>(), h);
    return head->forward(h);
  }
  torch::nn::Linear in;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(SlimNet);

int Eval(World& world, int forwards) {
  torch::manual_seed(kModelSeed);
  SlimNet net = Placed(SlimNet());
  ShardBlocksAndRoot(*net, net->blocks, world.group());
  at::NoGradGuard no_grad;
  Batch data = BatchOf(0);
  const at::Tensor input = DataShard(data.input, world.size(), world.rank());
  const int warmup = std::min(forwards, 1000);
  long after_warmup = 0;
  for (int i = 0; i < forwards; ++i) {
    at::Tensor out = Forward(net, input);
    if (UnshardedBytes(*net) != 0)
      Fail("gathered storage alive after eval forward " + std::to_string(i));
    if (i + 1 == warmup) after_warmup = RssKib();
  }
  const long end = RssKib();
  const GatherCounts counts = CountGathers(*net);
  if (world.rank() == 0) {
    std::printf(
        "EVAL %d forwards, RSS %ld KiB after %d, %ld KiB at the end, gathers %d\n",
        forwards, after_warmup, warmup, end, counts.gathers);
  }
  // Every unit gathered once a forward, prefetched from the second on.
  if (counts.gathers != 4 * forwards)
    Fail("gathers " + std::to_string(counts.gathers) + ", expected " +
         std::to_string(4 * forwards));
  if (end - after_warmup > 4096)
    Fail("RSS grew by " + std::to_string(end - after_warmup) + " KiB over the forwards");
  Done(world);
  return 0;
}

// Every model in one block of memory, so that each is built where the last
// one was (a model still alive when the next is made throws).
template <typename T>
struct SameAddress {
  using value_type = T;
  static constexpr size_t kBytes = size_t{1} << 16;
  alignas(std::max_align_t) static inline unsigned char arena[kBytes];
  static inline bool in_use = false;
  SameAddress() = default;
  template <typename U>
  explicit SameAddress(const SameAddress<U>& /*other*/) {}
  T* allocate(size_t n) {
    if (in_use || n * sizeof(T) > kBytes) throw std::bad_alloc();
    in_use = true;
    return reinterpret_cast<T*>(arena);
  }
  void deallocate(T* /*pointer*/, size_t /*n*/) { in_use = false; }
  template <typename U>
  bool operator==(const SameAddress<U>& /*other*/) const {
    return true;
  }
  template <typename U>
  bool operator!=(const SameAddress<U>& /*other*/) const {
    return false;
  }
};

int Rebuild(World& world, int models) {
  const ModuleReference reference = TrainModuleReference(2, Where().device);
  std::unordered_set<const void*> addresses;
  int reused = 0;
  for (int i = 0; i < models; ++i) {
    torch::manual_seed(kModelSeed);
    Net net = Placed(Net(std::allocate_shared<NetImpl>(SameAddress<NetImpl>())));
    if (!addresses.insert(net.get()).second) ++reused;
    ShardBlocksAndRoot(*net, net->blocks, world.group());
    torch::optim::AdamW optimizer(net->parameters(), Adam());
    for (int step = 0; step < 2; ++step) {
      const double loss = Step(net, optimizer, world, step);
      ExpectClose("model " + std::to_string(i) + " loss at step " + std::to_string(step),
                  loss, reference.losses[step]);
    }
    // This model's units alone: 7 gathers a step (the root once, each block
    // in forward and in backward), nothing gathered between steps.
    const GatherCounts counts = CountGathers(*net);
    if (counts.gathers != 14 || UnshardedBytes(*net) != 0) {
      Fail("model " + std::to_string(i) + ": " + std::to_string(counts.gathers) +
           " gathers (expected 14), " + std::to_string(UnshardedBytes(*net)) +
           " bytes gathered after its steps");
    }
  }
  if (world.rank() == 0) {
    std::printf("REBUILT %d models, %d at an address used before\n", models, reused);
    for (int step = 0; step < 2; ++step)
      std::printf("step %d loss %.6f\n", step, reference.losses[step]);
  }
  if (reused != models - 1) Fail("the models were not all built at one address");
  Done(world);
  return 0;
}

int Accumulate(World& world, int steps) {
  // The reference: the whole batch in one process (the mean of the two
  // halves' losses is the whole batch's).
  const ModuleReference reference = TrainModuleReference(steps, Where().device);
  Net net = Placed(MakeNet());
  ShardBlocksAndRoot(*net, net->blocks, world.group());
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  for (int step = 0; step < steps; ++step) {
    Batch data = BatchOf(step);
    const at::Tensor input = DataShard(data.input, world.size(), world.rank());
    const at::Tensor target = DataShard(data.target, world.size(), world.rank());
    const int64_t half = input.size(0) / 2;
    optimizer.zero_grad();
    // Two microbatches' forwards, then one backward of their mean.
    at::Tensor first =
        MseLoss(Forward(net, input.narrow(0, 0, half)), target.narrow(0, 0, half));
    at::Tensor second =
        MseLoss(Forward(net, input.narrow(0, half, half)), target.narrow(0, half, half));
    at::Tensor loss = (first + second) / 2;
    loss.backward();
    optimizer.step();
    const double global = MeanOver(*world.group(), loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    if (world.rank() == 0) std::printf("step %d loss %.6f\n", step, global);
  }
  ExpectModuleParams(*net, reference.params);
  const GatherCounts counts = CountGathers(*net);
  if (world.rank() == 0) {
    std::printf("COUNTS all_gather %d reduce_scatter %d over %d steps\n",
                counts.all_gathers, counts.reduce_scatters, steps);
  }
  Done(world);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  using namespace meshrun::worker::parallel::testing;  // NOLINT(build/namespaces)
  CLI::App app{"FullyShard's lifecycle where real training goes"};
  std::string which;
  bool ddp = false;
  bool trainable = false;
  int steps = 10;
  int count = 100000;
  std::string device = "cpu";
  app.add_option("--case", which)->required();
  app.add_option("--device", device, "cpu (Gloo) or cuda (NCCL)");
  app.add_flag("--ddp", ddp);
  app.add_flag("--trainable", trainable, "frozen: the same run with nothing frozen");
  app.add_option("--steps", steps);
  app.add_option("--count", count, "eval: forwards; rebuild: models");
  CLI11_PARSE(app, argc, argv);
  Where() = ParseWorkerDevice(device);
  auto world = ValueOrFail(meshrun::worker::InitProcessGroup(Where().backend), "init");
  if (which == "exception") return Exception(*world, ddp, steps, /*bad_step=*/3);
  if (which == "tied") return Tied(*world, steps);
  if (which == "threads") return Threads(*world, steps);
  if (which == "frozen") return Frozen(*world, !trainable, steps);
  if (which == "writes") return Writes(*world);
  if (which == "eval") return Eval(*world, count);
  if (which == "rebuild") return Rebuild(*world, count);
  if (which == "accumulate") return Accumulate(*world, steps);
  Fail("unknown case " + which);
  return 2;
}
