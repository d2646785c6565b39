// Fake CUDA platform for tests/cuda_emu/run.sh: cudart (malloc-backed), cuBLAS (naive strided- and
// pointer-array-batched GEMMs with cuBLAS's argument checks; tf32/bf16 compute types round the
// inputs as the tensor cores do), cuBLASLt (one GEMM with a bias or bias-gradient epilogue),
// cuFFT (naive DFT that scribbles over its input), cuRAND (hash-based counter generator), events
// (always passed, or held back on request), and the fiber scheduler behind kernel launches.
// Test tooling only.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cufft.h>
#include <curand.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace linea::cuda::detail {
// As much as an H100's block may opt in to; without the opt-in a launch gets 48 KB (run_grid).
alignas(16) unsigned char linea_smem_[227 * 1024];
}
constexpr size_t kDefaultSmem = 48 * 1024;
// Dynamic shared memory a kernel opted in to (cudaFuncSetAttribute), by its address.
static std::map<const void*, size_t> g_smem_opt_in;

static cudaError_t g_last_error = cudaSuccess;
static long g_launches = 0;

// EMU_TRACE_LAUNCHES=1: each kernel launch and library call on stderr, in order (which launches
// a change adds or removes). Kernels are named from the executable's own symbol table (nm): most
// sit in anonymous namespaces, out of the dynamic one that dladdr reads.
static bool trace_launches() {
  static const bool on = std::getenv("EMU_TRACE_LAUNCHES") != nullptr;
  return on;
}
static void trace_call(const char* what) {
  if (trace_launches()) std::fprintf(stderr, "emu call %s\n", what);
}
static std::string kernel_name(const void* kernel) {
  static const std::map<uintptr_t, std::string> symbols = [] {
    std::map<uintptr_t, std::string> m;
    char exe[4096];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);  // this process's, not nm's
    if (len <= 0) return m;
    exe[len] = '\0';
    FILE* nm = popen(("nm -C --defined-only '" + std::string(exe) + "' 2>/dev/null").c_str(), "r");
    if (!nm) return m;
    char line[4096];
    while (std::fgets(line, sizeof line, nm)) {
      char* end = nullptr;
      const uintptr_t at = std::strtoull(line, &end, 16);
      if (end == line || std::strlen(end) < 4) continue;
      std::string name(end + 3);  // past " t "
      if (!name.empty() && name.back() == '\n') name.pop_back();
      // Drop the parameter list: from the '(' that opens the last top-level parentheses.
      long depth = 0;
      if (!name.empty() && name.back() == ')')
        for (size_t i = name.size(); i-- > 0;) {
          depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
          if (depth == 0) {
            name.resize(i);
            break;
          }
        }
      for (const char* noise : {"(anonymous namespace)::", "linea::cuda::", "void "})  // shorter lines
        for (size_t i; (i = name.find(noise)) != std::string::npos;) name.erase(i, std::strlen(noise));
      m.emplace(at, name);
    }
    pclose(nm);
    return m;
  }();
  Dl_info info;
  if (!dladdr(kernel, &info)) return "?";
  const auto it = symbols.find(reinterpret_cast<uintptr_t>(kernel) - reinterpret_cast<uintptr_t>(info.dli_fbase));
  return it == symbols.end() ? "?" : it->second;
}

// ---- fibers ----------------------------------------------------------------------------------------
// A block's threads are fibers, each on its own stack, switched by emu_switch below: it saves the
// callee-saved registers and the stack pointer, and makes no system call. (glibc's swapcontext
// saves the signal mask with one at every switch, and ASan's hook of it clears the whole target
// stack's shadow: that was over half of the emulator's time.) ASan is told of each switch through
// its fiber interface, and a fiber's stack is unpoisoned before it is reused. x86-64 only.
#if !defined(__x86_64__)
#error "tests/cuda_emu: the fiber switch (emu_switch) is written for x86-64"
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

// emu_switch(save, to): pushes rbp, rbx, r12-r15 and the MXCSR and x87 control words on the
// current stack, stores the stack pointer in *save, and resumes the stack `to` (saved the same
// way, or laid out so by start_fiber).
extern "C" void emu_switch(void** save, void* to);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");

namespace {
struct Fiber {
  void* sp = nullptr;  // the saved stack pointer while switched out
  char* stack = nullptr;
  bool done = false;
  bool at_barrier = false;       // __syncthreads
  bool at_warp_barrier = false;  // __syncwarp
  unsigned exchanges = 0;        // warp_exchange calls so far (their slots alternate)
  uint3 tid;
  // cp.async copies issued and not yet landed (emu::cp_async), each in commit group `group` (-1:
  // not committed yet); `groups` committed so far.
  struct AsyncCopy {
    unsigned char* dst;
    unsigned char data[16];
    int bytes;
    int64_t group;
  };
  std::vector<AsyncCopy> copies;
  int64_t groups = 0;
};
void* g_sched_sp = nullptr;  // the scheduler's (the launching thread's) stack, while a fiber runs
#if EMU_ASAN
const void* g_sched_bottom = nullptr;
size_t g_sched_size = 0;
#endif
Fiber* g_cur = nullptr;
const std::function<void()>* g_body = nullptr;
std::vector<Fiber> g_fibers;
std::vector<char> g_stacks;
constexpr size_t kStack = 64 * 1024;

// The scheduler runs fiber f until it waits at a barrier or ends.
void resume(Fiber& f) {
#if EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f.stack, kStack);
#endif
  emu_switch(&g_sched_sp, f.sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// The running fiber goes back to the scheduler (for good once done).
void yield_to_scheduler() {
#if EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(g_cur->done ? nullptr : &fake_stack, g_sched_bottom, g_sched_size);
#endif
  emu_switch(&g_cur->sp, g_sched_sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, &g_sched_bottom, &g_sched_size);
#endif
}

[[noreturn]] void fiber_main() {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_sched_bottom, &g_sched_size);
#endif
  (*g_body)();
  g_cur->done = true;
  yield_to_scheduler();
  std::abort();  // a finished fiber is never resumed
}

// Lays out f's stack as emu_switch leaves one, returning into fiber_main with the stack aligned
// as after a call.
void start_fiber(Fiber& f) {
#if EMU_ASAN
  __asan_unpoison_memory_region(f.stack, kStack);  // the frames a finished fiber left poisoned
#endif
  uint32_t control[2] = {0, 0};
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(f.stack + kStack) & ~uintptr_t{15});
  top[-1] = 0;                                        // fiber_main's return address: none
  top[-2] = reinterpret_cast<uint64_t>(&fiber_main);  // where emu_switch returns
  for (int r = 3; r <= 8; ++r) top[-r] = 0;           // rbp, rbx, r12-r15
  std::memcpy(&top[-9], control, sizeof control);     // MXCSR, x87 control word
  f.sp = &top[-9];
}
}  // namespace

