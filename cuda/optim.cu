// CUDA optimizer steps: sgd_step and adam_step of core/kernels.h (namespace linea::cuda), one
// launch per parameter: a grid-stride loop over the contiguous parameter, its gradient and its
// state, reading and writing each element once, with the hyper-parameters and bias corrections
// (core/ops_optim.h: detail::adam_scalars) as kernel arguments.
// The training step's fused pair, multi-tensor like apex's multi_tensor_apply / PyTorch's
// foreach: grad_norm_guard (2 launches for up to kListTensors gradients) and adam_multi_step
// (1 launch for up to kListTensors parameters). Each block takes one chunk of one tensor (the
// tensors' pointers, sizes and chunk offsets travel in the kernel's arguments, so nothing is
// copied to the device first). Everything a replay of the step must see anew lives in device
// memory: the learning rates, the step count, the clipping coefficient and the guard, so the
// pair needs no host synchronization and can be captured in a CUDA graph.
// The per-element expressions are those of core/optim_math.h, shared with the CPU kernels.
// Not here: argument checks and version bumps (linea::raw in core/ops_optim.cpp).
#include <array>
#include <vector>

#include "core/cuda_interface.h"
#include "core/kernels.h"
#include "core/optim_math.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

// p, g, buf [n]; buf null when momentum is off
template <typename T>
__global__ void sgd_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n,
                                const linea::detail::SgdCoeffs<T> c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    linea::detail::sgd_element(p, g, buf, i, c);
}

// p, g, m, v [n]
template <typename T>
__global__ void adam_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                                 int64_t n, const linea::detail::AdamCoeffs<T> c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    linea::detail::adam_element(p, g, m, v, i, c);
}

// ---- multi-tensor lists ------------------------------------------------------------------------------
// Up to kListTensors tensors per launch: with 4 lists (param, grad, m, v) the arguments take
// about 10 KB, within the 32 KB CUDA 12.1+ allows (sm_70 and newer).
constexpr int kListTensors = 256;
constexpr int kChunk = 4096;     // elements per block
constexpr int kListBlock = 256;  // threads per block

template <int L> struct TensorList {
  int count = 0;  // tensors in this launch
  int chunk_start[kListTensors + 1] =
      {};  // block b works on the tensor i with chunk_start[i] <= b < chunk_start[i + 1]
  int64_t numel[kListTensors] = {};
  void* ptr[L][kListTensors] = {};
  int8_t group[kListTensors] = {};
};

