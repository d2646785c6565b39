#!/usr/bin/env python3
"""Checks linea-attn against an independent PyTorch float64 implementation of the five mechanisms'
formulas (the papers', as attention/README.md states them), written without Linea's C++.

For every spec x variant (bidirectional, causal where supported, key padding, cross-attention
where supported, eval; float64 and float32) it draws inputs and every random quantity (omega,
eps, ra_index drawn from pi and never a padded key, a random rpe), writes them to a safetensors
file, runs the tool with dout, and compares out, dq, dk, dv (and drpe) with the reference and its
torch.autograd gradients. Prints a table of max abs / max rel errors; exits 1 if any float64 run
has max|err| / max(1, max|ref|) > 1e-9 or any float32 run has max|err| / max|ref| > 1e-4, or if
the tool fails.

    python3 apps/tools/check_linea_attn.py build/release/apps/tools/linea-attn [--only SPEC] [--device cuda]

Needs PyTorch (Debian: apt-get install python3-torch; use /usr/bin/python3 if another python3
comes first on PATH). A manual check, not a ctest: CI has no PyTorch.

Conventions (where the formulas leave a choice, the choice is named here):
  x~ = D^-1/4 x; log xi(x, w) = w.x - |x|^2/2; key padding: a padded key contributes to neither
  numerator nor denominator; causal: key m visible to query n iff m <= n; a query that sees no
  key gets 0.
  performer: omega [H, S, D] are the rows of W; feature_map=trf uses the 2S features
    exp(|x~|^2/2)/sqrt(S) [sin(W x~), cos(W x~)] (trigonometric features of the softmax kernel).
  lara: segments of sizes floor(N/C) then (N mod C) of size +1 at the end; with N <= C every
    token is its own segment (C' = N landmarks, eps [B, H, N, D]); key segment means k-_c are over
    the segment's non-padded keys (CHOICE: the formulas do not say whether padded keys count).
  nprf_rpe: rpe [H, 2L-1], offset t = j - i at index t + L - 1.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch

# ---- safetensors, from the format's description ------------------------------------------------
DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8), "U8": (torch.uint8, 1),
          "BOOL": (torch.bool, 1)}
NAMES = {v[0]: k for k, v in DTYPES.items()}


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        data = t.numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode())
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[b:e]), dtype=dtype) if e > b else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out, header.get("__metadata__", {})


# ---- reference formulas (float64) -----------------------------------------------------------------
def scaled(x):
    return x * x.shape[-1] ** -0.25  # x~ = D^-1/4 x


def log_xi(w, x):
    """log xi(x_m, w_p) = w_p.x_m - |x_m|^2/2: w [..., P, D], x [..., M, D] -> [..., P, M]."""
    return w @ x.transpose(-1, -2) - 0.5 * (x * x).sum(-1).unsqueeze(-2)


def visible(B, N, M, causal, pad):
    """Bool [B, 1, N, M]: key m visible to query n (padding, causal)."""
    vis = torch.ones(B, 1, N, M, dtype=torch.bool)
    if pad is not None:
        vis = vis & ~pad.bool()[:, None, None, :]
    if causal:
        vis = vis & torch.ones(N, M).tril().bool()
    return vis


def masked_softmax(logits, vis, dim=-1):
    """softmax over dim of the visible entries; all hidden gives 0."""
    x = torch.where(vis, logits, torch.tensor(-math.inf, dtype=logits.dtype))
    m = x.amax(dim, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m) * vis
    s = e.sum(dim, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))


def masked_logsumexp(logits, vis, dim=-1):
    x = torch.where(vis, logits, torch.tensor(-math.inf, dtype=logits.dtype))
    return torch.logsumexp(x, dim)


def ratio(A, v):
    """out_n = sum_m A_nm v_m / sum_m A_nm (0 where no key is visible)."""
    den = A.sum(-1, keepdim=True)
    return (A @ v) / torch.where(den != 0, den, torch.ones_like(den))


def ref_softmax(q, k, v, causal, pad, **_):
    D = q.shape[-1]
    A = masked_softmax(q @ k.transpose(-1, -2) / math.sqrt(D), visible(q.shape[0], q.shape[2], k.shape[2], causal, pad))
    return A @ v


def performer_features(x, W, kernel):
    """x [B, H, L, D] (already scaled), W [H, S, D] -> phi [B, H, L, S or 2S]."""
    S = W.shape[1]
    wx = x @ W.transpose(-1, -2)  # [B, H, L, S]
    sq = (x * x).sum(-1, keepdim=True)
    if kernel == "softmax":
        return torch.exp(wx - sq / 2) / math.sqrt(S)
    if kernel == "relu":
        return torch.relu(wx) + 1e-3
    if kernel == "trf":
        return torch.exp(sq / 2) / math.sqrt(S) * torch.cat([torch.sin(wx), torch.cos(wx)], -1)
    raise ValueError(kernel)


def ref_performer(q, k, v, causal, pad, omega, kernel="softmax", **_):
    # out_n = phi(q_n).sum_m phi(k_m) v_m^T / phi(q_n).sum_m phi(k_m), over the visible m
    pq, pk = performer_features(scaled(q), omega, kernel), performer_features(scaled(k), omega, kernel)
    A = (pq @ pk.transpose(-1, -2)) * visible(q.shape[0], q.shape[2], k.shape[2], causal, pad)
    return ratio(A, v)


def ra_pi(q, k, pad):
    """pi_n = softmax_m(q~_n.k~_m) over the non-padded keys: [B, H, N, M]."""
    return masked_softmax(scaled(q) @ scaled(k).transpose(-1, -2), visible(q.shape[0], q.shape[2], k.shape[2], False, pad))


def ref_ra(q, k, v, causal, pad, eps, ra_index=None, biased=False, eval=False, **_):
    B, H, N, D = q.shape
    M = k.shape[2]
    qs, ks = scaled(q), scaled(k)
    S = eps.shape[3]
    if biased:  # w_ns = q~_n + sum_m pi_nm k~_m + eps_ns (eps = 0 in eval)
        mean_k = ra_pi(q, k, pad) @ ks  # [B, H, N, D]
        w = (qs + mean_k)[:, :, :, None, :] + (0 * eps if eval else eps)
    else:  # w_ns = q~_n + k~_{m_ns} + eps_ns
        idx = ra_index[..., None].expand(B, H, N, S, D).reshape(B, H, N * S, D)
        k_sel = torch.gather(ks, 2, idx).reshape(B, H, N, S, D)
        w = qs[:, :, :, None, :] + k_sel + eps
    logits = log_xi(w.reshape(B, H, N * S, D), ks)  # [B, H, N*S, M]
    P = masked_softmax(logits, visible(B, N * S, M, False, pad))
    return (P @ v).reshape(B, H, N, S, -1).mean(3)  # (1/S) sum_s


def segments(N, C):
    """C' = min(C, N) contiguous segments; the first ones one shorter when N % C' != 0."""
    C = min(C, N)
    base, rem = divmod(N, C)
    sizes = [base] * (C - rem) + [base + 1] * rem
    seg = torch.zeros(C, N, dtype=torch.float64)
    start = 0
    for c, s in enumerate(sizes):
        seg[c, start:start + s] = 1
        start += s
    return seg  # [C', N] 0/1 membership


def ref_lara(q, k, v, causal, pad, eps=None, samples=16, proposal="qk", noise=1.0, beta=1.0, eval=False, **_):
    B, H, N, D = q.shape
    M = k.shape[2]
    qs, ks = scaled(q), scaled(k)
    seg = segments(N, samples).to(q.dtype)  # [C, N]
    qbar = (seg / seg.sum(-1, keepdim=True)) @ qs  # segment means q-_c [B, H, C, D]
    kseg = seg[None] * (1 - pad.to(q.dtype))[:, None, :] if pad is not None else seg[None].expand(B, -1, -1)
    kbar = (kseg / kseg.sum(-1, keepdim=True).clamp(min=1))[:, None] @ ks  # k-_c over non-padded keys
    if proposal == "qk":
        mu = qbar + kbar
    else:  # mixed: mu_c = q-_c + sum_c' softmax_c'(k-_c.k-_c') k-_c'
        mu = qbar + torch.softmax(kbar @ kbar.transpose(-1, -2), -1) @ kbar
    w = mu if eval else mu + noise * eps  # [B, H, C, D]
    l = log_xi(w, mu)  # l_cc' = log xi(mu_c', w_c): [B, H, C, C]
    kvis = visible(B, 1, M, False, pad)  # [B, 1, 1, M]
    lk = log_xi(w, ks)  # log xi(k~_m, w_c) [B, H, C, M], padded: -inf
    f = masked_softmax(lk, kvis) @ v  # f_c [B, H, C, Dv]
    t = torch.softmax(qs @ qbar.transpose(-1, -2), dim=-2)  # t_nc: softmax over n [B, H, N, C]
    l_diag = torch.diagonal(l, dim1=-2, dim2=-1)  # l_cc [B, H, C]
    r = torch.exp(l_diag - torch.logsumexp(l, -1))  # [B, H, C]
    alpha = torch.clamp(r[:, :, None, :] + beta * (t - t.mean(-1, keepdim=True)), min=1e-8)
    log_u = (torch.log(alpha) + log_xi(w, qs).transpose(-1, -2) + masked_logsumexp(lk, kvis)[:, :, None, :]
             - l_diag[:, :, None, :])  # [B, H, N, C]
    return torch.softmax(log_u, -1) @ f


def ref_nprf_rpe(q, k, v, causal, pad, omega, rpe, **_):
    B, H, N, D = q.shape
    M = k.shape[2]
    qh, kh = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    S = omega.shape[1]

    def phi(x):  # exp(W x - |x|^2/2)/sqrt(S), no D^-1/4 scaling
        return torch.exp(x @ omega.transpose(-1, -2) - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(S)

    L = (rpe.shape[1] + 1) // 2
    offset = torch.arange(M)[None, :] - torch.arange(N)[:, None]  # j - i [N, M]
    bias = rpe[:, offset + L - 1]  # b_{j-i} [H, N, M]
    A = (phi(qh) @ phi(kh).transpose(-1, -2)) * torch.exp(bias) * visible(B, N, M, causal, pad)
    return ratio(A, v)


# ---- cases --------------------------------------------------------------------------------------
# (spec, reference, keyword arguments, [variants])  variant: name -> (N, M, causal, padded, eval)
V = {
    "bidirectional": (9, 9, False, False, False),
    "causal": (9, 9, True, False, False),
    "padded": (9, 9, False, True, False),
    "causal+padded": (9, 9, True, True, False),
    "cross": (9, 12, False, False, False),
    "cross+padded": (9, 12, False, True, False),
    "eval": (9, 9, False, True, True),
    "N<=C": (3, 3, False, False, False),
    "N%C==0": (8, 8, False, True, False),
}
FULL = ["bidirectional", "causal", "padded", "causal+padded", "cross", "cross+padded", "eval"]
NOCROSS = ["bidirectional", "padded", "eval"]
CASES = [
    ("softmax", ref_softmax, {}, FULL),
    ("performer:features=16", ref_performer, {"kernel": "softmax"}, FULL),
    ("performer:features=16,feature_map=relu", ref_performer, {"kernel": "relu"}, FULL),
    ("performer:features=64,feature_map=trf", ref_performer, {"kernel": "trf"}, FULL),
    ("ra:samples=3", ref_ra, {}, NOCROSS),
    ("ra:samples=3,biased=1", ref_ra, {"biased": True}, NOCROSS),
    ("lara:samples=4", ref_lara, {"samples": 4}, NOCROSS + ["N<=C", "N%C==0"]),
    ("lara:samples=4,proposal=mixed", ref_lara, {"samples": 4, "proposal": "mixed"}, NOCROSS + ["N<=C", "N%C==0"]),
    ("lara:samples=4,noise=0.5,beta=0.3", ref_lara, {"samples": 4, "noise": 0.5, "beta": 0.3}, ["padded"]),
    ("nprf_rpe:features=16", ref_nprf_rpe, {}, FULL),
    ("nprf_rpe:features=16,dense=1", ref_nprf_rpe, {}, FULL),
]
B, H, D, DV = 2, 2, 4, 3


def features(spec):
    for part in spec.split(":", 1)[-1].split(","):
        if part.startswith("features="):
            return int(part.split("=")[1])
    return 128


def make_inputs(spec, kw, variant, gen):
    """All float64; random quantities drawn from the mechanisms' distributions (valid by construction)."""
    N, M, causal, padded, ev = V[variant]
    name = spec.split(":")[0]
    t = {
        "q": torch.randn(B, H, N, D, generator=gen, dtype=torch.float64),
        "k": torch.randn(B, H, M, D, generator=gen, dtype=torch.float64),
        "v": torch.randn(B, H, M, DV, generator=gen, dtype=torch.float64),
        "dout": torch.randn(B, H, N, DV, generator=gen, dtype=torch.float64),
    }
    if name == "performer" and kw.get("kernel") == "trf":  # keep the (signed) trf denominators away from 0
        t["q"], t["k"] = t["q"] * 0.5, t["k"] * 0.5
    if padded:
        pad = torch.zeros(B, M, dtype=torch.int64)
        pad[0, -2:] = 1  # batch 0: the last two keys
        pad[1, 1] = 1  # batch 1: the second key
        t["key_padding_mask"] = pad
    pad = t.get("key_padding_mask")
    if name in ("performer", "nprf_rpe"):
        t["omega"] = torch.randn(H, features(spec), D, generator=gen, dtype=torch.float64)
    if name == "nprf_rpe":
        L = max(N, M) + 2
        t["rpe"] = 0.5 * torch.randn(H, 2 * L - 1, generator=gen, dtype=torch.float64)
    if name == "ra":
        S = int(spec.split("samples=")[1].split(",")[0])
        t["eps"] = torch.randn(B, H, N, S, D, generator=gen, dtype=torch.float64)
        if not kw.get("biased"):  # m_ns ~ Cat(pi_n): never a padded key
            pi = ra_pi(t["q"], t["k"], pad).reshape(-1, M)
            t["ra_index"] = torch.multinomial(pi, S, replacement=True, generator=gen).reshape(B, H, N, S)
    if name == "lara":
        C = min(kw["samples"], N)
        t["eps"] = torch.randn(B, H, C, D, generator=gen, dtype=torch.float64)
    return t, causal, ev


