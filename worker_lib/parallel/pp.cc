#include "worker_lib/parallel/pp.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/module_params.h"

namespace meshrun::worker::parallel {

namespace {

constexpr int kMaxDims = 8;
constexpr int kHeaderLength = 2 + kMaxDims;  // ndim, dtype, sizes

// Tags of microbatch m crossing the boundary whose lower stage is chunk k
// of its rank (pp.h's wire protocol), of M microbatches.
struct Tags {
  int header, activation, gradient;
};
Tags TagsOf(int k, int m, int microbatches) {
  const int base = 3 * (k * microbatches + m);
  return {base, base + 1, base + 2};
}

// Executes one rank's actions for one step. Throws (c10::Error from c10d or
// a module) on failure; RunStep converts.
class StepRunner {
 public:
  // headers: whether this step sends activation headers (pp.h); otherwise
  // the shapes come from stage.shape_cache(). device: the stage's.
  StepRunner(PipelineStage& stage, int microbatches, std::vector<at::Tensor> inputs,
             std::vector<at::Tensor> targets, const LossFn& loss_fn, bool headers,
             at::Device device)
      : stage_(stage),
        group_(*stage.group()),
        pp_(stage.pp_size()),
        rank_(stage.rank()),
        microbatches_(microbatches),
        inputs_(std::move(inputs)),
        targets_(std::move(targets)),
        loss_fn_(loss_fn),
        headers_(headers),
        cache_(stage.shape_cache()),
        on_device_(at::TensorOptions().device(device)),
        state_(stage.virtual_stages(), std::vector<Microbatch>(microbatches)) {}

  // Returns the sum of the microbatches' (unscaled) losses on the rank
  // holding the last stage, 0 elsewhere.
  double Run(const std::vector<Action>& actions) {
    for (const Action& action : actions) Do(action);
    // Sends complete once their receivers have taken them; the tensors they
    // read stay alive in the works until then.
    for (auto& work : pending_sends_) work->wait();
    pending_sends_.clear();
    return loss_sum_;
  }

 private:
  struct Microbatch {
    at::Tensor input;        // received (requires grad) or the first stage's rows
    at::Tensor output;       // the stage's output
    at::Tensor loss;         // last stage: loss / microbatches
    at::Tensor output_grad;  // received from the next stage
  };

  void Do(const Action& action) {
    const int chunk = action.chunk;
    const int m = action.microbatch;
    TORCH_CHECK(
        chunk >= 0 && chunk < stage_.virtual_stages() && m >= 0 && m < microbatches_,
        "pipeline action ", ActionName(action), " out of range");
    Microbatch& mb = state_[chunk][m];
    const int stage = stage_.stage(chunk);
    const bool first = stage == 0;
    const bool last = stage == stage_.num_stages() - 1;
    // The neighbouring stages' ranks (wrapping around between chunks).
    const int previous = (rank_ + pp_ - 1) % pp_;
    const int next = (rank_ + 1) % pp_;
    switch (action.kind) {
      case ActionKind::kRecvForward:
        mb.input = RecvActivation(previous, Boundary(stage - 1, m)).requires_grad_(true);
        break;
      case ActionKind::kForward:
        if (first) mb.input = inputs_[m];
        TORCH_CHECK(mb.input.defined(), "pipeline stage ", stage, ": microbatch ", m,
                    " has no input");
        mb.output = stage_.Forward(chunk, mb.input);
        if (last) {
          at::Tensor loss = loss_fn_(mb.output, targets_[m]);
          TORCH_CHECK(loss.numel() == 1, "pipeline loss must be a scalar, got shape ",
                      loss.sizes());
          loss_sum_ += loss.item<double>();
          mb.loss = loss / static_cast<double>(microbatches_);
        }
        break;
      case ActionKind::kSendForward:
        SendActivation(mb.output.detach(), next, Boundary(stage, m));
        break;
      case ActionKind::kRecvBackward:
        mb.output_grad = Recv(at::empty(mb.output.sizes(), mb.output.options()), next,
                              Boundary(stage, m).gradient);
        break;
      case ActionKind::kBackward:
        if (last) {
          if (mb.loss.requires_grad()) mb.loss.backward();
        } else if (mb.output.requires_grad()) {
          mb.output.backward(mb.output_grad);
        }
        // Activations are dropped as soon as they are no longer needed.
        mb.output = at::Tensor();
        mb.loss = at::Tensor();
        mb.output_grad = at::Tensor();
        if (first) mb.input = at::Tensor();
        break;
      case ActionKind::kSendBackward: {
        at::Tensor grad = mb.input.grad();
        if (!grad.defined()) grad = at::zeros_like(mb.input);  // input unused
        Send(grad.detach().contiguous(), previous, Boundary(stage - 1, m).gradient);
        mb.input = at::Tensor();
        break;
      }
    }
  }

