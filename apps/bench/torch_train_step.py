#!/usr/bin/python3
"""torch-train-step: PyTorch versions of the vit and translate training steps, timed as train-step times Linea's.

The same models as the apps' defaults, built the way a PyTorch user would build them, on
synthetic batches of the same shapes (apps/bench/bench_train_step.cpp is Linea's side):

  vit        patch 4 (a reshape and a Linear, as Linea's PatchEmbed), dim 64, depth 6, 4 heads,
             MLP ratio 2 (GELU), CLS token, learned positions, pre-LN blocks with
             F.scaled_dot_product_attention, head; label smoothing 0.1; AdamW (lr 2e-3, weight
             decay 0.05); gradient clipping at 1; Fashion-MNIST's [B, 1, 28, 28] (206k parameters)
  translate  encoder-decoder, dim 256, 3 + 3 layers, 4 heads, MLP 1024, dropout 0.1, sinusoidal
             positions, joint 8k vocabulary tied to the output; label smoothing 0.1, pad ignored;
             AdamW (0.9, 0.98); clipping at 1; sentences x length tokens a side (7.6 M parameters)

One step: zero_grad(set_to_none), forward, loss, backward, clip_grad_norm_, optimizer step,
with no host synchronization inside (no .item()); the timing waits for the device at its ends:
steps/s over --steps steps after --warmup. Modes: eager (default), --compile (torch.compile of
the model), --autocast bf16 (torch.autocast(bfloat16): matmuls and attention in bf16, weights
and optimizer float32), --cuda-graph (torch.cuda.graph capture of the whole step, the
optimizer's capturable mode), --op-cost (host time per small op). Prints one JSON line.

Usage:
  apps/bench/torch_train_step.py --model vit [--batch 128] [--steps 60] [--warmup 10] [--device cuda]
      [--compile] [--autocast bf16] [--cuda-graph] [--json FILE]
  apps/bench/torch_train_step.py --op-cost [--device cuda]
Optional: needs PyTorch 2.x; the project does not depend on it otherwise.
"""

import argparse
import json
import math
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="vit", choices=["vit", "translate"])
    p.add_argument("--batch", type=int, default=128, help="vit: images per batch")
    p.add_argument("--sentences", type=int, default=128, help="translate: sentences per batch")
    p.add_argument("--length", type=int, default=32, help="translate: tokens per sentence, each side")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--autocast", default="", choices=["", "bf16"], help="torch.autocast(bfloat16)")
    p.add_argument("--cuda-graph", action="store_true", help="capture the whole step with torch.cuda.graph")
    p.add_argument("--op-cost", action="store_true", help="host time per small op instead")
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--json", default="")
    return p.parse_args()