void __syncthreads() {
  g_cur->at_barrier = true;
  yield_to_scheduler();
}

// A warp's lanes are threads 32 w .. 32 w + 31 of the block (linear index); each lane waits until
// every lane of its warp has arrived (the full mask only: Linea's kernels keep warps converged).
void __syncwarp(unsigned mask) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "emu: __syncwarp takes the full mask only, got %#x\n", mask);
    std::abort();
  }
  g_cur->at_warp_barrier = true;
  yield_to_scheduler();
}

namespace emu {
// Lane l's `bytes` go to all + l * bytes in every lane of the warp (the base of shuffles, ldmatrix
// and the emulated mma.sync). Consecutive exchanges use alternate slots, so one barrier each
// suffices: a lane writes exchange k + 2's slot only after every lane has reached exchange k + 1,
// i.e. has read exchange k (the barrier is the emulator's cost: half of them saved).
void warp_exchange(const void* mine, void* all, size_t bytes) {
  constexpr size_t kMaxBytes = 64;
  static unsigned char slots[2][1024 * kMaxBytes];  // [parity][thread][kMaxBytes]: warps interleave
  if (bytes > kMaxBytes) {
    std::fprintf(stderr, "emu: warp_exchange of %zu bytes per lane (at most %zu)\n", bytes, kMaxBytes);
    std::abort();
  }
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned char* slot = slots[g_cur->exchanges++ % 2];
  std::memcpy(slot + t * kMaxBytes, mine, bytes);
  __syncwarp(0xffffffffu);
  for (unsigned l = 0; l < 32; ++l)
    std::memcpy(static_cast<unsigned char*>(all) + l * bytes, slot + ((t / 32) * 32 + l) * kMaxBytes, bytes);
}

// d += A B for this lane's four elements of the warp's D [16 x 8] (A [16 x K], B [K x 8]): the
// product summed on its own, then added, as one mma.
template <int K> void add_product(float (&d)[4], const float (&A)[16][K], const float (&B)[K][8]) {
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    float acc = 0;
    for (int k = 0; k < K; ++k) acc += A[r][k] * B[k][c];
    d[i] += acc;
  }
}

// The warp's A [16 x 16] and B [16 x 8] rebuilt from every lane's fragments, as the PTX ISA lays
// them out ("Matrix Fragments for mma.m16n8k16 with floating point type"); each lane then
// computes its own four elements of D.
void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct Frag {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
  warp_exchange(&mine, all, sizeof(Frag));
  auto bf16 = [](uint32_t reg, int half) {
    const uint32_t bits = (half ? reg >> 16 : reg & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = bf16(all[lane].a[0], h);
      A[g + 8][2 * t + h] = bf16(all[lane].a[1], h);
      A[g][2 * t + 8 + h] = bf16(all[lane].a[2], h);
      A[g + 8][2 * t + 8 + h] = bf16(all[lane].a[3], h);
      B[2 * t + h][g] = bf16(all[lane].b[0], h);
      B[2 * t + 8 + h][g] = bf16(all[lane].b[1], h);
    }
  }
  add_product<16>(d, A, B);
}