  // The tags of microbatch m crossing from global stage `lower` to lower + 1.
  Tags Boundary(int lower, int m) const { return TagsOf(lower / pp_, m, microbatches_); }

  void SendActivation(const at::Tensor& activation, int peer, const Tags& tags) {
    TORCH_CHECK(activation.dim() <= kMaxDims, "pipeline activations have at most ",
                kMaxDims, " dims, got ", activation.dim());
    std::vector<int64_t> h(kHeaderLength, 0);
    h[0] = activation.dim();
    h[1] = static_cast<int64_t>(activation.scalar_type());
    for (int64_t d = 0; d < activation.dim(); ++d) h[2 + d] = activation.size(d);
    if (headers_) {
      Send(at::tensor(h, at::kLong).to(on_device_.device()), peer, tags.header);
      cache_.sent[tags.header] = h;
    } else {
      // The receiver expects the shape sent in an earlier step.
      auto sent = cache_.sent.find(tags.header);
      TORCH_CHECK(sent != cache_.sent.end() && sent->second == h, "pipeline rank ", rank_,
                  ": activation ", activation.sizes(),
                  " differs from an earlier step's with the same input shape (stages' "
                  "output shapes must follow the input's shape)");
    }
    Send(activation.contiguous(), peer, tags.activation);
  }

  at::Tensor RecvActivation(int peer, const Tags& tags) {
    std::vector<int64_t> h;
    if (headers_) {
      at::Tensor header =
          Recv(at::empty({kHeaderLength}, on_device_.dtype(at::kLong)), peer, tags.header)
              .cpu();
      h.assign(header.data_ptr<int64_t>(), header.data_ptr<int64_t>() + kHeaderLength);
      cache_.received[tags.header] = h;
    } else {
      auto received = cache_.received.find(tags.header);
      TORCH_CHECK(received != cache_.received.end(), "pipeline rank ", rank_,
                  ": no activation shape from rank ", peer, " for tag ", tags.header);
      h = received->second;
    }
    TORCH_CHECK(h[0] >= 0 && h[0] <= kMaxDims, "pipeline rank ", rank_,
                ": bad activation header from rank ", peer);
    std::vector<int64_t> sizes(h.data() + 2, h.data() + 2 + h[0]);
    return Recv(at::empty(sizes, on_device_.dtype(static_cast<at::ScalarType>(h[1]))),
                peer, tags.activation);
  }

  void Send(at::Tensor tensor, int peer, int tag) {
    std::vector<at::Tensor> tensors{std::move(tensor)};
    pending_sends_.push_back(group_.send(tensors, peer, tag));
  }

  at::Tensor Recv(at::Tensor buffer, int peer, int tag) {
    std::vector<at::Tensor> tensors{buffer};
    group_.recv(tensors, peer, tag)->wait();
    return buffer;
  }

