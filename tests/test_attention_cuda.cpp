// CUDA parity of every attention mechanism: one mechanism built on the CPU, a copy of it (same
// parameters, same random samples passed with set_samples) moved to CUDA, and the forward
// values plus the gradients of q, k, v and of the mechanism's own parameters compared with
// |cuda - cpu| <= atol + rtol * |cpu|, in float32 and float64. Variants: causal, key padding,
// cross-attention, eval mode, feature map and proposal options. Skipped without a GPU; CI runs it on
// the CUDA emulator (tests/cuda_emu).
#include <cstdio>
#include <string>
#include <vector>

#include "attention/nprf_rpe/toeplitz.h"
#include "attention/transformer.h"
#include "core/cuda_counters.h"
#include "nn/data.h"
#include "nn/optim.h"
#include "tests/test_util.h"

#ifdef LINEA_WITH_CUDA
#include "core/cuda_interface.h"
#endif

namespace linea {
namespace {

const Device kCuda(DeviceType::CUDA, 0);

struct Case {
  std::string spec;
  bool causal = false, padded = false, cross = false, eval = false;
  std::string name() const {
    return spec + (causal ? " causal" : "") + (padded ? " padded" : "") + (cross ? " cross" : "") +
           (eval ? " eval" : "");
  }
};

// float32: the mechanisms chain exp/log/FFT/GEMMs whose CUDA versions round differently from
// the CPU's (a few ulp each, amplified by the normalizations); float64 keeps 1e-9.
struct Tol {
  double atol, rtol;
};
Tol tol(DType dt) { return dt == DType::Float32 ? Tol{1e-4, 1e-3} : Tol{1e-9, 1e-9}; }

// projected: the CUDA side's q, k, v are the heads of [B, L, H, D] tensors (as MultiHeadAttention
// splits a projection: strided views, which the softmax kernels read in place).
void expect_mechanism_parity(const Case& c, DType dt, bool projected) {
  SCOPED_TRACE(c.name() + " (" + dtype_name(dt) + (projected ? ", heads of [B, L, H, D]" : "") + ")");
  const int64_t B = 2, H = 2, N = 7, M = c.cross ? 5 : N, D = 4, Dv = 3;
  auto cpu = attn::make_attention(c.spec, H, D);
  cpu->to(dt);
  // Nonzero parameters (rpe starts at 0, which would hide a wrong bias path).
  for (auto& [name, p] : cpu->named_parameters()) {
    NoGradGuard ng;
    nn::replace_data(p, mul(randn(p.shape(), TensorOptions(dt)), 0.5));
  }
  cpu->train(!c.eval);
  cpu->freeze_samples(true);
  auto gpu = attn::make_attention(c.spec, H, D);
  gpu->to(dt);
  gpu->load_state_dict(cpu->state_dict());
  gpu->to(kCuda);
  gpu->train(!c.eval);

  Tensor q = randn({B, H, N, D}, TensorOptions(dt)), k = randn({B, H, M, D}, TensorOptions(dt)),
         v = randn({B, H, M, Dv}, TensorOptions(dt));
  attn::AttentionOptions oc, og;
  oc.causal = og.causal = c.causal;
  if (c.padded) {
    std::vector<int64_t> pad(static_cast<size_t>(B * M), 0);
    pad[static_cast<size_t>(M - 1)] = 1;  // batch 0: last key padded
    pad[static_cast<size_t>(M + 1)] = 1;  // batch 1: keys 1 and M-2 padded
    pad[static_cast<size_t>(2 * M - 2)] = 1;
    oc.key_padding_mask = from_vector<int64_t>(pad, {B, M});
    og.key_padding_mask = oc.key_padding_mask.to(kCuda);
  }
  Tensor qc = q.detach(), kc = k.detach(), vc = v.detach();
  // The CUDA leaves: [B, H, L, D], or [B, L, H, D] whose heads are taken below.
  const auto leaf = [&](const Tensor& x) {
    return projected ? contiguous(permute(x, {0, 2, 1, 3})).to(kCuda) : x.to(kCuda);
  };
  const auto heads = [&](const Tensor& x) { return projected ? permute(x, {0, 2, 1, 3}) : x; };
  Tensor qg = leaf(q), kg = leaf(k), vg = leaf(v);
  for (Tensor* t : {&qc, &kc, &vc, &qg, &kg, &vg}) t->requires_grad_(true);

  const Tensor ref = cpu->forward(qc, kc, vc, oc);
  gpu->set_samples(cpu->last_samples());
  const Tensor got = gpu->forward(heads(qg), heads(kg), heads(vg), og);
  ASSERT_EQ(got.device(), kCuda);
  const Tol t = tol(dt);
  EXPECT_TRUE(test::all_close(got.to(kCPU), ref, t.atol, t.rtol)) << "forward";

  const Tensor g = randn(ref.shape(), TensorOptions(dt));
  ref.backward(g);
  got.backward(g.to(kCuda));
  const char* names[] = {"dq", "dk", "dv"};
  const Tensor* cg[] = {&qc, &kc, &vc};
  const Tensor* gg[] = {&qg, &kg, &vg};
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(test::all_close(heads(gg[i]->grad()).to(kCPU), cg[i]->grad(), t.atol, t.rtol)) << names[i];
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i)
    EXPECT_TRUE(test::all_close(pg[i].second.grad().to(kCPU), pc[i].second.grad(), t.atol, t.rtol))
        << "grad of " << pc[i].first;
}

void run_cases(const std::vector<Case>& cases, uint64_t seed) {
  manual_seed(seed);
  for (DType dt : {DType::Float32, DType::Float64})
    for (const Case& c : cases)
      for (bool projected : {false, true}) expect_mechanism_parity(c, dt, projected);
}

TEST(AttentionCudaParity, Softmax) {
  LINEA_REQUIRE_CUDA();
  run_cases({{"softmax"}, {"softmax", true, true}, {"softmax", false, true, true}}, 1);
}

TEST(AttentionCudaParity, Performer) {
  LINEA_REQUIRE_CUDA();
  run_cases({{"performer:features=6"},
             {"performer:features=6,chunk=3", true, true},
             {"performer:features=6", true, true},  // fused causal (float32; chunks of 64)
             {"performer:features=5", false, true, true},
             {"performer:features=6,feature_map=relu", true},
             {"performer:features=6,feature_map=trf", false, true},
             {"performer:features=6", false, false, false, true}},
            2);
}

TEST(AttentionCudaParity, Ra) {
  LINEA_REQUIRE_CUDA();
  run_cases({{"ra:samples=3"}, {"ra:samples=2,biased=1", false, true}, {"ra:biased=1", false, false, false, true}},
            3);
}

TEST(AttentionCudaParity, Lara) {
  LINEA_REQUIRE_CUDA();
  run_cases({{"lara:samples=3"},
             {"lara:samples=3,proposal=mixed", false, true},
             {"lara:samples=2,adaptive=1"},
             {"lara:samples=4", false, false, false, true}},
            4);
}

TEST(AttentionCudaParity, NprfRpe) {
  LINEA_REQUIRE_CUDA();
  run_cases({{"nprf_rpe:features=6,max_len=8,dense=0"},
             {"nprf_rpe:features=6,max_len=8,dense=0", true, true},
             {"nprf_rpe:features=5,max_len=8,dense=0", false, true, true},
             {"nprf_rpe:features=6,max_len=8,dense=1", true}},
            5);
}

// Whether the CUDA allocator caches its blocks: with LINEA_NO_CUDA_MEMORY_CACHING=1 (the
// emulator's second pass) every buffer is a device allocation of its own.
bool cuda_caches() {
#ifdef LINEA_WITH_CUDA
  return cuda::allocator().caching();
#else
  return true;
#endif
}

// Decoding on CUDA, a position at a time with padding, equals the CPU's (softmax: the step's keys
// and values, one tensor's heads as a projection gives them, written into the cache's buffer by one
// copy, its padding by another, then one attention kernel that reads them in place, 3 launches where
// a cache joined by cat took 7; performer's softmax
// map: one fused op a step, favor_attention_step: its four kernels, the step's padding read in
// place from its column of the decoder's mask; relu's composed path) in float32; from the third
// step on (the first has no sums to rescale: the first two fill the caching allocator), a step asks
// the device for its kernels alone: within the budget, no synchronization, allocation or host copy.
// A beam reorder after the third step selects each state tensor once (softmax: the keys and values
// together, then the padding, into buffers of the same room, so the steps after it still write in
// place, allocating nothing).
TEST(AttentionCudaDecoding, StepsEqualTheCpusWithinALaunchBudget) {
  LINEA_REQUIRE_CUDA();
  struct Budget {
    std::string spec;
    int64_t most, reorder_most;
  };
  for (const Budget& b : std::vector<Budget>{{"softmax", 3, 2},
                                             {"performer:features=6,redraw=0", 4, 2},
                                             {"performer:features=6,redraw=0,feature_map=relu", 40, 1}}) {
    SCOPED_TRACE(b.spec);
    manual_seed(9);
    const int64_t B = 2, H = 2, L = 6, D = 4;
    auto cpu = attn::make_attention(b.spec, H, D, attn::AttentionUse::CausalSelf);
    auto gpu = attn::make_attention(b.spec, H, D, attn::AttentionUse::CausalSelf);
    gpu->load_state_dict(cpu->state_dict());
    gpu->to(kCuda);
    cpu->eval();
    gpu->eval();
    NoGradGuard ng;
    const Tensor q = randn({B, H, L, D}), kv = randn({B, 2 * H, L, D});
    const Tensor k = narrow(kv, 1, 0, H), v = narrow(kv, 1, H, H);
    const Tensor pad = from_vector<int64_t>({0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0}, {B, L}).to(DType::Bool);
    const Tensor qg = q.to(kCuda), kvg = kv.to(kCuda), pg = pad.to(kCuda);
    const Tensor kg = narrow(kvg, 1, 0, H), vg = narrow(kvg, 1, H, H);
    auto sc = cpu->start_decoding(), sg = gpu->start_decoding();
    const Tensor beams = from_vector<int64_t>({1, 1}, {B}), beams_g = beams.to(kCuda);  // both rows continue row 1
    for (int64_t t = 0; t < L; ++t) {
      if (t == 3) {  // a beam search's reorder: one select per state tensor, the buffers' room kept
        sc->reorder(beams);
        const cuda::Counters before = cuda::counters();
        sg->reorder(beams_g);
        const cuda::Counters c = cuda::counters() - before;
        EXPECT_LE(c.kernel_launches + c.library_calls, b.reorder_most) << "reorder: " << c.str();
        EXPECT_EQ(c.host_syncs + c.host_waits + c.h2d_copies + c.d2h_copies, 0) << "reorder: " << c.str();
      }
      const Tensor ref =
          cpu->decode_step(narrow(q, 2, t, 1), narrow(k, 2, t, 1), narrow(v, 2, t, 1), *sc, narrow(pad, 1, t, 1));
      const cuda::Counters before = cuda::counters();
      const Tensor got =
          gpu->decode_step(narrow(qg, 2, t, 1), narrow(kg, 2, t, 1), narrow(vg, 2, t, 1), *sg, narrow(pg, 1, t, 1));
      const cuda::Counters c = cuda::counters() - before;
      EXPECT_TRUE(test::all_close(got.to(kCPU), ref, 1e-5, 1e-4)) << "step " << t;
      if (t < 2) continue;
      EXPECT_LE(c.kernel_launches + c.library_calls, b.most) << "step " << t << ": " << c.str();
      EXPECT_EQ(c.host_syncs + c.host_waits + c.h2d_copies + c.d2h_copies, 0) << "step " << t << ": " << c.str();
      if (cuda_caches()) EXPECT_EQ(c.device_allocs, 0) << "step " << t << ": " << c.str();
      if (t == L - 1) std::printf("  %-50s %s\n", (b.spec + " decode step").c_str(), c.str().c_str());
    }
  }
}

// What one training forward + backward asks of the device, per mechanism: kernel launches plus
// library calls within a budget, and from the second call on the same work every call, with no host
// synchronization, no allocation (the caching allocator serves it all) and no copy between host and
// device. The budgets are the counts measured on 2026-11-28 (B = 1, H = 2, N = 7, float32;
// apps/bench/README.md; on 2026-11-29 bidirectional performer, the fused favor_attention, and lara,
// its landmarks by scaled_dot_product_attention_lse; nprf_rpe's dense path in the tensor-core
// tiles; 2026-11-29 ra, its draw by sample_attention_keys; 2026-11-30 nprf_rpe, q and k normalized
// by one op each, then lara and ra, their squared norms by one op each way, and lara, its
// landmarks' attention and log-sum-exp one autograd node, then lara, k read without its scaled
// copy, then q; 2026-12-01 lara, its proposals' weights by one op, lara_proposals, and nprf_rpe,
// its [num, den] ratio by one op, sums_ratio; 2026-12-02 nprf_rpe, v's column of ones and the causal
// bias's zeros by one pad each): a change that adds launches fails here, one that
// removes some should lower its budget. redraw=0 keeps the feature draws (a host
// draw and copy each) out.
TEST(AttentionCudaLaunches, ForwardBackward) {
  LINEA_REQUIRE_CUDA();
  manual_seed(6);
  struct Budget {
    std::string spec;
    bool causal;
    int64_t most;
  };
  const std::vector<Budget> budgets = {
      {"softmax", false, 3},
      {"softmax", true, 3},
      {"performer:features=6,redraw=0", false, 7},
      {"performer:features=6,redraw=0", true, 7},
      {"performer:features=6,redraw=0,chunk=3", true, 49},
      {"lara:samples=3", false, 37},
      {"ra:samples=3", false, 27},
      {"nprf_rpe:features=6,max_len=8,redraw=0,dense=0", false, 55},
      {"nprf_rpe:features=6,max_len=8,redraw=0,dense=1", true, 37},
  };
  const int64_t B = 1, H = 2, N = 7, D = 4;
  for (const Budget& b : budgets) {
    SCOPED_TRACE(b.spec + (b.causal ? " causal" : ""));
    auto mech = attn::make_attention(b.spec, H, D);
    mech->to(kCuda);
    attn::AttentionOptions opts;
    opts.causal = b.causal;
    std::vector<cuda::Counters> calls;
    for (int call = 0; call < 3; ++call) {
      Tensor q = randn({B, H, N, D}).to(kCuda), k = randn({B, H, N, D}).to(kCuda), v = randn({B, H, N, D}).to(kCuda),
             g = randn({B, H, N, D}).to(kCuda);
      for (Tensor* t : {&q, &k, &v}) t->requires_grad_(true);
      const cuda::Counters before = cuda::counters();
      mech->forward(q, k, v, opts).backward(g);
      calls.push_back(cuda::counters() - before);
    }
    const cuda::Counters& c = calls[2];
    std::printf("  %-50s %s\n", (b.spec + (b.causal ? " causal" : "")).c_str(), c.str().c_str());
    EXPECT_LE(c.kernel_launches + c.library_calls, b.most) << c.str();
    EXPECT_GT(c.kernel_launches, 0) << c.str();
    EXPECT_EQ(calls[1].stream_ops(), c.stream_ops()) << calls[1].str() << " then " << c.str();
    EXPECT_EQ(c.host_syncs + c.host_waits, 0) << c.str();
    if (cuda_caches()) EXPECT_EQ(c.device_allocs, 0) << c.str();
    EXPECT_EQ(c.h2d_copies + c.d2h_copies, 0) << c.str();
  }
}

// The attention and nn libraries' checks of tensors on two devices (core's ops:
// test_cuda_parity.cpp): the Toeplitz product's c and x, the optimizer's gradients, a dataset's.
TEST(AttentionCuda, TensorsOnTwoDevicesAreRefused) {
  LINEA_REQUIRE_CUDA();
  const Tensor c = zeros({1, 3}), x = zeros({1, 1, 2, 1});  // N = 2, M = 2: offsets -1..1
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(c.to(kCuda), x, 2),
                     "toeplitz_matmul: expected all tensors on the same device, got ");
  Tensor host = zeros({2}).requires_grad_(true), device = zeros({3}, TensorOptions().with_device(kCuda));
  device.requires_grad_(true);
  host.set_grad(ones({2}));
  device.set_grad(ones({3}).to(kCuda));
  EXPECT_LINEA_ERROR(nn::grad_norm({host, device}),
                     "grad_norm: gradients on different devices (cpu and cuda:0 for parameter 1, shape [3])");
  // A dataset's tensors stay on the host (batches are prepared on a CPU thread).
  EXPECT_LINEA_ERROR(nn::TensorDataset(zeros({2}).to(kCuda)), "TensorDataset: inputs and targets must be CPU tensors");
  EXPECT_LINEA_ERROR(nn::TensorDataset(zeros({2}), zeros({2}).to(kCuda)),
                     "TensorDataset: inputs and targets must be CPU tensors");
}

// Module::to moves every parameter and buffer but a host buffer: the redraw count that the host
// reads each step stays on the CPU.
TEST(AttentionCuda, HostBuffersStayOnTheCpu) {
  LINEA_REQUIRE_CUDA();
  auto mech = attn::make_attention("performer:features=6", 2, 4);
  mech->to(kCuda);
  int host = 0;
  for (const auto& [name, b] : mech->named_buffers()) {
    EXPECT_EQ(b.is_cpu(), name == "redraw_calls") << name;
    host += b.is_cpu() ? 1 : 0;
  }
  EXPECT_EQ(host, 1);
  for (const auto& [name, p] : mech->named_parameters()) EXPECT_TRUE(p.is_cuda()) << name;
  EXPECT_EQ(mech->redraw_calls(), 0);
}

}  // namespace
}  // namespace linea