// The same for m16n8k8 on TF32 ("Matrix Fragments for mma.m16n8k8" with .tf32): A [16 x 8] and
// B [8 x 8] of float32 bits whose low 13 mantissa bits the tensor cores do not read (dropped here).
struct Tf32Tiles {
  float A[16][8], B[8][8];
};
float tf32_value(uint32_t reg) {
  const uint32_t bits = reg & 0xffffe000u;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Lane `lane`'s fragments a, b placed into tiles x.
void place_tf32(Tf32Tiles& x, int lane, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int g = lane / 4, t = lane % 4;
  x.A[g][t] = tf32_value(a[0]);
  x.A[g + 8][t] = tf32_value(a[1]);
  x.A[g][t + 4] = tf32_value(a[2]);
  x.A[g + 8][t + 4] = tf32_value(a[3]);
  x.B[t][g] = tf32_value(b[0]);
  x.B[t + 4][g] = tf32_value(b[1]);
}
void mma_tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct Frag {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
  warp_exchange(&mine, all, sizeof(Frag));
  Tf32Tiles x;
  for (int lane = 0; lane < 32; ++lane) place_tf32(x, lane, all[lane].a, all[lane].b);
  add_product<8>(d, x.A, x.B);
}
void mma_tf32x3_m16n8k8(float (&d)[4], const uint32_t (&ab)[4], const uint32_t (&as)[4], const uint32_t (&bb)[2],
                        const uint32_t (&bs)[2]) {
  struct Frag {
    uint32_t ab[4], as[4], bb[2], bs[2];
  } mine{{ab[0], ab[1], ab[2], ab[3]}, {as[0], as[1], as[2], as[3]}, {bb[0], bb[1]}, {bs[0], bs[1]}}, all[32];
  warp_exchange(&mine, all, sizeof(Frag));
  Tf32Tiles big, small;  // big.A, big.B: the big parts; small's the small ones
  for (int lane = 0; lane < 32; ++lane) {
    place_tf32(big, lane, all[lane].ab, all[lane].bb);
    place_tf32(small, lane, all[lane].as, all[lane].bs);
  }
  add_product<8>(d, big.A, small.B);
  add_product<8>(d, small.A, big.B);
  add_product<8>(d, big.A, big.B);
}

// cp.async: the source is read now (zeros where src is null) and lands in shared memory at the
// cp_async_wait that completes its group, not before: a kernel that reads a tile before waiting
// for it (or waits for too few groups) reads what was there, the launch's 0xCD bytes or the last
// tile. Copies still in flight when the thread ends never land.
void cp_async(void* dst, const void* src, int bytes) {
  if (bytes < 1 || bytes > 16) {
    std::fprintf(stderr, "emu: cp.async of %d bytes (4, 8 or 16)\n", bytes);
    std::abort();
  }
  Fiber::AsyncCopy c{static_cast<unsigned char*>(dst), {}, bytes, -1};
  if (src) std::memcpy(c.data, src, static_cast<size_t>(bytes));
  g_cur->copies.push_back(c);
}
// cp.async.commit_group: the copies issued since the last commit form a group (perhaps empty).
void cp_async_commit() {
  for (auto& c : g_cur->copies)
    if (c.group < 0) c.group = g_cur->groups;
  ++g_cur->groups;
}
// cp.async.wait_group n: every committed group but the n most recent lands.
void cp_async_wait(int n) {
  auto& copies = g_cur->copies;
  const int64_t done_below = g_cur->groups - n;
  size_t kept = 0;
  for (auto& c : copies) {
    if (c.group >= 0 && c.group < done_below)
      std::memcpy(c.dst, c.data, static_cast<size_t>(c.bytes));
    else
      copies[kept++] = c;
  }
  copies.resize(kept);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8 (each row 16 bytes, 16-byte aligned, in shared memory: checked) and receives in
// r[i] matrix i's 16-bit elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), or with trans
// (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  const unsigned char* rows[32];
  const auto* mine = static_cast<const unsigned char*>(row);
  const unsigned char* smem = linea::cuda::detail::linea_smem_;
  if (reinterpret_cast<uintptr_t>(mine) % 16 != 0 || mine < smem ||
      mine + 16 > smem + sizeof(linea::cuda::detail::linea_smem_)) {
    std::fprintf(stderr, "emu: ldmatrix row address %p is not a 16-byte aligned row of shared memory\n", row);
    std::abort();
  }
  warp_exchange(&mine, rows, sizeof(mine));
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  const auto half = [&](int matrix, unsigned r_, unsigned c) {
    uint16_t h;
    std::memcpy(&h, rows[matrix * 8 + r_] + 2 * c, 2);
    return static_cast<uint32_t>(h);
  };
  for (int i = 0; i < 4; ++i) {
    const unsigned a = lane / 4, b = 2 * (lane % 4);
    r[i] = trans ? half(i, b, a) | half(i, b + 1, a) << 16 : half(i, a, b) | half(i, a, b + 1) << 16;
  }
}
}  // namespace emu

