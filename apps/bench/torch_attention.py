#!/usr/bin/python3
"""attention-vs-torch: Linea's attention mechanisms against PyTorch-eager versions of the same formulas.

Forward+backward time of every mechanism at every length, for Linea (the `attention-scaling`
binary, as a subprocess) and for PyTorch eager (in this process), alternating per length
(Linea at L, then PyTorch at L, then the next length) so that load from other processes on a
shared machine hits both alike. Prints the speed-up of Linea over PyTorch (PyTorch's time /
Linea's) and writes every number as JSON lines. Optional: needs PyTorch (Debian's
`python3-torch`); the project does not depend on it otherwise.

The PyTorch versions follow Linea's formulas step for step (attention/*/ *.cpp), with fixed
random features (no redraw on either side; the draw itself is not what is compared):
  softmax    softmax(q k^T / sqrt(D)) v
  performer  FAVOR+ positive features exp(W q~ - |q~|^2/2) / sqrt(S), q~ = q D^-1/4, orthogonal W,
             the detached max stabilizers, [v, 1] for numerator and denominator in one product
  lara       segment landmarks, the qk proposal, importance weights and the mixture (LARA paper)
  ra         randomized attention: pi = softmax(q~ k~^T), S indices drawn from pi, w = q~ + k~_m + eps
  nprf_rpe   normalized positive random features and a relative-position bias, the two Toeplitz
             sums over keys by real FFT (torch.fft.rfft) over the S*Dv channels of phi(k) v^T

Timed work per case, on both sides: out = attention(q, k, v) with q, k, v [B, H, L, D] ~ N(0, 1)
requiring grad, (out * g).sum(), backward; one warm-up, then the median of --repeats runs.

On a GPU (--device cuda) both sides run there, each case's peak memory is measured too (Linea:
its allocator's high-water mark; PyTorch: torch.cuda.max_memory_allocated, both less what was
live before) and printed as a ratio, and PyTorch's softmax is its fused SDPA
(F.scaled_dot_product_attention). --sdpa (the default on cuda) adds SDPA's time in float32 and in
bfloat16 at every length as the reference the other mechanisms are held to. A case that runs out
of memory is n/a. --dims runs every length at several head dims. --bf16 (cuda) adds Linea's
softmax, performer and lara (those of --specs) under --precision bf16 (their fused kernels' and
GEMMs' products on the tensor cores in bf16, float32 tensors) against SDPA in bfloat16, the "same
dtype" comparison.

Usage:
  apps/bench/torch_attention.py [--linea build/release/apps/bench/attention-scaling]
      [--device cpu|cuda] [--lengths 1024,2048,4096,8192] [--specs softmax,performer,lara,nprf_rpe]
      [--features 16] [--batch 1] [--heads 2] [--dims 64] [--threads 2] [--repeats 5] [--sdpa] [--bf16]
      [--json FILE]
(--linea may be a command with arguments, e.g. a carried bundle's "run.sh bin/attention-scaling".)
"""

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time


