// Gradient checks (float64, central differences vs backward) of matmul/bmm/linear and the fused nn
// ops: softmax, log_softmax, layer_norm, cross_entropy, dropout. Every op family is also
// checked on a non-contiguous input (a transposed or strided view).
// Not here: forward values and bad-input errors (tests/test_nn_ops.cpp).
#include <vector>

#include "tests/test_util.h"

namespace linea {
namespace {

using test::f64;
using test::randn64;
using test::randn64_transposed;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// A [rows, cols] float64 leaf viewed with a column step of 2: neither row- nor column-major.
Tensor randn64_strided(int64_t rows, int64_t cols) {
  Tensor base = randn({rows, 2 * cols}, f64());
  base.requires_grad_(true);
  return base.slice(1, 0, 2 * cols, 2);
}

const Fn kMatmul = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };

TEST(GradCheck, Matmul) {
  manual_seed(1);
  EXPECT_GRADCHECK(kMatmul, {randn64({3, 4}), randn64({4, 5})});
  EXPECT_GRADCHECK(kMatmul, {randn64({2, 3, 4}), randn64({2, 4, 5})});
  // 1-D promotion on either side and on both (a dot product).
  EXPECT_GRADCHECK(kMatmul, {randn64({4}), randn64({4, 5})});
  EXPECT_GRADCHECK(kMatmul, {randn64({3, 4}), randn64({4})});
  EXPECT_GRADCHECK(kMatmul, {randn64({4}), randn64({4})});
  // Only one operand requires grad.
  Tensor b = randn({4, 2}, f64());
  EXPECT_GRADCHECK(kMatmul, {randn64({3, 4}), b});
  // Non-contiguous: a strided slice (copied by matmul) times a transposed view.
  EXPECT_GRADCHECK(kMatmul, {randn64_strided(3, 4), randn64_transposed({4, 5})});
}

TEST(GradCheck, MatmulBroadcast) {
  manual_seed(2);
  // Batch dims broadcast both ways: [2, 1, 3, 4] @ [3, 4, 2] -> [2, 3, 3, 2].
  EXPECT_GRADCHECK(kMatmul, {randn64({2, 1, 3, 4}), randn64({3, 4, 2})});
  // A shared right operand (the folded-batch backward): [2, 3, 4] @ [4, 5].
  EXPECT_GRADCHECK(kMatmul, {randn64({2, 3, 4}), randn64({4, 5})});
  // A shared left operand: [3, 4] @ [2, 4, 5].
  EXPECT_GRADCHECK(kMatmul, {randn64({3, 4}), randn64({2, 4, 5})});
  // 1-D operands against a batch.
  EXPECT_GRADCHECK(kMatmul, {randn64({4}), randn64({2, 4, 5})});
  EXPECT_GRADCHECK(kMatmul, {randn64({2, 3, 4}), randn64({4})});
  // Broadcast with a transposed (column-major) shared operand.
  EXPECT_GRADCHECK(kMatmul, {randn64({2, 3, 4}), randn64_transposed({4, 5})});
}

TEST(GradCheck, MatmulTransposedInput) {
  manual_seed(3);
  EXPECT_GRADCHECK(kMatmul, {randn64_transposed({3, 4}), randn64({4, 5})});
  EXPECT_GRADCHECK(kMatmul, {randn64_transposed({3, 4}), randn64_transposed({4, 5})});
  EXPECT_GRADCHECK(kMatmul, {randn64_transposed({2, 3, 4}), randn64_transposed({2, 4, 5})});
  // A permuted batch: [3, 2, 4] viewed as [2, 3, 4] (batch stride smaller than the row stride).
  Tensor base = randn({3, 2, 4}, f64());
  base.requires_grad_(true);
  EXPECT_GRADCHECK(kMatmul, {base.permute({1, 0, 2}), randn64({4, 5})});
}

TEST(GradCheck, Bmm) {
  manual_seed(4);
  const Fn f = [](const std::vector<Tensor>& x) { return bmm(x[0], x[1]); };
  EXPECT_GRADCHECK(f, {randn64({2, 3, 4}), randn64({2, 4, 5})});
  EXPECT_GRADCHECK(f, {randn64({2, 3, 4}), randn64_transposed({2, 4, 5})});
}

TEST(GradCheck, Linear) {
  manual_seed(41);
  const Fn f = [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); };
  EXPECT_GRADCHECK(f, {randn64({3, 4}), randn64({5, 4}), randn64({5})});
  EXPECT_GRADCHECK(f, {randn64({2, 3, 4}), randn64({5, 4}), randn64({5})});
  EXPECT_GRADCHECK(f, {randn64({4}), randn64({5, 4}), randn64({5})});  // a single row
  // No bias; a non-contiguous input (a transposed view, and a strided slice copied first) and weight.
  const Fn no_bias = [](const std::vector<Tensor>& x) { return linear(x[0], x[1]); };
  EXPECT_GRADCHECK(no_bias, {randn64_transposed({3, 4}), randn64({5, 4})});
  EXPECT_GRADCHECK(f, {randn64_strided(3, 4), randn64_transposed({5, 4}), randn64({5})});
  // Only the bias, or only the input, requires grad.
  EXPECT_GRADCHECK(f, {randn({3, 4}, f64()), randn({5, 4}, f64()), randn64({5})});
  EXPECT_GRADCHECK(f, {randn64({3, 4}), randn({5, 4}, f64()), randn({5}, f64())});
}