namespace emu {
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  ++g_launches;
  if (trace_launches())
    std::fprintf(stderr, "emu launch %s grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", kernel_name(kernel).c_str(),
                 grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
  const unsigned nthreads = block.x * block.y * block.z;
  if (nthreads == 0 || nthreads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
    std::fprintf(stderr, "emu: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)\n", grid.x, grid.y,
                 grid.z, block.x, block.y, block.z);
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  const auto opt_in = g_smem_opt_in.find(kernel);
  if (smem > (opt_in == g_smem_opt_in.end() ? kDefaultSmem : opt_in->second)) {
    std::fprintf(stderr,
                 "emu: %zu bytes of dynamic shared memory: over 48 KB a kernel must opt in first "
                 "(cudaFuncSetAttribute MaxDynamicSharedMemorySize)\n",
                 smem);
    g_last_error = cudaErrorInvalidValue;
    return;
  }
  gridDim = grid;
  blockDim = block;
  g_body = &body;
  // Only the launch's own dynamic shared memory is addressable: an access past it fails ASan (on a
  // GPU it is another block's memory, or a fault). Each block finds it full of 0xCD bytes.
  unsigned char* const shared = linea::cuda::detail::linea_smem_;
  constexpr size_t kSharedCap = sizeof linea::cuda::detail::linea_smem_;
  ASAN_UNPOISON_MEMORY_REGION(shared, kSharedCap);
  ASAN_POISON_MEMORY_REGION(shared + smem, kSharedCap - smem);
  g_fibers.assign(nthreads, Fiber());
  if (g_stacks.size() < nthreads * kStack) {  // larger stacks; the old ones' contents are dead
    g_stacks.clear();                         // (and partly poisoned: not to be copied)
    g_stacks.resize(nthreads * kStack);
  }
  // EMU_REVERSE_BLOCKS=1: the blocks run last to first. A block that writes past its own part
  // of an output (a tail it should have skipped) is overwritten by its neighbour in one order and
  // clobbers it in the other; a GPU runs them in any order.
  static const bool reverse = std::getenv("EMU_REVERSE_BLOCKS") != nullptr;
  const auto nth = [](unsigned i, unsigned n) { return reverse ? n - 1 - i : i; };
  // EMU_REVERSE_THREADS=1: between two barriers a block's threads run last to first. A thread
  // that reads a shared slot another thread of the same step writes (a tree step without its
  // guard) reads the old value in one order and the new one in the other; a GPU runs them at once.
  static const bool reverse_threads = std::getenv("EMU_REVERSE_THREADS") != nullptr;
  for (unsigned iz = 0; iz < grid.z; ++iz)
    for (unsigned iy = 0; iy < grid.y; ++iy)
      for (unsigned ix = 0; ix < grid.x; ++ix) {
        blockIdx = make_uint3(nth(ix, grid.x), nth(iy, grid.y), nth(iz, grid.z));
        std::memset(shared, 0xCD, smem);
        unsigned t = 0;
        for (unsigned z = 0; z < block.z; ++z)
          for (unsigned y = 0; y < block.y; ++y)
            for (unsigned x = 0; x < block.x; ++x, ++t) {
              Fiber& f = g_fibers[t];
              f.done = false;
              f.at_barrier = false;
              f.at_warp_barrier = false;
              f.exchanges = 0;
              f.copies.clear();
              f.groups = 0;
              f.tid = make_uint3(x, y, z);
              f.stack = g_stacks.data() + t * kStack;
              start_fiber(f);
            }
        for (;;) {
          for (unsigned i = 0; i < nthreads; ++i) {
            Fiber& f = g_fibers[reverse_threads ? nthreads - 1 - i : i];
            if (f.done || f.at_barrier) continue;
            g_cur = &f;
            threadIdx = f.tid;
            resume(f);
          }
          unsigned done = 0, waiting = 0, warp_waiting = 0;
          for (auto& f : g_fibers) {
            done += f.done;
            waiting += f.at_barrier;
            warp_waiting += f.at_warp_barrier;
          }
          if (warp_waiting > 0) {  // release each warp whose lanes all wait at __syncwarp
            bool released = false;
            for (unsigned w = 0; w * 32 < nthreads; ++w) {
              const unsigned end = std::min(nthreads, w * 32 + 32);
              bool all = true;
              for (unsigned i = w * 32; i < end; ++i) all = all && g_fibers[i].at_warp_barrier;
              if (!all) continue;
              for (unsigned i = w * 32; i < end; ++i) g_fibers[i].at_warp_barrier = false;
              released = true;
            }
            if (released) continue;
            std::fprintf(stderr,
                         "emu: warp divergence: %u threads wait at __syncwarp, %u at __syncthreads, %u exited\n",
                         warp_waiting, waiting, done);
            std::abort();
          }
          if (waiting == 0) break;
          if (done > 0) {
            std::fprintf(stderr, "emu: barrier divergence: %u threads exited, %u wait at __syncthreads\n", done,
                         waiting);
            std::abort();
          }
          for (auto& f : g_fibers) f.at_barrier = false;
        }
      }
}
}  // namespace emu

long emu_launch_count() { return g_launches; }

// ---- stream capture (CUDA graphs) ------------------------------------------------------------------------
// While a capture is on, work given to the stream (kernels, copies, memsets, library calls) is
// recorded instead of run; cudaGraphLaunch runs the recording in order.
namespace {
bool g_capturing = false;
std::vector<std::function<void()>> g_captured;
struct EmuGraph {
  std::vector<std::function<void()>> ops;
};
}  // namespace
void emu_submit(std::function<void()> op) {
  if (g_capturing)
    g_captured.push_back(std::move(op));
  else
    op();
}
namespace emu {
// EMU_MAX_BLOCKS=N (N >= 1): grid_for and column_grid give at most N blocks instead of 65,536.
// A test's tensors fit in far fewer blocks than that: without the cap no grid-stride loop would
// take a second turn, and a kernel launched on a capped grid that covers only its first turn
// (an `if (i < n)` where a loop belongs) would pass here and drop the tail of a tensor of 17M
// elements on a GPU.
int64_t max_blocks() {
  static const int64_t cap = [] {
    const char* v = std::getenv("EMU_MAX_BLOCKS");
    if (!v) return int64_t{1} << 16;
    const long long n = std::atoll(v);
    if (n < 1) {
      std::fprintf(stderr, "EMU_MAX_BLOCKS=%s: want a number of blocks >= 1\n", v);
      std::abort();
    }
    return static_cast<int64_t>(n);
  }();
  return cap;
}
void submit_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
  emu_submit([kernel, grid, block, smem, body = std::move(body)] { run_grid(kernel, grid, block, smem, body); });
}
}  // namespace emu
extern "C" {
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // hints: nothing to emulate
  if (value < 0 || static_cast<size_t>(value) > sizeof(linea::cuda::detail::linea_smem_))
    return g_last_error = cudaErrorInvalidValue;
  g_smem_opt_in[func] = static_cast<size_t>(value);
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  if (g_capturing) return g_last_error = cudaErrorIllegalState;
  g_capturing = true;
  g_captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  if (!g_capturing) return g_last_error = cudaErrorIllegalState;
  g_capturing = false;
  *graph = reinterpret_cast<cudaGraph_t>(new EmuGraph{std::move(g_captured)});
  g_captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = g_capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = reinterpret_cast<cudaGraphExec_t>(new EmuGraph(*reinterpret_cast<EmuGraph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<EmuGraph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<EmuGraph*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (g_capturing) return g_last_error = cudaErrorStreamCaptureUnsupported;
  for (const auto& op : reinterpret_cast<EmuGraph*>(exec)->ops) op();
  return cudaSuccess;
}
}  // extern "C"

// ---- cudart -----------------------------------------------------------------------------------------
namespace {
std::map<void*, size_t> g_allocs;
bool g_device_present = true;
}
void emu_set_device_present(bool on) { g_device_present = on; }

extern "C" {
cudaError_t cudaGetDeviceCount(int* n) {
  *n = g_device_present ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!g_device_present || device != 0) return g_last_error = cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", "Linea CUDA emulator");
  // An sm_90 device, or LINEA_EMU_CC=75 (say): an older one, whose kernels some ops pick instead.
  const char* cc = std::getenv("LINEA_EMU_CC");
  const int capability = cc ? std::atoi(cc) : 90;
  prop->major = capability / 10;
  prop->minor = capability % 10;
  prop->multiProcessorCount = 1;
  prop->totalGlobalMem = size_t(1) << 30;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = sizeof(linea::cuda::detail::linea_smem_);
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    default: return "cudaError(other)";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  static int dummy;
  *s = reinterpret_cast<cudaStream_t>(&dummy);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// What an allocation of n bytes takes: whole 256-byte lines, at least one.
static size_t emu_alloc_size(size_t n) { return std::max<size_t>(256, (n + 255) / 256 * 256); }
cudaError_t cudaMalloc(void** p, size_t n) {
  if (getenv("EMU_TRACE_MALLOC")) std::fprintf(stderr, "emu malloc %zu\n", n);
  // Fresh device memory holds garbage: all ones here, a NaN in every floating type (a read of
  // memory nothing wrote shows in the result), and ASan refuses the bytes past n that the
  // 256-byte rounding adds (with LINEA_NO_CUDA_MEMORY_CACHING=1 the allocator asks for exactly
  // what a buffer needs, so a read or write past any buffer fails).
  const size_t rounded = emu_alloc_size(n);
  *p = std::aligned_alloc(256, rounded);
  std::memset(*p, 0xFF, rounded);
  ASAN_POISON_MEMORY_REGION(static_cast<char*>(*p) + n, rounded - n);
  g_allocs[*p] = n;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  const auto it = g_allocs.find(p);
  if (it == g_allocs.end()) {
    std::fprintf(stderr, "emu: cudaFree of unknown pointer\n");
    std::abort();
  }
  ASAN_UNPOISON_MEMORY_REGION(p, emu_alloc_size(it->second));
  g_allocs.erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* f, size_t* t) {
  *f = 1 << 30;
  *t = 1 << 30;
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
  emu_submit([d, s, n] { std::memmove(d, s, n); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  emu_submit([d, v, n] { std::memset(d, v, n); });
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) {
  *p = std::calloc(1, n);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned int) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
}  // extern "C"

// ---- events -------------------------------------------------------------------------------------------
// Work runs at once, so an event has always passed. To exercise code that must cope with an
// event that has not (a readback still in flight), emu_set_event_lag(n) makes every event
// recorded afterwards answer cudaErrorNotReady to its first n queries (cudaEventSynchronize
// always completes it).
namespace {
struct EmuEvent {
  int lag = 0;
};
int g_event_lag = 0;
}  // namespace
void emu_set_event_lag(int n) { g_event_lag = n; }
extern "C" {
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new EmuEvent());
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<EmuEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  reinterpret_cast<EmuEvent*>(e)->lag = g_event_lag;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  EmuEvent* ev = reinterpret_cast<EmuEvent*>(e);
  if (ev->lag > 0) {
    --ev->lag;
    return cudaErrorNotReady;
  }
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  reinterpret_cast<EmuEvent*>(e)->lag = 0;
  return cudaSuccess;
}
}  // extern "C"

// ---- cuBLAS -------------------------------------------------------------------------------------------
extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  static int dummy;
  *h = reinterpret_cast<cublasHandle_t>(&dummy);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void* workspace, size_t bytes) {
  return workspace != nullptr && bytes > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
const char* cublasGetStatusName(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE"; }
const char* cublasGetStatusString(cublasStatus_t s) { return cublasGetStatusName(s); }
}

// Rounds a float GEMM input as the tensor cores do for a compute type: bf16 (8-bit mantissa) or
// TF32 (10-bit), to nearest even; others unchanged.
static double round_input(double v, cublasComputeType_t compute) {
  const int drop = compute == CUBLAS_COMPUTE_32F_FAST_16BF ? 16 : compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? 13 : 0;
  if (drop == 0) return v;
  float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) {  // finite: round the dropped bits to nearest even
    const uint32_t half = 1u << (drop - 1), lsb = (u >> drop) & 1u;
    u = (u + half - 1 + lsb) & ~((1u << drop) - 1);
  }
  std::memcpy(&f, &u, 4);
  return f;
}