# The mechanisms whose products follow --precision bf16 on CUDA (nprf_rpe's FFT path does not).
BF16_SPECS = ("softmax", "performer", "lara")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--linea", default="build/release/apps/bench/attention-scaling", help="attention-scaling binary")
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--specs", default="softmax,performer,lara,nprf_rpe",
                   help="mechanism names (softmax, performer, lara, ra, nprf_rpe); --features sets their S")
    p.add_argument("--features", type=int, default=16, help="random features (performer, nprf_rpe) or samples (lara, ra)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dims", "--dim", default="64", help="head dims D (= Dv), comma-separated")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sdpa", action="store_true", help="also time PyTorch's SDPA in float32 and bfloat16 (on cuda: always)")
    p.add_argument("--bf16", action="store_true",
                   help="on cuda: also Linea's softmax, performer and lara under --precision bf16 against SDPA in "
                        "bfloat16")
    p.add_argument("--threads", type=int, default=2, help="threads for both (OpenMP/OpenBLAS and torch)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="attention_vs_torch.json")
    return p.parse_args()


def linea_spec(name, S, L):
    """The attention-scaling spec of the same formula: fixed features, S of them."""
    if name == "softmax":
        return "softmax"
    if name == "performer":
        return f"performer:features={S},redraw=0"
    if name == "lara":
        return f"lara:samples={S}"
    if name == "ra":
        return f"ra:samples={S}"
    if name == "nprf_rpe":  # the FFT path, as PyTorch's version; max_len covers L
        return f"nprf_rpe:features={S},redraw=0,dense=0,max_len={L}"
    raise SystemExit(f"torch_attention.py: unknown mechanism '{name}' (softmax, performer, lara, ra, nprf_rpe)")


# ---- PyTorch-eager formulas ------------------------------------------------------------------

def make_torch_mechanisms(torch, H, D, S, L, gen, dev):
    """The formulas with their fixed tables drawn from gen (CPU) and moved to dev; per-call draws
    (lara's noise, ra's samples) from a generator on dev."""
    F = torch.nn.functional
    dgen = torch.Generator(device=dev).manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))

    def orthogonal_gaussian():
        # blocks of D orthonormal rows (QR of a Gaussian), each row scaled by a chi(D) length
        rows = []
        for _ in range(H):
            blocks, left = [], S
            while left > 0:
                q, _ = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
                n = min(D, left)
                blocks.append(q.T[:n] * torch.randn(n, D, generator=gen, dtype=torch.float64).norm(dim=1, keepdim=True))
                left -= n
            rows.append(torch.cat(blocks))
        return torch.stack(rows).float().to(dev)  # [H, S, D]

    def softmax(q, k, v):
        if dev != "cpu":  # PyTorch's fused kernel: what a GPU user runs
            return F.scaled_dot_product_attention(q, k, v)
        return torch.softmax((q / math.sqrt(D)) @ k.transpose(-2, -1), -1) @ v

    omega_p = orthogonal_gaussian()

    def performer(q, k, v):
        inv_sqrt_s = 1.0 / math.sqrt(S)
        qs, ks = q * D ** -0.25, k * D ** -0.25
        lq = qs @ omega_p.transpose(-2, -1) - 0.5 * (qs * qs).sum(-1, keepdim=True)
        phi_q = torch.exp(lq - lq.detach().amax(-1, keepdim=True)) * inv_sqrt_s
        lk = ks @ omega_p.transpose(-2, -1) - 0.5 * (ks * ks).sum(-1, keepdim=True)
        phi_k = torch.exp(lk - lk.detach().amax((2, 3), keepdim=True)) * inv_sqrt_s
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)
        out = phi_q @ (phi_k.transpose(-2, -1) @ v1)
        den = out[..., -1:]
        return out[..., :-1] / torch.where(den.detach().abs() < 1e-30, torch.full_like(den, 1e-30), den)

    def log_xi(w, x):  # w x^T - (|x|^2/2)^T
        return w @ x.transpose(-2, -1) - 0.5 * (x * x).sum(-1).unsqueeze(-2)

    C = min(S, L)
    sizes = [L // C + (1 if c >= C - L % C else 0) for c in range(C)]
    member = torch.zeros(C, L)
    start = 0
    for c, n in enumerate(sizes):
        member[c, start:start + n] = 1.0
        start += n
    avg = (member / member.sum(-1, keepdim=True)).to(dev)

    def lara(q, k, v):
        B = q.shape[0]
        qs, ks = q * D ** -0.25, k * D ** -0.25
        qbar, kbar = avg @ qs, avg @ ks
        mu = qbar + kbar
        w = mu + torch.randn(B, H, C, D, generator=dgen, device=dev)
        l = log_xi(w, mu)
        l_diag = (w * mu).sum(-1) - 0.5 * (mu * mu).sum(-1)
        self_w = torch.exp(l_diag - torch.logsumexp(l, -1)).unsqueeze(2)
        t = torch.softmax(qs @ qbar.transpose(-2, -1), 2)
        alpha = torch.clamp(self_w + (t - t.mean(-1, keepdim=True)), min=1e-8)
        lk = log_xi(w, ks)
        probs = torch.softmax(lk, -1)
        lse_k = torch.logsumexp(lk, -1)
        lq = log_xi(w, qs).transpose(-2, -1)
        log_u = torch.log(alpha) + lq + (lse_k - l_diag).unsqueeze(2)
        return torch.softmax(log_u, -1) @ (probs @ v)

    def ra(q, k, v):
        B, N, M = q.shape[0], q.shape[2], k.shape[2]
        qs, ks = q * D ** -0.25, k * D ** -0.25
        pi = torch.softmax(qs @ ks.transpose(-2, -1), -1)
        with torch.no_grad():
            index = torch.multinomial(pi.reshape(-1, M), S, replacement=True, generator=dgen).reshape(B, H, N * S)
        k_sel = torch.gather(ks, 2, index.unsqueeze(-1).expand(B, H, N * S, D)).reshape(B, H, N, S, D)
        w = qs.unsqueeze(3) + k_sel + torch.randn(B, H, N, S, D, generator=dgen, device=dev)
        p = torch.softmax(log_xi(w.reshape(B, H, N * S, D), ks), -1)
        return p.reshape(B, H, N, S, M).mean(3) @ v

    omega_n = orthogonal_gaussian()
    rpe = (0.1 * torch.randn(H, 2 * L - 1, generator=gen)).to(dev).requires_grad_()
    n_fft = fft_length(2 * L - 1)

    def nprf_rpe(q, k, v):
        B, N, M, Dv = q.shape[0], q.shape[2], k.shape[2], v.shape[3]
        inv_sqrt_s = 1.0 / math.sqrt(S)
        qh, kh = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        lq = qh @ omega_n.transpose(-2, -1) - 0.5 * (qh * qh).sum(-1, keepdim=True)
        phi_q = torch.exp(lq - lq.detach().amax(-1, keepdim=True)) * inv_sqrt_s
        lk = kh @ omega_n.transpose(-2, -1) - 0.5 * (kh * kh).sum(-1, keepdim=True)
        phi_k = torch.exp(lk - lk.detach().amax((2, 3), keepdim=True)) * inv_sqrt_s
        b = rpe[:, L - N:L - N + N + M - 1]
        c = torch.exp(b - b.detach().amax(1, keepdim=True))  # [H, N+M-1], offsets -(N-1)..(M-1)
        # circulant embedding: c_0..c_{M-1}, zeros, c_{-(N-1)}..c_{-1}; y_i = sum_j g_{(j-i) mod n} x_j
        g = torch.cat([c[:, N - 1:], c.new_zeros(H, n_fft - (N + M - 1)), c[:, :N - 1]], -1)
        G = torch.fft.rfft(g, n_fft).unsqueeze(1)  # [H, 1, F]
        pk = phi_k.transpose(-2, -1)  # [B, H, S, M]
        kv = (pk.unsqueeze(3) * v.transpose(-2, -1).unsqueeze(2)).reshape(B, H, S * Dv, M)
        ykv = torch.fft.irfft(torch.fft.rfft(kv, n_fft) * G.conj(), n_fft)[..., :N].reshape(B, H, S, Dv, N)
        yk = torch.fft.irfft(torch.fft.rfft(pk, n_fft) * G.conj(), n_fft)[..., :N]  # [B, H, S, N]
        pq = phi_q.transpose(-2, -1)
        num = (pq.unsqueeze(3) * ykv).sum(2).transpose(-2, -1)
        den = (pq * yk).sum(2, keepdim=True).transpose(-2, -1)
        return num / den.clamp(min=1e-18)

    return {"softmax": softmax, "performer": performer, "lara": lara, "ra": ra, "nprf_rpe": nprf_rpe}


def fmt(x, spec):
    """x formatted, or n/a for a case that did not run (out of memory, refused)."""
    return "n/a" if x is None else format(x, spec)


def fft_length(n):
    """The smallest 5-smooth length >= n (Linea's fft_length)."""
    while True:
        r = n
        for p in (2, 3, 5):
            while r % p == 0:
                r //= p
        if r == 1:
            return n
        n += 1


def time_torch(torch, fn, B, H, L, D, repeats, gen, dev, dtype=None):
    """Median ms of forward+backward and the peak memory it added (MB; None on the CPU), or
    (None, [], None) when it runs out of memory."""
    dtype = dtype or torch.float32
    q, k, v = (torch.randn(B, H, L, D, generator=gen).to(dev, dtype).requires_grad_() for _ in range(3))
    g = torch.randn(B, H, L, D, generator=gen).to(dev, dtype)
    cuda = dev != "cpu"

    def step():
        q.grad = k.grad = v.grad = None
        (fn(q, k, v) * g).sum().backward()

    try:
        step()  # warm-up
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            live = torch.cuda.memory_allocated()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        mb = (torch.cuda.max_memory_allocated() - live) / 2**20 if cuda else None
    except torch.cuda.OutOfMemoryError:
        q = k = v = g = None
        torch.cuda.empty_cache()
        return None, [], None
    q = k = v = g = None
    if cuda:
        torch.cuda.empty_cache()
    return statistics.median(times), times, mb


def time_linea(args, specs, L, D, repeats=None, precision="fp32"):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "linea.json")
        cmd = shlex.split(args.linea) + [
               "--specs", ",".join(specs), "--lengths", str(L), "--batch", str(args.batch), "--device", args.device,
               "--heads", str(args.heads), "--dim", str(D), "--threads", str(args.threads),
               "--repeats", str(repeats or args.repeats), "--seed", str(args.seed), "--max-seconds", "1000",
               "--precision", precision, "--json", out]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"torch_attention.py: {' '.join(cmd)} failed:\n{run.stderr or run.stdout}")
        rows = [json.loads(line) for line in open(out) if line.strip()]
    by_spec = {r["spec"]: r for r in rows}
    return by_spec, rows[0]["device"] if rows else "?"


