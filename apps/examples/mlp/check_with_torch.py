#!/usr/bin/env python3
"""Checks an `mlp --save DIR` output with tools that share no code with Linea.

Reads DIR/model.safetensors with a reader written here from the format's description (8-byte
little-endian header length, JSON header, raw little-endian data), rebuilds the MLP in PyTorch
(fc1, fc2, ... with ReLU between; weights [out, in]), evaluates it on the inputs saved in
DIR/predictions.csv and compares the logits and predicted classes.

    python3 apps/examples/mlp/check_with_torch.py DIR     (Debian: apt-get install python3-torch)
"""
import csv
import json
import struct
import sys

import torch

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    body = data[8 + n :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        assert end - begin == count * size, f"{name}: {end - begin} bytes for {count} elements"
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if count else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"])
    return tensors, header.get("__metadata__", {})


def main(out_dir):
    tensors, meta = read_safetensors(f"{out_dir}/model.safetensors")
    depth = 0
    while f"fc{depth + 1}.weight" in tensors:
        depth += 1
    layers = []
    for i in range(1, depth + 1):
        w, b = tensors[f"fc{i}.weight"], tensors[f"fc{i}.bias"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        layers.append(lin)
        if i < depth:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).eval()

    with open(f"{out_dir}/predictions.csv") as f:
        rows = list(csv.DictReader(f))
    classes = len([k for k in rows[0] if k.startswith("logit_")])
    x = torch.tensor([[float(r["x"]), float(r["y"])] for r in rows], dtype=torch.float32)
    want_logits = torch.tensor([[float(r[f"logit_{c}"]) for c in range(classes)] for r in rows])
    want_pred = torch.tensor([int(r["predicted"]) for r in rows])
    with torch.no_grad():
        logits = model(x)
    max_diff = (logits - want_logits).abs().max().item()
    agree = (logits.argmax(1) == want_pred).float().mean().item()
    print(f"metadata: {meta}")
    print(f"{depth} Linear layers, {len(rows)} points, max |logit difference| = {max_diff:.3g}, "
          f"predicted classes agree on {agree * 100:.1f}%")
    ok = max_diff < 1e-4 and agree == 1.0
    print("OK: PyTorch reproduces predictions.csv" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