static bool gemm_args_ok(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb, int ldc,
                         int count) {
  const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
  const bool ok = !(m < 0 || n < 0 || k < 0 || count < 0 || lda < std::max(1, na ? m : k) ||
                    ldb < std::max(1, nb ? k : n) || ldc < std::max(1, m));
  if (!ok)
    std::fprintf(stderr, "emu cublas: invalid gemm m=%d n=%d k=%d lda=%d ldb=%d ldc=%d ta=%d tb=%d\n", m, n, k, lda,
                 ldb, ldc, int(ta), int(tb));
  return ok;
}

// Column-major C_i = op(A_i) op(B_i) for i < count; the operands of product i come from get(i).
template <typename T, typename Get>
static cublasStatus_t gemm_batch(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const T* alpha,
                                 int lda, int ldb, const T* beta, int ldc, int count, cublasComputeType_t compute,
                                 Get get) {
  const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || count < 0 || lda < std::max(1, na ? m : k) || ldb < std::max(1, nb ? k : n) ||
      ldc < std::max(1, m)) {
    std::fprintf(stderr, "emu cublas: invalid gemm m=%d n=%d k=%d lda=%d ldb=%d ldc=%d ta=%d tb=%d\n", m, n, k, lda,
                 ldb, ldc, int(ta), int(tb));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (int b = 0; b < count; ++b) {
    const T* a;
    const T* bb;
    T* c;
    get(b, a, bb, c);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int l = 0; l < k; ++l) {
          const double av = na ? a[i + (long long)l * lda] : a[l + (long long)i * lda];
          const double bv = nb ? bb[l + (long long)j * ldb] : bb[j + (long long)l * ldb];
          s += round_input(av, compute) * round_input(bv, compute);
        }
        T& out = c[i + (long long)j * ldc];
        out = static_cast<T>(*alpha * s + (*beta == T(0) ? 0.0 : *beta * out));
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The data and compute types Linea passes: float with a 32F compute type, double with 64F.
static bool gemm_types_ok(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cublasComputeType_t compute) {
  const bool f32 = a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F &&
                   (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                    compute == CUBLAS_COMPUTE_32F_FAST_16BF);
  const bool f64 = a == CUDA_R_64F && b == CUDA_R_64F && c == CUDA_R_64F && compute == CUBLAS_COMPUTE_64F;
  if (!f32 && !f64) std::fprintf(stderr, "emu cublas: unsupported types %d %d %d compute %d\n", a, b, c, compute);
  return f32 || f64;
}

extern "C" {
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType_t at, int lda,
                                          long long int sA, const void* B, cudaDataType_t bt, int ldb, long long int sB,
                                          const void* beta, void* C, cudaDataType_t ct, int ldc, long long int sC,
                                          int count, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (trace_launches())
    std::fprintf(stderr, "emu call cublasGemmStridedBatchedEx m %d n %d k %d batch %d\n", m, n, k, count);
  if (!gemm_types_ok(at, bt, ct, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!gemm_args_ok(ta, tb, m, n, k, lda, ldb, ldc, count)) return CUBLAS_STATUS_INVALID_VALUE;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* a0 = static_cast<const T*>(A);
    const T* b0 = static_cast<const T*>(B);
    T* c0 = static_cast<T*>(C);
    const T al = *static_cast<const T*>(alpha), be = *static_cast<const T*>(beta);
    emu_submit([=] {
      gemm_batch<T>(ta, tb, m, n, k, &al, lda, ldb, &be, ldc, count, compute,
                    [&](int i, const T*& a, const T*& b, T*& c) {
                      a = a0 + i * sA;
                      b = b0 + i * sB;
                      c = c0 + i * sC;
                    });
    });
  };
  at == CUDA_R_32F ? run(float{}) : run(double{});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* const A[], cudaDataType_t at, int lda,
                                   const void* const B[], cudaDataType_t bt, int ldb, const void* beta, void* const C[],
                                   cudaDataType_t ct, int ldc, int count, cublasComputeType_t compute,
                                   cublasGemmAlgo_t) {
  if (trace_launches()) std::fprintf(stderr, "emu call cublasGemmBatchedEx m %d n %d k %d batch %d\n", m, n, k, count);
  if (!gemm_types_ok(at, bt, ct, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!gemm_args_ok(ta, tb, m, n, k, lda, ldb, ldc, count)) return CUBLAS_STATUS_INVALID_VALUE;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T al = *static_cast<const T*>(alpha), be = *static_cast<const T*>(beta);
    // The pointer arrays are device memory: read when the GEMM runs (a kernel may write them first).
    emu_submit([=] {
      gemm_batch<T>(ta, tb, m, n, k, &al, lda, ldb, &be, ldc, count, compute,
                    [&](int i, const T*& a, const T*& b, T*& c) {
                      a = static_cast<const T*>(A[i]);
                      b = static_cast<const T*>(B[i]);
                      c = static_cast<T*>(C[i]);
                    });
    });
  };
  at == CUDA_R_32F ? run(float{}) : run(double{});
  return CUBLAS_STATUS_SUCCESS;
}
}

