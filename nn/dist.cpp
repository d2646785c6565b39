// linea::dist (see dist.h), the part that does not depend on MPI: the checks, worlds of one,
// NCCL for CUDA tensors (core/cuda_nccl.h), other CUDA tensors through host memory, Mean's
// division. The CPU collectives and the ranks come from the backend CMake picks
// (nn/dist_backend.h): nn/dist_mpi.cpp or nn/dist_single.cpp.
#include "nn/dist.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "core/cuda_nccl.h"
#include "core/ops.h"
#include "nn/dist_backend.h"

namespace linea::dist {

namespace detail {
State& state() {
  static State s;
  return s;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

std::string gpu_for_local_rank(const char* visible, int driver_gpus, int local_rank) {
  std::vector<std::string> gpus;
  if (visible && *visible) {
    const std::string s(visible);
    for (size_t start = 0; start <= s.size();) {
      const size_t comma = std::min(s.find(',', start), s.size());
      if (comma > start) gpus.push_back(s.substr(start, comma - start));
      start = comma + 1;
    }
  } else {
    for (int i = 0; i < driver_gpus; ++i) gpus.push_back(std::to_string(i));
  }
  return gpus.empty() ? std::string() : gpus[static_cast<size_t>(local_rank) % gpus.size()];
}
}  // namespace detail

namespace {

using detail::env_set;
using detail::State;
using detail::state;
namespace nccl = linea::cuda::nccl;

// Was this process started by an MPI launcher? Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE;
// PMIx and PMI (Slurm's srun, MPICH's hydra) set PMIX_RANK / PMI_RANK.
bool launched_by_mpi() { return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK"); }

void require_contiguous(const Tensor& t, const char* what) {
  LINEA_CHECK(t.defined(), "dist::", what, ": undefined tensor");
  LINEA_CHECK(t.is_contiguous(), "dist::", what, ": expected a contiguous tensor, got shape ", shape_str(t.shape()),
              " with strides ", shape_str(t.strides()));
}

void check_op(const Tensor& t, ReduceOp op, const char* what) {
  if (op == ReduceOp::Sum || op == ReduceOp::Mean)
    LINEA_CHECK(t.dtype() != DType::Bool, "dist::", what,
                ": Sum and Mean of a bool tensor; use Max (any) or Min (all)");
  if (op == ReduceOp::Mean)
    LINEA_CHECK(is_floating(t.dtype()), "dist::", what, ": Mean needs a floating tensor, got ", t.dtype());
}

void bump_version(const Tensor& t) { t.impl().storage->version++; }

bool use_nccl(const Tensor& t) { return t.device().is_cuda() && has_nccl(); }
nccl::Op nccl_op(ReduceOp op) {
  using N = nccl::Op;
  switch (op) {
    case ReduceOp::Sum:
      return N::Sum;
    case ReduceOp::Mean:
      return N::Avg;
    case ReduceOp::Max:
      return N::Max;
    case ReduceOp::Min:
      return N::Min;
  }
  return N::Sum;
}
// The communicator, created on the first CUDA collective (every rank reaches it together).
void ensure_nccl() {
  if (nccl::initialized()) return;
  std::string id = state().rank == 0 ? nccl::unique_id() : std::string();
  Tensor bytes = zeros({16}, TensorOptions(DType::Int64));  // ncclUniqueId: 128 bytes
  if (state().rank == 0) std::memcpy(bytes.data_ptr(), id.data(), std::min<size_t>(id.size(), 128));
  broadcast(bytes, 0);
  id.assign(static_cast<const char*>(bytes.data_ptr()), 128);
  nccl::init(id, state().world, state().rank);
}

// Mean's division, for the paths that sum.
void divide_by_world(const Tensor& t) {
  if (state().world > 1) Tensor(t).copy_(t / static_cast<double>(state().world));
}

}  // namespace

bool has_nccl() { return nccl::available(); }

void init() {
  State& s = state();
  if (s.initialized) return;
  const char* force = std::getenv("LINEA_DIST");
  const bool off = force && std::string(force) == "0", required = force && std::string(force) == "1";
  LINEA_CHECK(!required || has_mpi(),
              "dist: LINEA_DIST=1 but this build of Linea has no MPI (install libopenmpi-dev "
              "and configure again)");
  if (off || !has_mpi() || (!required && !launched_by_mpi())) {
    s.initialized = true;  // one rank of one
    return;
  }
  detail::start(s);
  s.initialized = true;
}

bool is_initialized() { return state().initialized; }
int rank() { return state().rank; }
int world_size() { return state().world; }
int local_rank() { return state().local_rank; }
int local_size() { return state().local_size; }

void barrier() {
  if (world_size() == 1) return;
  detail::host_barrier();
}

void all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op).wait(); }

void broadcast(const Tensor& t, int root) {
  require_contiguous(t, "broadcast");
  LINEA_CHECK(root >= 0 && root < world_size(), "dist::broadcast: root ", root, " is not a rank of ", world_size());
  if (world_size() == 1 || t.numel() == 0) return;
  bump_version(t);
  if (use_nccl(t)) {
    ensure_nccl();
    nccl::broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), root);
    nccl::wait_on_compute();
    return;
  }
  if (t.device().is_cuda()) {  // through host memory
    Tensor h = t.to(kCPU);
    broadcast(h, root);
    Tensor(t).copy_(h);
    return;
  }
  detail::host_broadcast(t, root);
}

