// linea::dist's collectives and the gradient reducer, run as an MPI job:
//   mpirun -np 2 --oversubscribe build/release/test_dist      (ctest runs it so; see CMakeLists.txt)
// Every rank fills its tensors with values that depend on (element, rank), so each rank can
// compute what the collective must give by itself. With one process (no launcher) the same
// tests run as a world of one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "nn/data_parallel.h"
#include "nn/dist.h"
#include "nn/dist_backend.h"
#include "nn/layers.h"
#include "nn/sampler.h"
#include "tests/mpi/gtest_mpi.h"
#include "tests/test_util.h"

using namespace linea;

namespace {

int W() { return dist::world_size(); }
int R() { return dist::rank(); }

// Element i of rank r's tensor: small integers (exact in every dtype and sum).
double value(int64_t i, int r) { return static_cast<double>((i * 7 + 3) % 11) - 5.0 + 16.0 * r; }

Tensor rank_tensor(const Shape& shape, DType dt, int r) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = dt == DType::Bool ? ((i + r) % 3 == 0) : value(i, r);
  return from_vector<double>(v, shape).to(dt);
}

// Empty, one element, odd sizes, and one of 4 MB.
const std::vector<Shape> kShapes = {{0}, {1}, {7}, {3, 5, 7}, {(1 << 20) + 3}};

}  // namespace

TEST(Dist, Describe) {
  EXPECT_GE(R(), 0);
  EXPECT_LT(R(), W());
  EXPECT_GE(dist::local_rank(), 0);
  EXPECT_LE(dist::local_size(), W());
  EXPECT_FALSE(dist::describe().empty());
}

TEST(Dist, AllReduceEqualsTheSumComputedOnOneRank) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    for (const Shape& shape : kShapes) {
      Tensor t = rank_tensor(shape, dt, R());
      dist::all_reduce(t);
      Tensor expect = zeros(shape, TensorOptions(DType::Float64));
      for (int r = 0; r < W(); ++r) expect = expect + rank_tensor(shape, DType::Float64, r);
      EXPECT_EQ(t.dtype(), dt);
      EXPECT_EQ(t.to_vector<double>(), expect.to_vector<double>()) << dtype_name(dt) << " " << shape_str(shape);
    }
  }
}

TEST(Dist, MeanMaxMinAndBool) {
  const Shape shape{13};
  Tensor mean_t = rank_tensor(shape, DType::Float64, R()), max_t = rank_tensor(shape, DType::Int64, R()),
         min_t = rank_tensor(shape, DType::Float32, R());
  dist::all_reduce(mean_t, dist::ReduceOp::Mean);
  dist::all_reduce(max_t, dist::ReduceOp::Max);
  dist::all_reduce(min_t, dist::ReduceOp::Min);
  for (int64_t i = 0; i < 13; ++i) {
    double s = 0;
    for (int r = 0; r < W(); ++r) s += value(i, r);
    EXPECT_DOUBLE_EQ(mean_t.to_vector<double>()[i], s / W());
    EXPECT_EQ(max_t.to_vector<double>()[i], value(i, W() - 1));
    EXPECT_EQ(min_t.to_vector<double>()[i], value(i, 0));
  }
  Tensor any = rank_tensor(shape, DType::Bool, R()), all = rank_tensor(shape, DType::Bool, R());
  dist::all_reduce(any, dist::ReduceOp::Max);
  dist::all_reduce(all, dist::ReduceOp::Min);
  for (int64_t i = 0; i < 13; ++i) {
    bool a = false, b = true;
    for (int r = 0; r < W(); ++r) a = a || (i + r) % 3 == 0, b = b && (i + r) % 3 == 0;
    EXPECT_EQ(any.to_vector<double>()[i], a ? 1.0 : 0.0);
    EXPECT_EQ(all.to_vector<double>()[i], b ? 1.0 : 0.0);
  }
  Tensor b = rank_tensor(shape, DType::Bool, R());
  EXPECT_LINEA_ERROR(dist::all_reduce(b), "Sum and Mean of a bool tensor");
  Tensor i = rank_tensor(shape, DType::Int64, R());
  EXPECT_LINEA_ERROR(dist::all_reduce(i, dist::ReduceOp::Mean), "Mean needs a floating tensor");
  Tensor strided = zeros({4, 4}).transpose(0, 1);
  EXPECT_LINEA_ERROR(dist::all_reduce(strided), "expected a contiguous tensor");
}