// ---- cuBLASLt ------------------------------------------------------------------------------------------
// The subset Linea uses: one plain float32 GEMM per call with the BIAS or BGRADB epilogue (or
// none), descriptors checked as cuBLASLt documents them, the heuristic always offering one
// algorithm. Inputs are rounded per the compute type, as the cuBLAS fakes do.
namespace {
struct LtDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
};
struct LtLayout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
int g_lt_dummy;
}  // namespace

extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(&g_lt_dummy);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(new LtDesc{compute, scale});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete reinterpret_cast<LtDesc*>(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  LtDesc* desc = reinterpret_cast<LtDesc*>(d);
  if (buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &desc->transa : &desc->transb, buf, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&desc->epilogue, buf, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&desc->bias, buf, size);
      return CUBLAS_STATUS_SUCCESS;
    default:
      std::fprintf(stderr, "emu cublasLt: unsupported matmul attribute %d\n", int(attr));
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (ld < static_cast<int64_t>(std::max<uint64_t>(rows, 1))) {
    std::fprintf(stderr, "emu cublasLt: layout ld %lld < rows %llu\n", (long long)ld, (unsigned long long)rows);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(new LtLayout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete reinterpret_cast<LtLayout*>(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(&g_lt_dummy);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void* buf, size_t) {
  return buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  const LtDesc* desc = reinterpret_cast<const LtDesc*>(d);
  const uint32_t e = desc->epilogue;
  *returned = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_BGRADB)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // EMU_LT_NO_ALGO=1: no algorithm for any matmul, as cuBLASLt answers for a layout its kernels
  // do not take (the callers' fallbacks run).
  static const bool no_algo = std::getenv("EMU_LT_NO_ALGO") != nullptr;
  if (no_algo) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::memset(&results[0], 0, sizeof(results[0]));
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* C, cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t) {
  trace_call("cublasLtMatmul");
  const LtDesc* desc = reinterpret_cast<const LtDesc*>(d);
  const LtLayout *a = reinterpret_cast<const LtLayout*>(la), *b = reinterpret_cast<const LtLayout*>(lb),
                 *c = reinterpret_cast<const LtLayout*>(lc), *dl = reinterpret_cast<const LtLayout*>(ld);
  const bool na = desc->transa == CUBLAS_OP_N, nb = desc->transb == CUBLAS_OP_N;
  const uint64_t m = dl->rows, n = dl->cols, k = na ? a->cols : a->rows;
  const bool shapes_ok = (na ? a->rows : a->cols) == m && (nb ? b->rows : b->cols) == k &&
                         (nb ? b->cols : b->rows) == n && c->rows == m && c->cols == n && c->ld == dl->ld;
  const bool types_ok = a->type == CUDA_R_32F && b->type == CUDA_R_32F && c->type == CUDA_R_32F &&
                        dl->type == CUDA_R_32F && desc->scale == CUDA_R_32F &&
                        (desc->compute == CUBLAS_COMPUTE_32F || desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                         desc->compute == CUBLAS_COMPUTE_32F_FAST_16BF);
  const bool vector_ok = desc->epilogue == CUBLASLT_EPILOGUE_DEFAULT || desc->bias != nullptr;
  if (!shapes_ok || !types_ok || !vector_ok || algo == nullptr || !alpha || !beta) {
    std::fprintf(stderr, "emu cublasLt: invalid matmul (shapes %d types %d vector %d)\n", shapes_ok, types_ok,
                 vector_ok);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  emu_submit([=, desc = *desc, a = *a, b = *b, c = *c, dl = *dl] {
    const float* pa = static_cast<const float*>(A);
    const float* pb = static_cast<const float*>(B);
    const float* pc = static_cast<const float*>(C);
    float* pd = static_cast<float*>(D);
    auto at = [&](uint64_t i, uint64_t l) { return na ? pa[i + l * a.ld] : pa[l + i * a.ld]; };  // op(A)[i, l]
    auto bt = [&](uint64_t l, uint64_t j) { return nb ? pb[l + j * b.ld] : pb[j + l * b.ld]; };  // op(B)[l, j]
    float* vec = static_cast<float*>(desc.bias);
    if (desc.epilogue == CUBLASLT_EPILOGUE_BGRADB)  // read B before D is written (they never alias in Linea)
      for (uint64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (uint64_t l = 0; l < k; ++l) sum += bt(l, j);
        vec[j] = static_cast<float>(sum);
      }
    std::vector<float> out(m * n);
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        double s = 0;
        for (uint64_t l = 0; l < k; ++l) s += round_input(at(i, l), desc.compute) * round_input(bt(l, j), desc.compute);
        float r = static_cast<float>(al * s + (be == 0.0f ? 0.0 : be * pc[i + j * c.ld]));  // a float32 accumulator
        if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS) r = r + vec[i];
        out[i + j * m] = r;
      }
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) pd[i + j * dl.ld] = out[i + j * m];
  });
  return CUBLAS_STATUS_SUCCESS;
}
}  // extern "C"

