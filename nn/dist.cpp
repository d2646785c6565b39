// linea::dist (see dist.h): MPI for ranks and CPU collectives, NCCL for CUDA collectives.
// Without LINEA_WITH_MPI every collective is the single-process identity.
#include "nn/dist.h"

#include <dirent.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "core/cuda_interface.h"
#include "core/ops.h"

#ifdef LINEA_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: no C++ bindings (and their warnings)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#ifdef LINEA_WITH_CUDA
#include "cuda/nccl.h"
#endif

namespace linea::dist {

namespace {

struct State {
  bool initialized = false;
  int rank = 0, world = 1, local_rank = 0, local_size = 1;
};
State& state() {
  static State s;
  return s;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// Was this process started by an MPI launcher? Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE;
// PMIx and PMI (Slurm's srun, MPICH's hydra) set PMIX_RANK / PMI_RANK.
bool launched_by_mpi() { return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK"); }

#ifdef LINEA_WITH_MPI
// The GPUs the driver lists (/proc/driver/nvidia/gpus/<bus id>), counted without touching CUDA:
// CUDA_VISIBLE_DEVICES must be set before the runtime starts.
int driver_gpu_count() {
  DIR* d = opendir("/proc/driver/nvidia/gpus");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// Linea uses CUDA device 0 of what it sees; with several ranks on one machine each rank must
// see its own GPU: local rank r takes GPU r mod count (of CUDA_VISIBLE_DEVICES when set).
void pick_gpu(int local_rank, int local_size) {
  if (local_size <= 1 || env_set("LINEA_DIST_KEEP_DEVICES")) return;
  std::vector<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::string s(v);
    size_t start = 0;
    while (start <= s.size()) {
      size_t comma = s.find(',', start);
      if (comma == std::string::npos) comma = s.size();
      if (comma > start) visible.push_back(s.substr(start, comma - start));
      start = comma + 1;
    }
  } else {
    for (int i = 0, n = driver_gpu_count(); i < n; ++i) visible.push_back(std::to_string(i));
  }
  if (visible.empty()) return;
  setenv("CUDA_VISIBLE_DEVICES", visible[static_cast<size_t>(local_rank) % visible.size()].c_str(), 1);
}
#endif

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

#ifdef LINEA_WITH_MPI
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  LINEA_FAIL("dist: ", call, " failed on rank ", state().rank, ": ", std::string(msg, static_cast<size_t>(len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32:
      return MPI_FLOAT;
    case DType::Float64:
      return MPI_DOUBLE;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Bool:
      return MPI_UINT8_T;  // stored as 0/1 bytes: Max is "any", Min is "all"
  }
  LINEA_FAIL("dist: unsupported dtype ", t);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are int: split larger buffers into pieces of at most 2^30 elements.
constexpr int64_t kMaxCount = int64_t(1) << 30;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
#ifdef LINEA_WITH_CUDA
  linea::cuda::nccl::finalize();
#endif
  MPI_Finalize();
}
#endif

#ifdef LINEA_WITH_CUDA
bool use_nccl(const Tensor& t) { return t.device().is_cuda() && has_nccl(); }
linea::cuda::nccl::Op nccl_op(ReduceOp op) {
  using N = linea::cuda::nccl::Op;
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
  if (linea::cuda::nccl::initialized()) return;
  std::string id = state().rank == 0 ? linea::cuda::nccl::unique_id() : std::string();
  Tensor bytes = zeros({16}, TensorOptions(DType::Int64));  // ncclUniqueId: 128 bytes
  if (state().rank == 0) std::memcpy(bytes.data_ptr(), id.data(), std::min<size_t>(id.size(), 128));
  broadcast(bytes, 0);
  id.assign(static_cast<const char*>(bytes.data_ptr()), 128);
  linea::cuda::nccl::init(id, state().world, state().rank);
}
#endif

// Mean's division, for the paths that sum.
void divide_by_world(const Tensor& t) {
  if (state().world > 1) Tensor(t).copy_(t / static_cast<double>(state().world));
}

}  // namespace

bool has_mpi() {
#ifdef LINEA_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool has_nccl() {
#ifdef LINEA_WITH_NCCL
  return true;
#else
  return false;
#endif
}

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
#ifdef LINEA_WITH_MPI
  int provided = 0;
  mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit(finalize_at_exit);
  // Errors come back as return codes (turned into linea::Error), not as MPI's default abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &s.rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &s.world), "MPI_Comm_size");
  MPI_Comm local;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  mpi_check(MPI_Comm_rank(local, &s.local_rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(local, &s.local_size), "MPI_Comm_size");
  MPI_Comm_free(&local);
  pick_gpu(s.local_rank, s.local_size);
  s.initialized = true;
#endif
}

bool is_initialized() { return state().initialized; }
int rank() { return state().rank; }
int world_size() { return state().world; }
int local_rank() { return state().local_rank; }
int local_size() { return state().local_size; }

void barrier() {
  if (world_size() == 1) return;
#ifdef LINEA_WITH_MPI
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op).wait(); }

void broadcast(const Tensor& t, int root) {
  require_contiguous(t, "broadcast");
  LINEA_CHECK(root >= 0 && root < world_size(), "dist::broadcast: root ", root, " is not a rank of ", world_size());
  if (world_size() == 1 || t.numel() == 0) return;
  bump_version(t);
#ifdef LINEA_WITH_CUDA
  if (use_nccl(t)) {
    ensure_nccl();
    linea::cuda::nccl::broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), root);
    linea::cuda::nccl::wait_on_compute();
    return;
  }
#endif
#ifdef LINEA_WITH_MPI
  if (t.device().is_cuda()) {  // through host memory
    Tensor h = t.to(kCPU);
    broadcast(h, root);
    Tensor(t).copy_(h);
    return;
  }
  char* p = static_cast<char*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); i += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - i));
    mpi_check(
        MPI_Bcast(p + i * static_cast<int64_t>(dtype_size(t.dtype())), n, mpi_type(t.dtype()), root, MPI_COMM_WORLD),
        "MPI_Bcast");
  }