// Several linear layers of one input as one node: x's gradient summed in the GEMMs. The outputs
// concatenated (each gets its own slice of the upstream gradient, a non-contiguous one); one
// output unused; x also read beside the node (the engine adds that to the node's sum).
TEST(GradCheck, Linears) {
  manual_seed(42);
  const Fn all = [](const std::vector<Tensor>& x) {
    return cat(linears(x[0], {x[1], x[2], x[4]}, {x[3], Tensor(), x[5]}), -1);
  };
  EXPECT_GRADCHECK(all,
                   {randn64({2, 3, 4}), randn64({5, 4}), randn64({2, 4}), randn64({5}), randn64({3, 4}), randn64({3})});
  EXPECT_GRADCHECK(all, {randn64_transposed({3, 4}), randn64({5, 4}), randn64_transposed({2, 4}), randn64({5}),
                         randn64({3, 4}), randn64({3})});
  const Fn skip_middle = [](const std::vector<Tensor>& x) {
    std::vector<Tensor> o = linears(x[0], {x[1], x[2], x[3]}, {Tensor(), Tensor(), Tensor()});
    return cat({o[0], o[2], x[0] * 2.0}, -1);
  };
  EXPECT_GRADCHECK(skip_middle, {randn64({3, 4}), randn64({5, 4}), randn64({2, 4}), randn64({3, 4})});
  EXPECT_GRADCHECK(skip_middle, {randn64({4}), randn64({5, 4}), randn64({2, 4}), randn64({3, 4})});  // one row
  // Only the weights, or only the input, require grad.
  EXPECT_GRADCHECK(
      all, {randn({3, 4}, f64()), randn64({5, 4}), randn64({2, 4}), randn64({5}), randn64({3, 4}), randn({3}, f64())});
  EXPECT_GRADCHECK(all, {randn64({3, 4}), randn({5, 4}, f64()), randn({2, 4}, f64()), randn({5}, f64()),
                         randn({3, 4}, f64()), randn({3}, f64())});
}

// The same layers packed in one buffer (x[1]: the three weights' rows, x[2]: the biases): one
// GEMM forward; concatenated in order the outputs' gradients come back as one buffer's column
// blocks (one GEMM each for dx and dw); in another order, or one unused, layer by layer.
TEST(GradCheck, LinearsPacked) {
  manual_seed(43);
  const auto layers = [](const std::vector<Tensor>& x) {
    return linears(x[0], {narrow(x[1], 0, 0, 5), narrow(x[1], 0, 5, 2), narrow(x[1], 0, 7, 3)},
                   {narrow(x[2], 0, 0, 5), narrow(x[2], 0, 5, 2), narrow(x[2], 0, 7, 3)});
  };
  const Fn in_order = [&](const std::vector<Tensor>& x) { return cat(layers(x), -1); };
  const Fn reordered = [&](const std::vector<Tensor>& x) {
    std::vector<Tensor> o = layers(x);
    return cat({o[2], o[0], o[1] * 3.0}, -1);
  };
  const Fn skip_middle = [&](const std::vector<Tensor>& x) {
    std::vector<Tensor> o = layers(x);
    return cat({o[0], o[2]}, -1);
  };
  for (const Fn& f : {in_order, reordered, skip_middle}) {
    EXPECT_GRADCHECK(f, {randn64({2, 3, 4}), randn64({10, 4}), randn64({10})});
    EXPECT_GRADCHECK(f, {randn64_transposed({3, 4}), randn64({10, 4}), randn({10}, f64())});
  }
}