  PipelineStage& stage_;
  c10d::ProcessGroup& group_;
  const int pp_;
  const int rank_;
  const int microbatches_;
  const std::vector<at::Tensor> inputs_;
  const std::vector<at::Tensor> targets_;
  const LossFn& loss_fn_;
  const bool headers_;
  PipelineStage::ShapeCache& cache_;
  const at::TensorOptions on_device_;           // the stage's device
  std::vector<std::vector<Microbatch>> state_;  // [chunk][microbatch]
  std::vector<c10::intrusive_ptr<c10d::Work>> pending_sends_;
  double loss_sum_ = 0;
};

// Rows of `batch`, or StepArgs::kNotABatch.
int64_t Rows(const at::Tensor& batch) {
  return batch.defined() && batch.dim() > 0 ? batch.size(0) : StepArgs::kNotABatch;
}

// Every stage's StepArgs, `mine` included (index = stage): one small
// all-gather over the pp group. Throws c10::Error on a c10d failure.
std::vector<StepArgs> ExchangeStepArgs(c10d::ProcessGroup& group, const StepArgs& mine,
                                       at::Device device) {
  constexpr int kFields = 8;
  at::Tensor packed = at::tensor(
      {static_cast<int64_t>(mine.schedule), static_cast<int64_t>(mine.microbatches),
       mine.input_rows, mine.target_rows, static_cast<int64_t>(mine.has_loss_fn),
       static_cast<int64_t>(mine.virtual_stages), mine.input_shape_key,
       mine.cached_shape_key},
      at::kLong);
  std::vector<at::Tensor> input{packed.to(device)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int s = 0; s < group.getSize(); ++s)
    output[0].push_back(
        at::empty({kFields}, at::TensorOptions(at::kLong).device(device)));
  group.allgather(output, input)->wait();
  std::vector<StepArgs> all;
  for (const at::Tensor& on_device : output[0]) {
    const at::Tensor t = on_device.cpu();
    auto f = t.accessor<int64_t, 1>();
    StepArgs args;
    for (Schedule schedule :
         {Schedule::kGPipe, Schedule::kOneFOneB, Schedule::kInterleaved1F1B}) {
      if (f[0] == static_cast<int64_t>(schedule)) args.schedule = schedule;
    }
    args.microbatches = static_cast<int>(f[1]);
    args.input_rows = f[2];
    args.target_rows = f[3];
    args.has_loss_fn = f[4] != 0;
    args.virtual_stages = static_cast<int>(f[5]);
    args.input_shape_key = f[6];
    args.cached_shape_key = f[7];
    all.push_back(args);
  }
  return all;
}

// The first stage's input shape, dtype, microbatches and schedule as one
// nonzero number (FNV-1a): what the activation shapes of a step follow.
int64_t InputShapeKey(const at::Tensor& input, int microbatches, Schedule schedule) {
  std::vector<int64_t> fields{input.dim(), static_cast<int64_t>(input.scalar_type()),
                              microbatches, static_cast<int64_t>(schedule)};
  for (int64_t size : input.sizes()) fields.push_back(size);
  uint64_t hash = 14695981039346656037ULL;
  for (int64_t field : fields) {
    hash ^= static_cast<uint64_t>(field);
    hash *= 1099511628211ULL;
  }
  const auto key = static_cast<int64_t>(hash);
  return key == 0 ? 1 : key;
}

}  // namespace

std::vector<std::shared_ptr<Param>> PipelineStage::Params() const {
  std::vector<std::shared_ptr<Param>> params;
  for (const Chunk& chunk : chunks_) {
    for (const auto& param : chunk.params) params.push_back(param);
  }
  return params;
}

std::vector<at::Tensor> PipelineStage::Leaves() const {
  std::vector<at::Tensor> leaves;
  for (const auto& param : Params()) leaves.push_back(param->data());
  return leaves;
}

at::Device PipelineStage::device() const {
  for (const Chunk& chunk : chunks_) {
    for (const auto& param : chunk.params) return param->data().device();
  }
  return at::kCPU;
}

std::string PipelineStage::Describe() const {
  std::vector<std::string> stages;
  for (int c = 0; c < virtual_stages(); ++c) {
    stages.push_back(absl::StrCat("stage ", stage(c), "/", num_stages(), ": ",
                                  chunks_[c].description));
  }
  if (virtual_stages() == 1) return stages.front();
  return absl::StrCat("rank ", rank_, "/", pp_size_, ", ", virtual_stages(),
                      " virtual stages: ", absl::StrJoin(stages, "; "));
}

absl::StatusOr<PipelineStage> MakeStage(std::vector<torch::nn::AnyModule> modules,
                                        ProcessGroupPtr pp_group) {
  if (!pp_group) return absl::InvalidArgumentError("MakeStage: no pp process group");
  if (modules.empty()) return absl::InvalidArgumentError("MakeStage: no stage modules");
  PipelineStage stage;
  stage.rank_ = pp_group->getRank();
  stage.pp_size_ = pp_group->getSize();
  stage.group_ = std::move(pp_group);
  for (size_t c = 0; c < modules.size(); ++c) {
    if (modules[c].is_empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("MakeStage: stage module ", c, " is empty"));
    }
    PipelineStage::Chunk chunk;
    std::shared_ptr<torch::nn::Module> module = modules[c].ptr();
    const std::string name = module->name();
    chunk.description =
        name.substr(name.rfind("::") == std::string::npos ? 0 : name.rfind("::") + 2);
    for (const NamedParam& named : ModuleParams(*module))
      chunk.params.push_back(named.param);
    chunk.forward = [any = std::move(modules[c])](const at::Tensor& x) mutable {
      return ForwardAny(any, x);
    };
    stage.chunks_.push_back(std::move(chunk));
  }
  return stage;
}