TEST(Dist, AsyncReductionsCompleteInAnyWaitOrder) {
  std::vector<Tensor> ts;
  std::vector<dist::Work> works;
  for (int k = 0; k < 5; ++k) {
    ts.push_back(rank_tensor({100 + k}, DType::Float32, R()));
    works.push_back(dist::all_reduce_async(ts.back()));
  }
  for (int k = 4; k >= 0; --k) works[static_cast<size_t>(k)].wait();
  for (int k = 0; k < 5; ++k) {
    Tensor expect = zeros({100 + k}, TensorOptions(DType::Float64));
    for (int r = 0; r < W(); ++r) expect = expect + rank_tensor({100 + k}, DType::Float64, r);
    EXPECT_EQ(ts[static_cast<size_t>(k)].to_vector<double>(), expect.to_vector<double>());
  }
}

TEST(Dist, BroadcastAndBroadcastString) {
  const int root = W() - 1;
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64, DType::Bool}) {
    for (const Shape& shape : kShapes) {
      Tensor t = rank_tensor(shape, dt, R());
      dist::broadcast(t, root);
      EXPECT_EQ(t.to_vector<double>(), rank_tensor(shape, dt, root).to_vector<double>());
    }
  }
  std::string s = R() == root ? std::string("from the root: \0 and more", 25) : "mine";
  dist::broadcast_string(s, root);
  EXPECT_EQ(s, std::string("from the root: \0 and more", 25));
  std::string empty = R() == 0 ? "" : "not empty";
  dist::broadcast_string(empty, 0);
  EXPECT_EQ(empty, "");
  Tensor t = zeros({2});
  EXPECT_LINEA_ERROR(dist::broadcast(t, W()), "is not a rank of");
}

TEST(Dist, AllGatherStacksEveryRanksTensor) {
  for (DType dt : {DType::Float32, DType::Int64, DType::Bool}) {
    for (const Shape& shape : {Shape{0}, Shape{1}, Shape{2, 3}}) {
      Tensor g = dist::all_gather(rank_tensor(shape, dt, R()));
      Shape expect_shape = shape;
      expect_shape.insert(expect_shape.begin(), W());
      ASSERT_EQ(g.shape(), expect_shape);
      for (int r = 0; r < W(); ++r)
        EXPECT_EQ(g.select(0, r).contiguous().to_vector<double>(), rank_tensor(shape, dt, r).to_vector<double>());
    }
  }
  if (W() > 1) {  // another shape on one rank: an error on every rank, not a hang
    EXPECT_LINEA_ERROR(dist::all_gather(zeros({R() == 1 ? 3 : 2})), "passed another dtype or shape");
  }
}

TEST(Dist, CheckSameFindsTheRankThatDiffers) {
  EXPECT_NO_THROW(dist::check_same("same settings", "test"));
  if (W() > 1) {
    EXPECT_LINEA_ERROR(dist::check_same(R() == 1 ? "other" : "same", "test"), "rank(s) 1 differ from rank 0");
  }
}

// The reducer's average of the ranks' slices equals the whole batch's gradient on one process:
// float64, several buckets, a parameter that gets no gradient, unequal slices (10 over W ranks).
TEST(Dist, GradientReducerAveragesTheSlicesLikeOneBatch) {
  manual_seed(5);
  auto a = std::make_shared<nn::Linear>(5, 4), b = std::make_shared<nn::Linear>(4, 2),
       unused = std::make_shared<nn::Linear>(2, 2);
  for (auto* m : {a.get(), b.get(), unused.get()}) m->to(DType::Float64);
  std::vector<Tensor> params;
  for (auto* m : {a.get(), b.get(), unused.get()})
    for (const Tensor& p : m->parameters()) params.push_back(p);
  const Tensor x = randn({10, 5}, TensorOptions(DType::Float64)), y = randn({10, 2}, TensorOptions(DType::Float64));
  const auto loss_of = [&](const Tensor& xs, const Tensor& ys) {
    return mean(square((*b)(tanh((*a)(xs))) - ys));  // a mean over the rows
  };
  // One process, the whole batch.
  for (Tensor& p : params) p.zero_grad();
  loss_of(x, y).backward();
  std::vector<std::vector<double>> expect;
  for (Tensor& p : params) expect.push_back(p.grad().defined() ? p.grad().to_vector<double>() : std::vector<double>());
  // This rank's slice, weighted by its share of the rows.
  for (int64_t bucket_bytes : {int64_t(64), nn::GradientReducer::kDefaultBucketBytes}) {
    nn::GradientReducer reducer(params, bucket_bytes);
    if (bucket_bytes == 64) {
      EXPECT_GE(reducer.num_buckets(), 3);
    }
    for (int step = 0; step < 2; ++step) {  // twice: the reducer resets between steps
      for (Tensor& p : params) p.zero_grad();
      const nn::ShardRange sh = nn::shard_range(10, R(), W());
      reducer.prepare(static_cast<double>(sh.count) / 10.0);
      if (sh.count > 0) loss_of(x.narrow(0, sh.first, sh.count), y.narrow(0, sh.first, sh.count)).backward();
      reducer.finish();
      for (size_t k = 0; k < params.size(); ++k) {
        const Tensor g = params[k].grad();
        if (expect[k].empty()) {  // unused: zeros after a reduction, nothing on one process
          if (W() > 1) {
            EXPECT_EQ(g.to_vector<double>(), std::vector<double>(static_cast<size_t>(g.numel()), 0.0));
          }
          continue;
        }
        ASSERT_TRUE(g.defined()) << k;
        const std::vector<double> got = g.to_vector<double>();
        for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[k][i], 1e-14) << k << " " << i;
      }
    }
  }
}