void broadcast_string(std::string& s, int root) {
  if (world_size() == 1) return;
  Tensor len = from_vector<int64_t>({static_cast<int64_t>(s.size())}, {1});
  broadcast(len, root);
  const int64_t n = len.to_vector<int64_t>()[0], words = (n + 7) / 8;
  Tensor bytes = zeros({std::max<int64_t>(words, 1)}, TensorOptions(DType::Int64));
  if (rank() == root) std::memcpy(bytes.data_ptr(), s.data(), s.size());
  broadcast(bytes, root);
  s.assign(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
}

namespace {
// The gather itself, for tensors already known to have the same shape and dtype on every rank.
Tensor gather_same_shape(const Tensor& t, const Shape& out_shape) {
  Tensor out = empty(out_shape, t.options().with_requires_grad(false));
  if (t.numel() == 0) return out;
  if (use_nccl(t)) {
    ensure_nccl();
    nccl::all_gather(t.data_ptr(), out.data_ptr(), static_cast<size_t>(t.numel()), t.dtype());
    nccl::wait_on_compute();
    return out;
  }
  if (t.device().is_cuda()) return gather_same_shape(t.to(kCPU), out_shape).to(t.device());
  detail::host_all_gather(t, out);
  return out;
}
}  // namespace

Tensor all_gather(const Tensor& t) {
  require_contiguous(t, "all_gather");
  Shape out_shape = t.shape();
  out_shape.insert(out_shape.begin(), world_size());
  if (world_size() == 1) return linea::clone(t).reshape(out_shape);
  // Every rank's dtype and shape first, so a mismatch is an error on every rank, not a hang.
  constexpr int64_t kMaxDims = 15;
  LINEA_CHECK(t.dim() <= kMaxDims, "dist::all_gather: at most ", kMaxDims, " dimensions, got ", t.dim());
  std::vector<int64_t> desc(kMaxDims + 2, -1);
  desc[0] = static_cast<int64_t>(t.dtype());
  desc[1] = t.dim();
  for (int64_t i = 0; i < t.dim(); ++i) desc[static_cast<size_t>(i + 2)] = t.size(i);
  const Tensor mine = from_vector<int64_t>(desc, {kMaxDims + 2});
  const std::vector<int64_t> all = gather_same_shape(mine, {world_size(), kMaxDims + 2}).to_vector<int64_t>();
  for (int r = 0; r < world_size(); ++r)
    LINEA_CHECK(std::equal(desc.begin(), desc.end(), all.begin() + r * (kMaxDims + 2)), "dist::all_gather: rank ", r,
                " passed another dtype or shape than rank ", rank(), " (", t.dtype(), " ", shape_str(t.shape()), ")");
  return gather_same_shape(t, out_shape);
}

void check_same(const std::string& what, const std::string& label) {
  if (world_size() == 1) return;
  // FNV-1a of `what`; every rank learns every hash, so all of them fail together.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : what) h = (h ^ c) * 1099511628211ull;
  const Tensor mine = from_vector<int64_t>({static_cast<int64_t>(h)}, {1});
  const std::vector<int64_t> all = gather_same_shape(mine, {world_size(), 1}).to_vector<int64_t>();
  std::string differ;
  for (int r = 1; r < world_size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  LINEA_CHECK(differ.empty(), label, ": rank(s) ", differ, " differ from rank 0; every rank must run with the same ",
              "flags and data");
}

// ---- asynchronous all-reduce ----
struct Work::Impl {
  Tensor t;
  ReduceOp op = ReduceOp::Sum;
  Tensor host;                      // a CUDA tensor's copy when it goes through MPI
  std::function<void()> wait_host;  // waits for the backend's reduction
  bool done = false;
};

Work::Work() = default;
Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    if (impl_) {
      try {
        wait();
      } catch (...) {
      }
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Work::~Work() {
  if (!impl_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist: a collective failed while being abandoned: %s\n", e.what());
  }
}

void Work::wait() {
  if (!impl_ || impl_->done) return;
  impl_->done = true;
  if (use_nccl(impl_->t)) {
    nccl::wait_on_compute();
    return;
  }
  if (impl_->wait_host) impl_->wait_host();
  if (impl_->host.defined()) impl_->t.copy_(impl_->host);
  if (impl_->op == ReduceOp::Mean) divide_by_world(impl_->t);
}

Work all_reduce_async(const Tensor& t, ReduceOp op) {
  require_contiguous(t, "all_reduce");
  check_op(t, op, "all_reduce");
  if (world_size() == 1 || t.numel() == 0) return Work();
  bump_version(t);
  auto w = std::make_unique<Work::Impl>();
  w->t = t;
  w->op = op;
  if (use_nccl(t)) {
    ensure_nccl();
    nccl::all_reduce(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), nccl_op(op));
    return Work(std::move(w));
  }
  Tensor buf = t;
  if (t.device().is_cuda()) buf = w->host = t.to(kCPU);
  w->wait_host = detail::host_all_reduce_start(buf, op);
  return Work(std::move(w));
}

void abort_job(const std::string& label, const std::string& message, int code) {
  std::fprintf(stderr, "%s: rank %d of %d: %s\n", label.c_str(), rank(), world_size(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  detail::abort_others(code);
  std::exit(code);
}

std::string describe() {
  if (world_size() == 1) return "single process";
  return "rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) + " (local " +
         std::to_string(local_rank()) + " of " + std::to_string(local_size()) + "), MPI" +
         (has_nccl() ? " + NCCL" : "");
}

}  // namespace linea::dist