// ---- cuFFT --------------------------------------------------------------------------------------------
namespace {
struct FftPlan {
  int n, batch, idist, odist;
  cufftType type;
};
std::map<int, FftPlan> g_plans;
int g_next_plan = 1;

template <typename T>
void dft_r2c(const FftPlan& p, T* in, T* out) {
  const int nf = p.n / 2 + 1;
  for (int b = 0; b < p.batch; ++b) {
    const T* x = in + (long long)b * p.idist;
    T* y = out + 2LL * b * p.odist;
    for (int k = 0; k < nf; ++k) {
      long double re = 0, im = 0;
      for (int t = 0; t < p.n; ++t) {
        const long double th = -2.0L * M_PIl * (long double)((long long)k * t % p.n) / p.n;
        re += x[t] * std::cos(th);
        im += x[t] * std::sin(th);
      }
      y[2 * k] = static_cast<T>(re);
      y[2 * k + 1] = static_cast<T>(im);
    }
  }
  // an out-of-place transform may scribble on its input: make sure nobody relies on it
  for (long long i = 0; i < (long long)p.batch * p.idist; ++i) in[i] = T(12345);
}

// C2R takes the spectrum of a real signal: cuFFT leaves the result undefined when the imaginary
// part of bin 0 or (n even) bin n/2 is not 0, so a row with one comes out NaN here (FFTW would
// ignore it), and the callers' zeroing of those parts is tested.
template <typename T>
void dft_c2r(const FftPlan& p, T* in, T* out) {
  const int nf = p.n / 2 + 1;
  for (int b = 0; b < p.batch; ++b) {
    const T* X = in + 2LL * b * p.idist;
    T* x = out + (long long)b * p.odist;
    const int bad_bin = X[1] != T(0) ? 0 : p.n % 2 == 0 && X[p.n + 1] != T(0) ? p.n / 2 : -1;
    if (bad_bin >= 0) {
      std::fprintf(stderr, "emu cufft: C2R row %d has imaginary part %g at bin %d: its output is NaN\n", b,
                   static_cast<double>(X[2 * bad_bin + 1]), bad_bin);
      for (int t = 0; t < p.n; ++t) x[t] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    for (int t = 0; t < p.n; ++t) {
      long double s = X[0];  // Re(X0)
      for (int k = 1; k < nf; ++k) {
        const long double th = 2.0L * M_PIl * (long double)((long long)k * t % p.n) / p.n;
        const long double term = X[2 * k] * std::cos(th) - X[2 * k + 1] * std::sin(th);
        s += (p.n % 2 == 0 && k == p.n / 2) ? term : 2 * term;
      }
      x[t] = static_cast<T>(s);
    }
  }
  for (long long i = 0; i < 2LL * p.batch * p.idist; ++i) in[i] = T(-777);
}
}  // namespace

extern "C" {
cufftResult cufftPlanMany(cufftHandle* plan, int rank, int* n, int* inembed, int istride, int idist, int* onembed,
                          int ostride, int odist, cufftType type, int batch) {
  if (rank != 1 || n[0] < 1 || batch < 1 || istride != 1 || ostride != 1 || !inembed || !onembed)
    return CUFFT_INVALID_VALUE;
  const int nf = n[0] / 2 + 1;
  const bool r2c = type == CUFFT_R2C || type == CUFFT_D2Z;
  if (r2c ? (idist < n[0] || odist < nf) : (idist < nf || odist < n[0])) return CUFFT_INVALID_VALUE;
  *plan = g_next_plan++;
  g_plans[*plan] = FftPlan{n[0], batch, idist, odist, type};
  return CUFFT_SUCCESS;
}
cufftResult cufftSetStream(cufftHandle p, cudaStream_t) { return g_plans.count(p) ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN; }
cufftResult cufftDestroy(cufftHandle p) { return g_plans.erase(p) ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN; }
cufftResult cufftExecR2C(cufftHandle p, cufftReal* in, cufftComplex* out) {
  trace_call("cufftExecR2C");
  auto it = g_plans.find(p);
  if (it == g_plans.end() || it->second.type != CUFFT_R2C) return CUFFT_INVALID_PLAN;
  emu_submit([plan = it->second, in, out] { dft_r2c(plan, in, reinterpret_cast<float*>(out)); });
  return CUFFT_SUCCESS;
}
cufftResult cufftExecD2Z(cufftHandle p, cufftDoubleReal* in, cufftDoubleComplex* out) {
  trace_call("cufftExecD2Z");
  auto it = g_plans.find(p);
  if (it == g_plans.end() || it->second.type != CUFFT_D2Z) return CUFFT_INVALID_PLAN;
  emu_submit([plan = it->second, in, out] { dft_r2c(plan, in, reinterpret_cast<double*>(out)); });
  return CUFFT_SUCCESS;
}
cufftResult cufftExecC2R(cufftHandle p, cufftComplex* in, cufftReal* out) {
  trace_call("cufftExecC2R");
  auto it = g_plans.find(p);
  if (it == g_plans.end() || it->second.type != CUFFT_C2R) return CUFFT_INVALID_PLAN;
  emu_submit([plan = it->second, in, out] { dft_c2r(plan, reinterpret_cast<float*>(in), out); });
  return CUFFT_SUCCESS;
}
cufftResult cufftExecZ2D(cufftHandle p, cufftDoubleComplex* in, cufftDoubleReal* out) {
  trace_call("cufftExecZ2D");
  auto it = g_plans.find(p);
  if (it == g_plans.end() || it->second.type != CUFFT_Z2D) return CUFFT_INVALID_PLAN;
  emu_submit([plan = it->second, in, out] { dft_c2r(plan, reinterpret_cast<double*>(in), out); });
  return CUFFT_SUCCESS;
}
}

// ---- cuRAND ---------------------------------------------------------------------------------------------
namespace {
struct Gen {
  unsigned long long seed = 0, offset = 0;
};
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double u01(const Gen* g, uint64_t i) {  // (0, 1]
  return (double)((mix(g->seed * 0x100000001b3ull ^ mix(g->offset + i)) >> 11) + 1) / 9007199254740992.0;
}
}  // namespace

template <typename T>
static curandStatus_t normal_impl(curandGenerator_t g, T* p, size_t n, T mean, T sd) {
  if (n % 2) return CURAND_STATUS_LENGTH_NOT_MULTIPLE;
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T))) return CURAND_STATUS_LENGTH_NOT_MULTIPLE;
  Gen* G = reinterpret_cast<Gen*>(g);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2 * std::log(u01(G, i))), th = 2 * M_PI * u01(G, i + 1);
    p[i] = static_cast<T>(mean + sd * r * std::cos(th));
    p[i + 1] = static_cast<T>(mean + sd * r * std::sin(th));
  }
  G->offset += n;
  return CURAND_STATUS_SUCCESS;
}
extern "C" {
curandStatus_t curandCreateGenerator(curandGenerator_t* g, curandRngType_t t) {
  if (t != CURAND_RNG_PSEUDO_PHILOX4_32_10) return CURAND_STATUS_TYPE_ERROR;
  *g = reinterpret_cast<curandGenerator_t>(new Gen());
  return CURAND_STATUS_SUCCESS;
}
curandStatus_t curandSetStream(curandGenerator_t, cudaStream_t) { return CURAND_STATUS_SUCCESS; }
curandStatus_t curandSetPseudoRandomGeneratorSeed(curandGenerator_t g, unsigned long long s) {
  reinterpret_cast<Gen*>(g)->seed = s;
  reinterpret_cast<Gen*>(g)->offset = 0;
  return CURAND_STATUS_SUCCESS;
}
curandStatus_t curandSetGeneratorOffset(curandGenerator_t g, unsigned long long o) {
  reinterpret_cast<Gen*>(g)->offset = o;
  return CURAND_STATUS_SUCCESS;
}
curandStatus_t curandGenerateUniform(curandGenerator_t g, float* p, size_t n) {
  trace_call("curandGenerateUniform");
  Gen* G = reinterpret_cast<Gen*>(g);
  for (size_t i = 0; i < n; ++i) p[i] = std::max(static_cast<float>(u01(G, i)), 1e-30f);
  G->offset += n;
  return CURAND_STATUS_SUCCESS;
}
curandStatus_t curandGenerateUniformDouble(curandGenerator_t g, double* p, size_t n) {
  trace_call("curandGenerateUniformDouble");
  Gen* G = reinterpret_cast<Gen*>(g);
  for (size_t i = 0; i < n; ++i) p[i] = u01(G, i);
  G->offset += n;
  return CURAND_STATUS_SUCCESS;
}
curandStatus_t curandGenerateNormal(curandGenerator_t g, float* p, size_t n, float mean, float sd) {
  trace_call("curandGenerateNormal");
  return normal_impl(g, p, n, mean, sd);
}
curandStatus_t curandGenerateNormalDouble(curandGenerator_t g, double* p, size_t n, double mean, double sd) {
  trace_call("curandGenerateNormalDouble");
  return normal_impl(g, p, n, mean, sd);
}
}