// The tensor of block b (binary search over chunk_start) and the chunk's element range.
template <int L> __device__ __forceinline__ int list_tensor(const TensorList<L>& a, int b) {
  int lo = 0, hi = a.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.chunk_start[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Builds the lists for tensors [first, first + count) of `lists` (L lists of the same length).
template <int L>
TensorList<L> make_list(const std::array<const std::vector<Tensor>*, L>& lists, size_t first, size_t count,
                        const std::vector<int>* group) {
  TensorList<L> a;
  a.count = static_cast<int>(count);
  int chunks = 0;
  for (size_t k = 0; k < count; ++k) {
    const size_t i = first + k;
    const int64_t n = (*lists[0])[i].numel();
    a.chunk_start[k] = chunks;
    a.numel[k] = n;
    for (int l = 0; l < L; ++l) a.ptr[l][k] = (*lists[l])[i].data_ptr();
    a.group[k] = group ? static_cast<int8_t>((*group)[i]) : 0;
    LINEA_CHECK((n + kChunk - 1) / kChunk < INT32_MAX - chunks, "multi-tensor op: too many elements in one list");
    chunks += static_cast<int>((n + kChunk - 1) / kChunk);
  }
  a.chunk_start[count] = chunks;
  return a;
}

// Sum of v over the block in a fixed order (a tree in shared memory `sh` of blockDim.x doubles);
// thread 0 gets the result. All threads must call it.
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

// ---- grad_norm_guard -------------------------------------------------------------------------------
// Pass 1: partial[first_chunk + b] = sum over block b's chunk of T(g * g), in double.
template <typename T> __global__ void sum_squares_kernel(TensorList<1> a, double* partial, int first_chunk) {
  const int b = blockIdx.x;
  const int i = list_tensor(a, b);
  const int64_t start = static_cast<int64_t>(b - a.chunk_start[i]) * kChunk;
  const int64_t end = min(a.numel[i], start + kChunk);
  const T* g = static_cast<const T*>(a.ptr[0][i]);
  double s = 0;
  for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x) s += static_cast<double>(static_cast<T>(g[j] * g[j]));
  s = block_sum(s, shared_mem<double>());
  if (threadIdx.x == 0) partial[first_chunk + b] = s;
}

// Pass 2 (one block), per list: each tensor's sum of its chunks (fixed order), cast to T and
// added in tensor order to the running total total[0] (in T, kept as double); the last list
// finishes: out = {norm, coef, ok}.
template <typename T>
__global__ void norm_guard_kernel(TensorList<1> a, const double* partial, int first_chunk, double* total, bool first,
                                  bool last, const float* loss_f, const double* loss_d, double max_norm, double* out) {
  double* sh = shared_mem<double>();
  T acc = first ? T(0) : static_cast<T>(*total);
  for (int i = 0; i < a.count; ++i) {
    double s = 0;
    for (int c = a.chunk_start[i] + threadIdx.x; c < a.chunk_start[i + 1]; c += blockDim.x)
      s += partial[first_chunk + c];
    s = block_sum(s, sh);
    acc = (first && i == 0) ? static_cast<T>(s) : acc + static_cast<T>(s);
  }
  if (threadIdx.x != 0) return;
  if (!last) {
    *total = static_cast<double>(acc);
    return;
  }
  const T norm = sqrt(acc);
  const double loss = loss_f ? static_cast<double>(*loss_f) : loss_d ? *loss_d : 0.0;  // none: 0, finite
  out[0] = static_cast<double>(norm);
  out[1] = static_cast<double>(linea::detail::clip_coef(norm, max_norm));
  out[2] = (isfinite(static_cast<double>(norm)) && isfinite(loss)) ? 1.0 : 0.0;
}

// ---- adam_multi_step ---------------------------------------------------------------------------------
// Block b: one chunk of tensor i. Thread 0 computes the coefficients of the tensor's group from
// the device-side learning rate, weight decay and step count (t = count + 1) into shared memory.
// The last block to finish (a counter in device memory, reset by that block) adds 1 to count.
template <typename T>
__global__ void adam_multi_kernel(TensorList<4> a, const double* hyper, int64_t* count, const double* guard,
                                  double beta1, double beta2, double eps, bool decoupled, bool last_list,
                                  unsigned int* blocks_done) {
  if (guard && guard[2] == 0.0) return;  // a non-finite step: nothing changes (every block agrees)
  using linea::detail::AdamCoeffs;
  unsigned char* sh = shared_mem<unsigned char>();
  AdamCoeffs<T>* coeffs = reinterpret_cast<AdamCoeffs<T>*>(sh);
  int* is_last = reinterpret_cast<int*>(sh + sizeof(AdamCoeffs<T>));
  const int b = blockIdx.x;
  const int i = list_tensor(a, b);
  if (threadIdx.x == 0) {
    const double* h = hyper + 2 * a.group[i];
    *coeffs = AdamCoeffs<T>::make(h[0], beta1, beta2, eps, h[1], decoupled, *count + 1);
  }
  __syncthreads();
  const AdamCoeffs<T> c = *coeffs;
  const T coef = guard ? static_cast<T>(guard[1]) : T(1);
  const int64_t start = static_cast<int64_t>(b - a.chunk_start[i]) * kChunk;
  const int64_t end = min(a.numel[i], start + kChunk);
  T* p = static_cast<T*>(a.ptr[0][i]);
  const T* g = static_cast<const T*>(a.ptr[1][i]);
  T* m = static_cast<T*>(a.ptr[2][i]);
  T* v = static_cast<T*>(a.ptr[3][i]);
  for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x)
    linea::detail::adam_update(p, guard ? linea::detail::clipped(g[j], coef) : g[j], m, v, j, c);
  if (!last_list) return;
  __syncthreads();  // every thread of this block has read *count
  if (threadIdx.x == 0) {
    __threadfence();
    *is_last = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (*is_last && threadIdx.x == 0) {
    *count += 1;
    *blocks_done = 0;
  }
}

}  // namespace