def same_blas_kernels(args):
    """Both sides on the same OpenBLAS kernels (PyTorch's GEMMs go through OpenBLAS too).

    Linea's programs replace OpenBLAS's generic fallback kernels (an OpenBLAS older than the CPU)
    with ones that fit the CPU by setting OPENBLAS_CORETYPE (apps/common/process_env.h). A short
    Linea run names the kernels it used; the same value goes into this process's environment
    before PyTorch loads OpenBLAS, and the later Linea runs inherit it. A value the user set is
    kept for both."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    if args.device != "cpu":
        return
    probe, _ = time_linea(args, ["softmax"], 16, 16, repeats=3)
    m = re.search(r"(\w+) kernels\)", probe["softmax"]["device"])
    if m:
        os.environ["OPENBLAS_CORETYPE"] = m.group(1)


def torch_blas_kernels():
    """The core type of the OpenBLAS that PyTorch loaded, or '?'."""
    try:
        import ctypes
        for lib in ("libblas.so.3", "libopenblas.so.0"):
            try:
                f = ctypes.CDLL(lib).openblas_get_corename
            except (OSError, AttributeError):
                continue
            f.restype = ctypes.c_char_p
            return f().decode()
    except Exception:  # a name in a report is not worth failing for
        pass
    return "?"


def main():
    args = parse_args()
    if not os.access(shlex.split(args.linea)[0], os.X_OK):
        raise SystemExit(f"torch_attention.py: {args.linea} not found; build it first (cmake --build build/release)")
    same_blas_kernels(args)
    try:
        import torch
    except ImportError:
        raise SystemExit("torch_attention.py: needs PyTorch (Debian: apt-get install python3-torch)")
    torch_kernels = torch_blas_kernels() if args.device == "cpu" else "-"
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    dev = args.device
    if dev == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_attention.py: --device cuda, but this PyTorch sees no GPU")
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on both sides
        torch.backends.cudnn.allow_tf32 = False
    sdpa = args.sdpa or dev == "cuda"
    if args.bf16 and dev != "cuda":
        raise SystemExit("torch_attention.py: --bf16 needs --device cuda (Linea's bf16 precision is the GPU's)")
    bf16_names = [n for n in args.specs.split(",") if n in BF16_SPECS] if args.bf16 else []
    if args.bf16 and not bf16_names:
        raise SystemExit(f"torch_attention.py: --bf16 compares Linea's {', '.join(BF16_SPECS)}: keep one in --specs")
    if sdpa and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        raise SystemExit(f"torch_attention.py: SDPA (--sdpa, --device cuda) needs PyTorch 2.0 or later, "
                         f"this is {torch.__version__}")
    names = [s for s in args.specs.split(",") if s]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    dims = [int(x) for x in args.dims.split(",") if x]
    S, B, H = args.features, args.batch, args.heads
    cols = names + [n + " bf16" for n in bf16_names] + (["SDPA fp32", "SDPA bf16"] if sdpa else [])

    results, device = [], "?"
    with open(args.json, "w") as js:
        for D in dims:
            for L in lengths:
                specs = [linea_spec(n, S, L) for n in names]
                linea, device = time_linea(args, specs, L, D)
                gen = torch.Generator().manual_seed(args.seed)
                mechs = make_torch_mechanisms(torch, H, D, S, L, gen, dev)
                cases = [(n, sp, mechs[n], None, linea) for n, sp in zip(names, specs)]
                f = torch.nn.functional.scaled_dot_product_attention if sdpa else None
                if bf16_names:
                    bf16_specs = [specs[names.index(n)] for n in bf16_names]
                    linea_bf16, _ = time_linea(args, bf16_specs, L, D, precision="bf16")
                    cases += [(n + " bf16", sp, f, torch.bfloat16, linea_bf16) for n, sp in zip(bf16_names, bf16_specs)]
                if sdpa:
                    cases += [("SDPA fp32", None, f, torch.float32, {}), ("SDPA bf16", None, f, torch.bfloat16, {})]
                for name, spec, fn, dtype, linea_rows in cases:
                    lr = linea_rows[spec] if spec else {}
                    torch_ms, torch_times, torch_mb = time_torch(torch, fn, B, H, L, D, args.repeats, gen, dev, dtype)
                    ok = lr.get("status") == "ok"
                    row = {"bench": "attention-vs-torch", "length": L, "mechanism": name, "linea_spec": spec,
                           "linea_ms": lr.get("ms"), "linea_times_ms": lr.get("times_ms"),
                           "linea_status": lr.get("status"), "linea_peak_mb": lr.get("peak_mb"),
                           "torch_ms": torch_ms, "torch_times_ms": torch_times, "torch_peak_mb": torch_mb,
                           "speedup": torch_ms / lr["ms"] if ok and torch_ms else None,
                           "memory_ratio": lr["peak_mb"] / torch_mb if ok and torch_mb else None,
                           "B": B, "H": H, "D": D, "S": S, "device": dev, "threads": args.threads,
                           "linea_device": device, "torch": torch.__version__,
                           "torch_device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           "torch_blas_kernels": torch_kernels}
                    results.append(row)
                    js.write(json.dumps(row) + "\n")
                    js.flush()
                    lm = lr.get("ms") if ok else None
                    mem = f"   memory {fmt(row['memory_ratio'], '.2f')}x" if dev == "cuda" else ""
                    print(f"  D={D:<4} L={L:<6} {name:<10} Linea {fmt(lm, '9.2f')} ms   PyTorch {fmt(torch_ms, '9.2f')} ms"
                          f"   {fmt(row['speedup'], '.2f')}x{mem}", flush=True)

    where = (f"on {torch.cuda.get_device_name()}" if dev == "cuda" else
             f"{args.threads} threads; Linea on {device}; PyTorch on OpenBLAS {torch_kernels} kernels")
    print(f"\nforward+backward, float32 (the bf16 columns: SDPA in bfloat16; Linea's float32 under --precision bf16), "
          f"B={B}, H={H}, {S} features/samples, "
          f"median of {args.repeats}, {where}. Mechanism cells: Linea ms / PyTorch ms (speed-up of Linea"
          + (", Linea's peak memory / PyTorch's)" if dev == "cuda" else ")") + "; SDPA cells: PyTorch ms\n")
    for D in dims:
        print(f"D = {D}\n")
        print("| L | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        for L in lengths:
            cells = []
            for name in cols:
                r = next(r for r in results if r["length"] == L and r["mechanism"] == name and r["D"] == D)
                if r["linea_spec"] is None:
                    cells.append(fmt(r["torch_ms"], ".3g"))
                    continue
                mem = f", {fmt(r['memory_ratio'], '.2f')}x mem" if dev == "cuda" else ""
                cells.append(f"{fmt(r['linea_ms'] if r['linea_status'] == 'ok' else None, '.3g')} / "
                             f"{fmt(r['torch_ms'], '.3g')} ({fmt(r['speedup'], '.2f')}x{mem})")
            print(f"| {L} | " + " | ".join(cells) + " |")
        print()
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