TEST(Dist, BroadcastParametersGivesRankZerosWeights) {
  manual_seed(100 + static_cast<uint64_t>(R()));  // different weights on every rank
  nn::Linear lin(3, 2);
  nn::broadcast_parameters(lin);
  manual_seed(100);
  nn::Linear rank0(3, 2);
  EXPECT_EQ(lin.weight().to_vector<double>(), rank0.weight().to_vector<double>());
  EXPECT_EQ(lin.bias().to_vector<double>(), rank0.bias().to_vector<double>());
}

TEST(Dist, ShardRangesCoverTheBatchInOrder) {
  for (int world : {1, 2, 3, 8})
    for (int64_t n : {0, 1, 7, 128}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const nn::ShardRange s = nn::shard_range(n, r, world);
        EXPECT_EQ(s.first, next);
        EXPECT_LE(s.count, (n + world - 1) / world);
        EXPECT_GE(s.count, n / world);
        next += s.count;
      }
      EXPECT_EQ(next, n);
    }
  auto inner = std::make_shared<nn::FixedSizeBatchSampler>(11, 4, true, 9);
  nn::ShardedBatchSampler s0(inner, 0, 2), s1(inner, 1, 2);
  const auto whole = inner->batches(3), b0 = s0.batches(3), b1 = s1.batches(3);
  ASSERT_EQ(b0.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    std::vector<int64_t> joined = b0[i];
    joined.insert(joined.end(), b1[i].begin(), b1[i].end());
    EXPECT_EQ(joined, whole[i]);
  }
  EXPECT_LINEA_ERROR(nn::ShardedBatchSampler(inner, 2, 2), "is not a rank of");
}

// Several ranks on one machine: local rank r takes entry r (mod their number) of the GPUs the
// launcher left visible, or of the driver's where it left none. (dist::init sets it before CUDA
// starts; only the choice is tested here: this machine may have no GPU.)
TEST(Dist, EachLocalRankTakesAGpuOfItsOwn) {
  using dist::detail::gpu_for_local_rank;
  EXPECT_EQ(gpu_for_local_rank("3,5", 8, 0), "3");
  EXPECT_EQ(gpu_for_local_rank("3,5", 8, 1), "5");
  EXPECT_EQ(gpu_for_local_rank("3,5", 8, 2), "3");  // more ranks than GPUs: they share, in turn
  EXPECT_EQ(gpu_for_local_rank("GPU-1f2e", 8, 1), "GPU-1f2e");
  EXPECT_EQ(gpu_for_local_rank(",GPU-1f2e,,7,", 0, 1), "7");  // empty entries skipped
  EXPECT_EQ(gpu_for_local_rank(nullptr, 4, 6), "2");
  EXPECT_EQ(gpu_for_local_rank("", 4, 1), "1");
  EXPECT_EQ(gpu_for_local_rank(nullptr, 0, 1), "");  // no GPU: the variable is left alone
  EXPECT_EQ(gpu_for_local_rank(",", 4, 1), "");      // none visible, as the launcher said
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dist::init();
  // Dist.FailingRankEndsTheJob (CMakeLists.txt): one rank fails while the others wait in a
  // collective; abort_job must end them all with the rank's message instead of a hang.
  if (const char* r = std::getenv("LINEA_TEST_FAIL_RANK")) {
    if (dist::rank() == std::atoi(r)) dist::abort_job("test_dist", "deliberate failure");
    dist::barrier();  // never returns on the others: the failing rank is not there
    std::fprintf(stderr, "test_dist: the barrier returned without the failing rank\n");
    return 0;
  }
  return test::run_all_tests_on_every_rank();
}