def build(torch, args):
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, dim, heads, dropout=0.0):
            super().__init__()
            self.h, self.q, self.k, self.v, self.o = heads, nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

        def forward(self, x, kv, causal=False, pad=None):
            B, N, D = x.shape
            M = kv.shape[1]
            q = self.q(x).view(B, N, self.h, D // self.h).transpose(1, 2)
            k = self.k(kv).view(B, M, self.h, D // self.h).transpose(1, 2)
            v = self.v(kv).view(B, M, self.h, D // self.h).transpose(1, 2)
            mask = None if pad is None else ~pad[:, None, None, :]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
            return self.o(o.transpose(1, 2).reshape(B, N, D))

    class Block(nn.Module):  # pre-LN; decoder blocks add a cross-attention
        def __init__(self, dim, heads, hidden, dropout, cross=False):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
            self.cross = cross
            if cross:
                self.ln_c, self.cattn = nn.LayerNorm(dim), Attention(dim, heads)
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))
            self.drop = nn.Dropout(dropout)

        def forward(self, x, memory=None, causal=False, pad=None, mem_pad=None):
            h = self.ln1(x)
            x = x + self.drop(self.attn(h, h, causal=causal, pad=pad))
            if self.cross:
                x = x + self.drop(self.cattn(self.ln_c(x), memory, pad=mem_pad))
            return x + self.drop(self.mlp(self.ln2(x)))

    if args.model == "vit":
        class ViT(nn.Module):
            def __init__(self, dim=64, depth=6, heads=4, hidden=128, classes=10, patch=4):
                super().__init__()
                self.patch, n = patch, (28 // patch) ** 2
                self.proj = nn.Linear(patch * patch, dim)
                self.cls = nn.Parameter(torch.zeros(1, 1, dim))
                self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
                self.blocks = nn.ModuleList(Block(dim, heads, hidden, 0.0) for _ in range(depth))
                self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

            def forward(self, img):
                B, p = img.shape[0], self.patch
                x = img.view(B, 1, 28 // p, p, 28 // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, p * p)
                x = torch.cat([self.cls.expand(B, -1, -1), self.proj(x)], 1) + self.pos
                for b in self.blocks:
                    x = b(x)
                return self.head(self.norm(x)[:, 0])

        model = ViT()
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in ("cls", "pos")]
        other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in ("cls", "pos"))]
        groups = [{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}]
        batch = (torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,)))
        units = args.batch
        lr, betas = 2e-3, (0.9, 0.999)
    else:
        V, dim, L = 8000, 256, args.length

        class Seq2Seq(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(V, dim, padding_idx=0)
                self.enc = nn.ModuleList(Block(dim, 4, 1024, 0.1) for _ in range(3))
                self.dec = nn.ModuleList(Block(dim, 4, 1024, 0.1, cross=True) for _ in range(3))
                self.enc_norm, self.dec_norm, self.drop = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.Dropout(0.1)
                pos = torch.arange(256)[:, None] * torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
                self.register_buffer("pe", torch.stack([pos.sin(), pos.cos()], -1).flatten(1))

            def embed_(self, ids):
                return self.drop(self.embed(ids) * math.sqrt(dim) + self.pe[: ids.shape[1]])

            def forward(self, src, src_pad, tgt_in):
                m = self.embed_(src)
                for b in self.enc:
                    m = b(m, pad=src_pad)
                m = self.enc_norm(m)
                x = self.embed_(tgt_in)
                for b in self.dec:
                    x = b(x, memory=m, causal=True, mem_pad=src_pad)
                return self.dec_norm(x) @ self.embed.weight.t()

        model = Seq2Seq()
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        other = [p for n, p in model.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 1e-4}, {"params": other, "weight_decay": 0.0}]
        B = args.sentences
        batch = (torch.randint(4, V, (B, L)), torch.zeros(B, L, dtype=torch.bool), torch.randint(4, V, (B, L)),
                 torch.randint(4, V, (B, L)))
        units = B * L
        lr, betas = 1e-3, (0.9, 0.98)
    return model, groups, batch, units, lr, betas


def main():
    args = parse_args()
    import torch
    torch.manual_seed(0)
    dev = torch.device(args.device)
    F = torch.nn.functional
    if args.op_cost:
        a, b = torch.randn(16, device=dev), torch.randn(16, device=dev)
        c = a + b
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.ops):
            c = a + b
        issue = time.perf_counter() - t0
        if dev.type == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
        rec = {"bench": "op-cost", "framework": "pytorch " + torch.__version__, "device": str(dev),
               "ops": args.ops, "host_us_per_op": 1e6 * issue / args.ops, "us_per_op_with_wait": 1e6 * total / args.ops}
        print(f"op cost on {dev}: {rec['host_us_per_op']:.2f} us of host time per op (PyTorch {torch.__version__})")
    else:
        model, groups, batch, units, lr, betas = build(torch, args)
        model = model.to(dev)
        batch = [t.to(dev) for t in batch]
        capturable = args.cuda_graph
        opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8, capturable=capturable)
        fwd = torch.compile(model) if args.compile else model
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.autocast == "bf16" else torch.autocast("cuda", enabled=False)

        def step():
            opt.zero_grad(set_to_none=True)
            with amp:
                if args.model == "vit":
                    loss = F.cross_entropy(fwd(batch[0]), batch[1], label_smoothing=0.1)
                else:
                    logits = fwd(batch[0], batch[1], batch[2])
                    loss = F.cross_entropy(logits.float().flatten(0, 1), batch[3].flatten(), ignore_index=0,
                                           label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        run = step
        if args.cuda_graph:  # torch.cuda.graph: warm up on a side stream, then capture the whole step
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(g):
                step()
            run = g.replay
        for _ in range(args.warmup):
            run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        mode = "compile" if args.compile else "eager"
        rec = {"bench": "train-step", "framework": "pytorch " + torch.__version__, "model": args.model,
               "parameters": sum(p.numel() for p in model.parameters()), "device": str(dev),
               "device_name": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "mode": mode,
               "autocast": args.autocast or "off", "cuda_graph": args.cuda_graph, "units_per_step": units,
               "steps_timed": args.steps, "step_ms": 1e3 * secs / args.steps, "units_per_s": units * args.steps / secs}
        print(f"{args.model} step on {rec['device_name']} (PyTorch {torch.__version__}, {mode}"
              f"{', autocast bf16' if args.autocast else ''}{', CUDA graph' if args.cuda_graph else ''}): "
              f"{rec['step_ms']:.3f} ms per step, {rec['units_per_s']:.0f} units/s")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