#endif
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
#ifdef LINEA_WITH_CUDA
  if (use_nccl(t)) {
    ensure_nccl();
    linea::cuda::nccl::all_gather(t.data_ptr(), out.data_ptr(), static_cast<size_t>(t.numel()), t.dtype());
    linea::cuda::nccl::wait_on_compute();
    return out;
  }
#endif
#ifdef LINEA_WITH_MPI
  if (t.device().is_cuda()) return gather_same_shape(t.to(kCPU), out_shape).to(t.device());
  LINEA_CHECK(t.numel() <= kMaxCount, "dist::all_gather: ", t.numel(), " elements per rank; at most ", kMaxCount);
  const int n = static_cast<int>(t.numel());
  mpi_check(MPI_Allgather(t.data_ptr(), n, mpi_type(t.dtype()), out.data_ptr(), n, mpi_type(t.dtype()), MPI_COMM_WORLD),
            "MPI_Allgather");
#endif
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
  Tensor host;  // a CUDA tensor's copy when it goes through MPI
#ifdef LINEA_WITH_MPI
  std::vector<MPI_Request> requests;
#endif
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
#ifdef LINEA_WITH_CUDA
  if (use_nccl(impl_->t)) {
    linea::cuda::nccl::wait_on_compute();
    return;
  }
#endif
#ifdef LINEA_WITH_MPI
  if (!impl_->requests.empty()) {
    mpi_check(MPI_Waitall(static_cast<int>(impl_->requests.size()), impl_->requests.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
  }
#endif
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
#ifdef LINEA_WITH_CUDA
  if (use_nccl(t)) {
    ensure_nccl();
    linea::cuda::nccl::all_reduce(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), nccl_op(op));
    return Work(std::move(w));
  }
#endif
#ifdef LINEA_WITH_MPI
  Tensor buf = t;
  if (t.device().is_cuda()) buf = w->host = t.to(kCPU);
  char* p = static_cast<char*>(buf.data_ptr());
  for (int64_t i = 0; i < buf.numel(); i += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, buf.numel() - i));
    MPI_Request req;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, p + i * static_cast<int64_t>(dtype_size(buf.dtype())), n,
                             mpi_type(buf.dtype()), mpi_op(op), MPI_COMM_WORLD, &req),
              "MPI_Iallreduce");
    w->requests.push_back(req);
  }
#endif
  return Work(std::move(w));
}

void abort_job(const std::string& label, const std::string& message, int code) {
  std::fprintf(stderr, "%s: rank %d of %d: %s\n", label.c_str(), rank(), world_size(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
#ifdef LINEA_WITH_MPI
  if (world_size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

std::string describe() {
  if (world_size() == 1) return "single process";
  return "rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) + " (local " +
         std::to_string(local_rank()) + " of " + std::to_string(local_size()) + "), MPI" +
         (has_nccl() ? " + NCCL" : "");
}

}  // namespace linea::dist