TEST(GradCheck, Softmax) {
  manual_seed(5);
  for (int64_t dim : {-1, 0}) {
    const Fn f = [dim](const std::vector<Tensor>& x) { return softmax(x[0], dim); };
    EXPECT_GRADCHECK(f, {randn64({3, 5})});
    EXPECT_GRADCHECK(f, {randn64_transposed({4, 3})});
  }
  // Over a middle dim (inner > 1).
  const Fn mid = [](const std::vector<Tensor>& x) { return softmax(x[0], 1); };
  EXPECT_GRADCHECK(mid, {randn64({2, 3, 4})});
  EXPECT_GRADCHECK(mid, {randn64_transposed({2, 4, 3})});
}

TEST(GradCheck, LogSoftmax) {
  manual_seed(6);
  const Fn last = [](const std::vector<Tensor>& x) { return log_softmax(x[0], -1); };
  EXPECT_GRADCHECK(last, {randn64({3, 5})});
  EXPECT_GRADCHECK(last, {randn64_transposed({4, 3})});
  const Fn mid = [](const std::vector<Tensor>& x) { return log_softmax(x[0], 1); };
  EXPECT_GRADCHECK(mid, {randn64({2, 3, 4})});
  EXPECT_GRADCHECK(mid, {randn64_transposed({2, 3, 4})});
  const Fn first = [](const std::vector<Tensor>& x) { return log_softmax(x[0], 0); };
  EXPECT_GRADCHECK(first, {randn64({4, 3})});
}

TEST(GradCheck, LayerNorm) {
  manual_seed(7);
  const Fn affine = [](const std::vector<Tensor>& x) { return layer_norm(x[0], {6}, x[1], x[2]); };
  EXPECT_GRADCHECK(affine, {randn64({4, 6}), randn64({6}), randn64({6})});
  EXPECT_GRADCHECK(affine, {randn64_transposed({4, 6}), randn64({6}), randn64({6})});
  // Two normalized dims.
  const Fn two = [](const std::vector<Tensor>& x) { return layer_norm(x[0], {3, 4}, x[1], x[2], 1e-3); };
  EXPECT_GRADCHECK(two, {randn64({2, 3, 4}), randn64({3, 4}), randn64({3, 4})});
  // Weight only.
  const Fn w_only = [](const std::vector<Tensor>& x) { return layer_norm(x[0], {5}, x[1]); };
  EXPECT_GRADCHECK(w_only, {randn64({3, 5}), randn64({5})});
  // Bias only, and no affine parameters at all (more in LayerNormNoAffine).
  const Fn b_only = [](const std::vector<Tensor>& x) { return layer_norm(x[0], {5}, Tensor(), x[1]); };
  EXPECT_GRADCHECK(b_only, {randn64({3, 5}), randn64({5})});
  const Fn none = [](const std::vector<Tensor>& x) { return layer_norm(x[0], {5}); };
  EXPECT_GRADCHECK(none, {randn64_transposed({3, 5})});
}

TEST(GradCheck, AddLayerNorm) {
  manual_seed(9);
  // Both outputs matter: the sum feeds the next residual, the norm the next sublayer.
  const Fn both = [](const std::vector<Tensor>& x) {
    auto [s, y] = add_layer_norm(x[0], x[1], {6}, x[2], x[3]);
    return add(mul(s, 0.5), y);
  };
  EXPECT_GRADCHECK(both, {randn64({4, 6}), randn64({4, 6}), randn64({6}), randn64({6})});
  EXPECT_GRADCHECK(both, {randn64_transposed({4, 6}), randn64({4, 6}), randn64({6}), randn64({6})});
  const Fn norm_only = [](const std::vector<Tensor>& x) { return add_layer_norm(x[0], x[1], {5}).second; };
  EXPECT_GRADCHECK(norm_only, {randn64({2, 3, 5}), randn64({2, 3, 5})});
  // With the residual branch's dropout (its mask frozen by re-seeding).
  const Fn dropped = [](const std::vector<Tensor>& x) {
    manual_seed(4321);
    auto [s, y] = add_layer_norm(x[0], x[1], {6}, x[2], Tensor(), 1e-5, 0.4);
    return add(mul(s, 0.5), y);
  };
  EXPECT_GRADCHECK(dropped, {randn64({4, 6}), randn64({4, 6}), randn64({6})});
}

TEST(GradCheck, LayerNormNoAffine) {
  manual_seed(8);
  const Fn f = [](const std::vector<Tensor>& x) { return layer_norm(x[0], {5}); };
  EXPECT_GRADCHECK(f, {randn64({4, 5})});
  EXPECT_GRADCHECK(f, {randn64_transposed({2, 4, 5})});
}

