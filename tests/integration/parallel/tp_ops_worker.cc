// The tensor-parallel operators against their whole counterparts, values and
// gradients, on a tp group of the whole world (run under the launcher):
// the conjugate operators (tp.h), column- and row-parallel linear vs
// at::linear, the vocab-parallel embedding vs at::embedding and the
// vocab-parallel cross-entropy vs at::cross_entropy. Inputs and upstream
// gradients are the same on every rank unless a check needs them to differ
// (then they derive from the rank). Prints "CHECK <rank> <name>" for each
// passed check and "DONE rank <r>"; a mismatch prints "FAIL ..." and exits 1.

#include <ATen/CPUGeneratorImpl.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/tp.h"
#include "worker_lib/parallel/vocab.h"

namespace {

using namespace meshrun::worker::parallel;           // NOLINT
using namespace meshrun::worker::parallel::testing;  // NOLINT

int rank_ = 0;
int n_ = 1;

void Passed(const std::string& name) {
  std::cout << absl::StrCat("CHECK ", rank_, " ", name, "\n") << std::flush;
}

at::Generator Gen(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor Randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = Gen(seed);
  return at::empty(shape, at::kFloat).normal_(0, 1, g);
}

at::Tensor Leaf(const at::Tensor& t) {
  return t.detach().clone().set_requires_grad(true);
}

// This rank's chunk of `t` along `dim` (even split).
at::Tensor Mine(const at::Tensor& t, int64_t dim) {
  const int64_t size = t.size(dim) / n_;
  return t.narrow(dim, rank_ * size, size);
}

// Values and gradients: "exact" checks use rtol 0 where no arithmetic
// differs between the two sides.
void CheckConjugateOps(const ProcessGroupPtr& tp) {
  {  // f: identity forward; backward sums the ranks' gradients.
    at::Tensor x = Leaf(Randn({4, 6}, 1));
    at::Tensor y = CopyToTpRegion(x, tp);
    ExpectClose("copy forward", y, x, 0);
    at::Tensor g = Randn({4, 6}, 2);
    y.backward(g * (rank_ + 1));
    ExpectClose("copy backward", x.grad(), g * (n_ * (n_ + 1) / 2));
    Passed("copy_to_tp_region");
  }
  {  // g: sums forward; backward passes the gradient through.
    at::Tensor base = Randn({4, 6}, 3);
    at::Tensor x = Leaf(base * (rank_ + 1));
    at::Tensor y = ReduceFromTpRegion(x, tp);
    ExpectClose("reduce forward", y, base * (n_ * (n_ + 1) / 2));
    ExpectClose("reduce leaves its input", x, base * (rank_ + 1), 0);
    at::Tensor g = Randn({4, 6}, 4);
    y.backward(g);
    ExpectClose("reduce backward", x.grad(), g, 0);
    Passed("reduce_from_tp_region");
  }
  {  // gather: all-gather along the last dim; backward keeps own slice.
    at::Tensor full = Randn({2, 4, 3 * n_}, 5);
    at::Tensor x = Leaf(Mine(full, 2));
    at::Tensor y = GatherFromTpRegion(x, tp);
    ExpectClose("gather forward", y, full, 0);
    at::Tensor g = Randn({2, 4, 3 * n_}, 6);
    y.backward(g);
    ExpectClose("gather backward", x.grad(), Mine(g, 2), 0);
    Passed("gather_from_tp_region");
  }
  {  // scatter: keeps own slice; backward all-gathers the ranks' gradients.
    at::Tensor full = Randn({4, 3 * n_}, 7);
    at::Tensor x = Leaf(full);
    at::Tensor y = ScatterToTpRegion(x, tp);
    ExpectClose("scatter forward", y, Mine(full, 1), 0);
    at::Tensor g_all = Randn({4, 3 * n_}, 8);
    y.backward(Mine(g_all, 1).contiguous());
    ExpectClose("scatter backward", x.grad(), g_all, 0);
    Passed("scatter_to_tp_region");
  }
}

// The gradient of `param`, gathered to the global shape.
at::Tensor FullGrad(const Param& param) {
  return GatherSteps(param.data().grad(), param.global_shape(), param.steps(),
                     param.groups());
}

void CheckLinears(const ProcessGroupPtr& tp) {
  const int64_t in = 5 * n_;
  const int64_t out = 3 * n_;
  at::Generator g = Gen(9);
  auto whole = Linear::Init("l", in, out, true, g);
  at::Tensor input = Randn({6, in}, 10);
  at::Tensor upstream = Randn({6, out}, 11);

  at::Tensor x_ref = Leaf(input);
  (whole->Forward(x_ref) * upstream).sum().backward();

  // Column-parallel, gathered output.
  auto col =
      ValueOrFail(ColwiseParallel(*whole, "tp", tp, /*gather_output=*/true), "col");
  at::Tensor x_col = Leaf(input);
  at::Tensor y_col = col->Forward(x_col);
  ExpectClose("column forward", y_col, whole->Forward(input).detach());
  (y_col * upstream).sum().backward();
  ExpectClose("column input grad", x_col.grad(), x_ref.grad());
  ExpectClose("column weight grad", FullGrad(*col->weight()),
              whole->weight()->data().grad());
  ExpectClose("column bias grad", FullGrad(*col->bias()), whole->bias()->data().grad());
  Passed("column_parallel_linear");

  // Row-parallel on a whole input (split inside).
  auto row =
      ValueOrFail(RowwiseParallel(*whole, "tp", tp, /*input_is_parallel=*/false), "row");
  at::Tensor x_row = Leaf(input);
  at::Tensor y_row = row->Forward(x_row);
  ExpectClose("row forward", y_row, whole->Forward(input).detach());
  (y_row * upstream).sum().backward();
  ExpectClose("row input grad", x_row.grad(), x_ref.grad());
  ExpectClose("row weight grad", FullGrad(*row->weight()),
              whole->weight()->data().grad());
  ExpectClose("row bias grad", FullGrad(*row->bias()), whole->bias()->data().grad());
  Passed("row_parallel_linear");

  // The source layer is left whole.
  if (!whole->weight()->steps().empty()) Fail("the whole Linear was sharded");
}

void CheckEmbedding(const ProcessGroupPtr& tp) {
  const int64_t vocab = 8 * n_;
  at::Generator g = Gen(12);
  auto whole = Embedding::Init("embed", vocab, 6, g);
  at::Generator ids_gen = Gen(13);
  // Every id at least once, then random ones: every rank owns some.
  at::Tensor ids = at::cat({at::arange(vocab, at::kLong),
                            at::empty({3 * vocab}, at::kLong).random_(0, vocab, ids_gen)})
                       .view({4, -1});
  at::Tensor upstream = Randn({4, ids.size(1), 6}, 14);

  at::Tensor want = at::embedding(whole->weight()->data(), ids);
  (want * upstream).sum().backward();

  auto parallel = ValueOrFail(VocabParallel(*whole, "tp", tp), "vocab parallel");
  at::Tensor got = parallel->Forward(ids);
  ExpectClose("embedding forward", got, want.detach(), 0);
  (got * upstream).sum().backward();
  ExpectClose("embedding weight grad", FullGrad(*parallel->weight()),
              whole->weight()->data().grad());
  ExpectClose("embedding local grad", parallel->weight()->data().grad(),
              Mine(whole->weight()->data().grad(), 0));
  Passed("vocab_parallel_embedding");
}

void CheckCrossEntropy(const ProcessGroupPtr& tp) {
  const int64_t vocab = 8 * n_;
  // Large logits: the max subtraction matters.
  at::Tensor full = Randn({3, 5, vocab}, 15) * 20;
  at::Generator t_gen = Gen(16);
  at::Tensor targets = at::empty({3, 5}, at::kLong).random_(0, vocab, t_gen);
  targets[0][0].fill_(0);
  targets[0][1].fill_(vocab - 1);
  at::Tensor weights = Randn({3, 5}, 17);

  at::Tensor ref_logits = Leaf(full);
  at::Tensor want = at::cross_entropy_loss(ref_logits.view({-1, vocab}),
                                           targets.view({-1}), {}, at::Reduction::None)
                        .view({3, 5});
  (want * weights).sum().backward();

  at::Tensor local = Leaf(Mine(full, 2));
  at::Tensor got = VocabParallelCrossEntropy(local, targets, tp);
  ExpectClose("cross-entropy forward", got, want.detach());
  (got * weights).sum().backward();
  ExpectClose("cross-entropy grad", local.grad(), Mine(ref_logits.grad(), 2));

  // Mean reduction, as a training loss uses it.
  at::Tensor ref2 = Leaf(full);
  at::Tensor mean_want =
      at::cross_entropy_loss(ref2.view({-1, vocab}), targets.view({-1}));
  mean_want.backward();
  at::Tensor local2 = Leaf(Mine(full, 2));
  at::Tensor mean_got = VocabParallelCrossEntropy(local2, targets, tp).mean();
  ExpectClose("cross-entropy mean", mean_got.item<double>(), mean_want.item<double>());
  mean_got.backward();
  ExpectClose("cross-entropy mean grad", local2.grad(), Mine(ref2.grad(), 2));
  Passed("vocab_parallel_cross_entropy");
}

}  // namespace

int main() {
  auto world = ValueOrFail(meshrun::worker::InitProcessGroup("gloo"), "init");
  auto mesh = ValueOrFail(
      meshrun::worker::InitDeviceMesh(world, "cpu", {world->size()}, {{"tp"}}), "mesh");
  ProcessGroupPtr tp = ValueOrFail(mesh.GetGroup("tp"), "tp group");
  rank_ = tp->getRank();
  n_ = tp->getSize();
  CheckConjugateOps(tp);
  CheckLinears(tp);
  CheckEmbedding(tp);
  CheckCrossEntropy(tp);
  tp->barrier()->wait();  // no rank leaves while a peer may still be connecting
  std::cout << absl::StrCat("DONE rank ", world->rank(), "\n") << std::flush;
  return 0;
}