absl::StatusOr<double> RunStep(PipelineStage& stage, Schedule schedule, int microbatches,
                               const at::Tensor& input, const at::Tensor& target,
                               const LossFn& loss_fn) {
  auto internal = [&](const std::string& what) {
    return absl::InternalError(
        absl::StrCat("pipeline ", stage.virtual_stages() == 1 ? "stage " : "rank ",
                     stage.rank(), " (", ScheduleName(schedule), "): ", what));
  };
  try {
    // Every stage judges the whole step before any activation is sent: the
    // batch is visible only on the first stage and the target only on the
    // last, and a stage refusing alone would leave its neighbours waiting
    // for messages until the group timed out.
    // Where every message of the step lives (pp.h: PipelineStage::device).
    const at::Device device = stage.device();
    StepArgs mine;
    mine.schedule = schedule;
    mine.microbatches = microbatches;
    mine.virtual_stages = stage.virtual_stages();
    if (stage.is_first()) {
      mine.input_rows = Rows(input);
      if (input.defined())
        mine.input_shape_key = InputShapeKey(input, microbatches, schedule);
    }
    PipelineStage::ShapeCache& cache = stage.shape_cache();
    mine.cached_shape_key = cache.key;
    if (stage.is_last()) {
      mine.target_rows = Rows(target);
      mine.has_loss_fn = static_cast<bool>(loss_fn);
    }
    const std::vector<StepArgs> all = ExchangeStepArgs(*stage.group(), mine, device);
    if (absl::Status status = ValidateStep(all); !status.ok()) return status;
    // Headers unless every stage holds the shapes for this input shape.
    const int64_t key = all.front().input_shape_key;
    bool headers = key == 0;
    for (const StepArgs& args : all) headers = headers || args.cached_shape_key != key;
    if (headers) cache = {};
    absl::StatusOr<std::vector<Action>> actions = RankActions(
        schedule, stage.pp_size(), stage.rank(), stage.virtual_stages(), microbatches);
    if (!actions.ok()) return actions.status();
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> targets;
    if (stage.is_first()) inputs = input.split(input.size(0) / microbatches, 0);
    if (stage.is_last()) targets = target.split(target.size(0) / microbatches, 0);

    StepRunner runner(stage, microbatches, std::move(inputs), std::move(targets), loss_fn,
                      headers, device);
    const double loss_sum = runner.Run(*actions);
    cache.key = key;
    // The step's loss lives on the last stage's rank; every rank returns it.
    at::Tensor loss = at::full({1}, loss_sum / microbatches,
                               at::TensorOptions(at::kDouble).device(device));
    std::vector<at::Tensor> tensors{loss};
    c10d::BroadcastOptions options;
    options.rootRank = stage.pp_size() - 1;
    stage.group()->broadcast(tensors, options)->wait();
    return loss.item<double>();
  } catch (const c10::Error& error) {
    stage.shape_cache() = {};  // the next step sends headers
    return internal(error.what_without_backtrace());
  } catch (const std::exception& error) {
    stage.shape_cache() = {};
    return internal(error.what());
  }
}

}  // namespace meshrun::worker::parallel