def reference(fn, kw, t, causal, ev):
    leaves = {n: t[n].to(torch.float64).clone().requires_grad_(True) for n in ("q", "k", "v")}
    extra = {n: t[n].to(torch.float64) for n in ("omega", "eps", "ra_index") if n in t}
    if "ra_index" in extra:
        extra["ra_index"] = t["ra_index"]
    if "rpe" in t:
        extra["rpe"] = t["rpe"].to(torch.float64).clone().requires_grad_(True)
    out = fn(leaves["q"], leaves["k"], leaves["v"], causal, t.get("key_padding_mask"), eval=ev, **kw, **extra)
    out.backward(t["dout"].to(torch.float64))
    res = {"out": out.detach(), "dq": leaves["q"].grad, "dk": leaves["k"].grad, "dv": leaves["v"].grad}
    if "rpe" in extra:
        res["drpe"] = extra["rpe"].grad
    return res


def run_case(tool, spec, fn, kw, variant, dtype, device, gen, tmp):
    t, causal, ev = make_inputs(spec, kw, variant, gen)
    if dtype == torch.float32:  # the reference uses the same rounded values
        t = {n: (x.to(torch.float32) if x.is_floating_point() else x) for n, x in t.items()}
    inp, outp = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    write_safetensors(inp, t)
    cmd = [tool, "--spec", spec, "--in", inp, "--out", outp, "--device", device] + (["--causal"] if causal else []) \
        + (["--eval"] if ev else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()[-1]
    got, meta = read_safetensors(outp)
    want = reference(fn, kw, t, causal, ev)
    errs = {}
    for name, w in want.items():
        if name not in got:
            return None, f"no '{name}' in the tool's output"
        g = got[name]
        if g.dtype != dtype or tuple(g.shape) != tuple(w.shape):
            return None, f"{name}: got {g.dtype} {tuple(g.shape)}, expected {dtype} {tuple(w.shape)}"
        diff = (g.to(torch.float64) - w).abs().max().item()
        scale = w.abs().max().item()
        errs[name] = (diff, diff / scale if scale > 0 else diff, scale)
    return errs, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tool", help="path to the linea-attn executable")
    ap.add_argument("--only", help="check only this mechanism (softmax, performer, ra, lara, nprf_rpe)")
    ap.add_argument("--device", default="cpu", help="passed to the tool (cpu or cuda)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true", help="one row per tensor")
    args = ap.parse_args()
    if not os.path.exists(args.tool):
        sys.exit(f"no such tool: {args.tool}")

    gen = torch.Generator().manual_seed(args.seed)
    rows, failures = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for spec, fn, kw, variants in CASES:
            if args.only and spec.split(":")[0] != args.only:
                continue
            for variant in variants:
                for dtype in (torch.float64, torch.float32):
                    dname = "F64" if dtype == torch.float64 else "F32"
                    errs, info = run_case(args.tool, spec, fn, kw, variant, dtype, args.device, gen, tmp)
                    if errs is None:
                        failures += 1
                        rows.append((spec, variant, dname, "-", "-", "-", "FAIL: " + info))
                        continue
                    worst_abs = max(e[0] for e in errs.values())
                    worst_rel_name = max(errs, key=lambda n: errs[n][1])
                    worst_rel = errs[worst_rel_name][1]
                    if dtype == torch.float64:
                        bad = [n for n, e in errs.items() if e[0] / max(1.0, e[2]) > 1e-9]
                    else:
                        bad = [n for n, e in errs.items() if e[1] > 1e-4]
                    failures += bool(bad)
                    status = "ok" if not bad else "FAIL (" + ", ".join(bad) + ")"
                    if args.verbose:
                        for n, e in errs.items():
                            rows.append((spec, variant, dname, n, f"{e[0]:.2e}", f"{e[1]:.2e}", status))
                    else:
                        rows.append((spec, variant, dname, worst_rel_name, f"{worst_abs:.2e}", f"{worst_rel:.2e}", status))
    head = ("spec", "variant", "dtype", "worst", "max abs", "max rel", "status")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"\n{len(rows)} rows, {failures} failing (F64: max|err| / max(1, max|ref|) <= 1e-9; "
          f"F32: max|err| / max|ref| <= 1e-4)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