TEST(GradCheck, Normalize) {
  manual_seed(10);
  const Fn unit = [](const std::vector<Tensor>& x) { return normalize(x[0]); };
  EXPECT_GRADCHECK(unit, {randn64({4, 6})});
  EXPECT_GRADCHECK(unit, {randn64_transposed({2, 3, 5})});
  // eps = 2 clamps the first rows (norms near 0.3: y = x / 2) and not the last (near 30).
  const Fn clamped = [](const std::vector<Tensor>& x) { return normalize(x[0], 2.0); };
  EXPECT_GRADCHECK(clamped, {cat({mul(randn64({2, 3}), 0.2), mul(randn64({2, 3}), 20.0)}, 0)});
}

// Dens kept away from tiny (the clamp's kink), with a flag per query that hides some rows.
TEST(GradCheck, SumsRatio) {
  manual_seed(12);
  const Tensor vis = tensor<bool>({true, false, true, true, false, true}, {2, 1, 3, 1});
  for (const Tensor& v : {Tensor(), vis}) {
    const Fn f = [v](const std::vector<Tensor>& x) {
      return sums_ratio(cat({x[0], exp(x[1])}, 3), v, 1e-18);  // positive dens
    };
    EXPECT_GRADCHECK(f, {randn64({2, 2, 3, 4}), randn64({2, 2, 3, 1})});
  }
}

TEST(GradCheck, SqNorm) {
  manual_seed(11);
  const Fn plain = [](const std::vector<Tensor>& x) { return sq_norm(x[0]); };
  EXPECT_GRADCHECK(plain, {randn64({4, 6})});
  const Fn half = [](const std::vector<Tensor>& x) { return sq_norm(x[0], -0.5); };
  EXPECT_GRADCHECK(half, {randn64_transposed({2, 3, 5})});
  EXPECT_GRADCHECK(half, {randn64({7})});
}

TEST(GradCheck, CrossEntropy) {
  manual_seed(9);
  const Tensor target = tensor<int64_t>({2, -100, 0, 3, 1}, {5});
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double s : {0.0, 0.1}) {
      const Fn f = [&target, red, s](const std::vector<Tensor>& x) {
        return cross_entropy(x[0], target, -100, s, red);
      };
      EXPECT_GRADCHECK(f, {randn64({5, 4})});
      EXPECT_GRADCHECK(f, {randn64_transposed({5, 4})});
    }
  }
  // A custom ignore_index that is also a valid class id.
  const Tensor t_custom = tensor<int64_t>({2, 1, 0, 3, 0}, {5});
  const Fn custom = [&t_custom](const std::vector<Tensor>& x) { return cross_entropy(x[0], t_custom, 0, 0.2); };
  EXPECT_GRADCHECK(custom, {randn64({5, 4})});
  // A single sample: logits [C] with a 0-d target.
  const Tensor t0 = full({}, 2.0, TensorOptions(DType::Int64));
  const Fn single = [&t0](const std::vector<Tensor>& x) { return cross_entropy(x[0], t0, -100, 0.1); };
  EXPECT_GRADCHECK(single, {randn64({4})});
}

TEST(GradCheck, Dropout) {
  // Re-seeding inside f freezes the mask across the evaluations of the check.
  for (double p : {0.3, 0.7}) {
    const Fn f = [p](const std::vector<Tensor>& x) {
      manual_seed(1234);
      return dropout(x[0], p, true);
    };
    manual_seed(10);
    EXPECT_GRADCHECK(f, {randn64({4, 5})});
    EXPECT_GRADCHECK(f, {randn64_transposed({4, 5})});
  }
  const Fn eval = [](const std::vector<Tensor>& x) { return mul(dropout(x[0], 0.5, false), 2.0); };
  EXPECT_GRADCHECK(eval, {randn64({3, 2})});
}

TEST(GradCheck, ActivationDropout) {
  // The activation folded into the dropout; the mask frozen by re-seeding inside f.
  for (UnaryOp act : {UnaryOp::GeluErf, UnaryOp::GeluTanh, UnaryOp::Relu}) {
    SCOPED_TRACE(unary_op_name(act));
    const Fn f = [act](const std::vector<Tensor>& x) {
      manual_seed(99);
      return activation_dropout(x[0], act, 0.4, true);
    };
    EXPECT_GRADCHECK(f, {randn64({3, 7})});
    EXPECT_GRADCHECK(f, {randn64_transposed({4, 5})});
  }
}

}  // namespace
}  // namespace linea