// param, grad, buf [n] contiguous; buf undefined when momentum == 0
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool first) {
  const int64_t n = param.numel();
  const bool use_momentum = momentum != 0.0;
  LINEA_CHECK(grad.numel() == n && (!use_momentum || (buf.defined() && buf.numel() == n)),
              "sgd_step: sizes differ (param ", shape_str(param.shape()), ", grad ", shape_str(grad.shape()), ")");
  if (n == 0) return;
  LINEA_DISPATCH_FLOAT(param.dtype(), "sgd_step", [&] {
    using T = scalar_t;
    sgd_step_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(
        ptr<T>(param), cptr<T>(grad), use_momentum ? ptr<T>(buf) : nullptr, n,
        linea::detail::SgdCoeffs<T>::make(lr, momentum, dampening, weight_decay, nesterov, first));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// param, grad, m, v [n] contiguous
void adam_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr, double beta1,
               double beta2, double eps, double weight_decay, bool decoupled, int64_t step) {
  const int64_t n = param.numel();
  LINEA_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n, "adam_step: sizes differ (param ",
              shape_str(param.shape()), ", grad ", shape_str(grad.shape()), ", m ", shape_str(m.shape()), ", v ",
              shape_str(v.shape()), ")");
  if (n == 0) return;
  LINEA_DISPATCH_FLOAT(param.dtype(), "adam_step", [&] {
    using T = scalar_t;
    adam_step_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(
        ptr<T>(param), cptr<T>(grad), ptr<T>(m), ptr<T>(v), n,
        linea::detail::AdamCoeffs<T>::make(lr, beta1, beta2, eps, weight_decay, decoupled, step));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grads [n_i] contiguous, one dtype; loss 0-d or undefined; out Float64 [3] = {norm, coef, ok}
void grad_norm_guard(const std::vector<Tensor>& grads, const Tensor& loss, double max_norm, const Tensor& out) {
  const DType dt = grads.empty() ? DType::Float32 : grads[0].dtype();
  const float* loss_f = loss.defined() && loss.dtype() == DType::Float32 ? cptr<float>(loss) : nullptr;
  const double* loss_d = loss.defined() && loss.dtype() == DType::Float64 ? cptr<double>(loss) : nullptr;
  LINEA_DISPATCH_FLOAT(dt, "grad_norm_guard", [&] {
    using T = scalar_t;
    int64_t chunks = 0;
    for (const Tensor& g : grads) chunks += (g.numel() + kChunk - 1) / kChunk;
    DeviceBuffer partial(sizeof(double) * static_cast<size_t>(std::max<int64_t>(chunks, 1)));
    DeviceBuffer total(sizeof(double));
    const size_t n = grads.size();
    if (n == 0) {  // no gradient: norm 0
      norm_guard_kernel<T><<<1, kListBlock, sizeof(double) * kListBlock, stream()>>>(
          TensorList<1>(), partial.as<double>(), 0, total.as<double>(), true, true, loss_f, loss_d, max_norm,
          ptr<double>(out));
      LINEA_KERNEL_LAUNCH_CHECK();
      return;
    }
    int first_chunk = 0;
    for (size_t first = 0; first < n; first += kListTensors) {
      const size_t count = std::min<size_t>(kListTensors, n - first);
      const TensorList<1> a = make_list<1>({&grads}, first, count, nullptr);
      const int blocks = a.chunk_start[count];
      if (blocks > 0) {
        sum_squares_kernel<T>
            <<<blocks, kListBlock, sizeof(double) * kListBlock, stream()>>>(a, partial.as<double>(), first_chunk);
        LINEA_KERNEL_LAUNCH_CHECK();
      }
      const bool last = first + count == n;
      norm_guard_kernel<T><<<1, kListBlock, sizeof(double) * kListBlock, stream()>>>(
          a, partial.as<double>(), first_chunk, total.as<double>(), first == 0, last, loss_f, loss_d, max_norm,
          ptr<double>(out));
      LINEA_KERNEL_LAUNCH_CHECK();
      first_chunk += blocks;
    }
  });
}

// params, grads, m, v [n_i] contiguous, one dtype; hyper Float64 [G, 2]; count Int64 [1];
// guard Float64 [3] or undefined
void adam_multi_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
                     const std::vector<Tensor>& v, const std::vector<int>& group, const Tensor& hyper,
                     const Tensor& count, const Tensor& guard, double beta1, double beta2, double eps, bool decoupled) {
  const size_t n = params.size();
  const DType dt = n == 0 ? DType::Float32 : params[0].dtype();
  LINEA_DISPATCH_FLOAT(dt, "adam_multi_step", [&] {
    using T = scalar_t;
    const size_t smem = sizeof(linea::detail::AdamCoeffs<T>) + sizeof(int);
    if (n == 0) {  // nothing to update, but the step still counts (when the guard lets it)
      adam_multi_kernel<T><<<1, 1, smem, stream()>>>(TensorList<4>(), cptr<double>(hyper), ptr<int64_t>(count),
                                                     guard.defined() ? cptr<double>(guard) : nullptr, beta1, beta2, eps,
                                                     decoupled, true, blocks_done_counter());
      LINEA_KERNEL_LAUNCH_CHECK();
      return;
    }
    for (size_t first = 0; first < n; first += kListTensors) {
      const size_t cnt = std::min<size_t>(kListTensors, n - first);
      TensorList<4> a = make_list<4>({&params, &grads, &m, &v}, first, cnt, &group);
      // A list whose tensors are all empty still needs one block to count the step.
      const int blocks = std::max(a.chunk_start[cnt], 1);
      adam_multi_kernel<T><<<blocks, kListBlock, smem, stream()>>>(
          a, cptr<double>(hyper), ptr<int64_t>(count), guard.defined() ? cptr<double>(guard) : nullptr, beta1, beta2,
          eps, decoupled, first + cnt == n, blocks_done_counter());
      LINEA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace linea::cuda
