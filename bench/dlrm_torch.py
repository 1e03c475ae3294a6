#!/usr/bin/env python3
"""The PyTorch reference of `ps-bench gpu`: the same DLRM training step, timed on the same device.

Model (as bench_gpu.c): 13 dense features, 26 sparse fields of one feature each, embedding dim D,
bottom MLP 13-512-256-D with ReLU, DLRM's dot interaction of the 27 vectors (batched Z Z^T, the
strict lower triangle), top MLP (D + 351)-512-256-1, BCE on logits. Embeddings: one
nn.EmbeddingBag per field (sum pooling, sparse gradients, SGD), dense layers: Adam. Keys are
Zipf-distributed over a vocabulary per field, drawn once per batch on the host and copied to the
device every step (as a worker receives them). fp32 throughout (TF32 off), as EmberPS.

    python3 bench/dlrm_torch.py --batch 4096 --dim 16 [--device cuda] [--steps 50] [--json]

Prints samples/s; with --json one JSON object per line.
"""
import argparse
import json
import time

import torch
from torch import nn

FIELDS, DENSE = 26, 13


def mlp(widths, last_relu):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths) or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, dim, vocab):
        super().__init__()
        self.emb = nn.ModuleList(
            nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True) for _ in range(FIELDS))
        self.bottom = mlp([DENSE, 512, 256, dim], True)
        f = FIELDS + 1
        self.top = mlp([dim + f * (f - 1) // 2, 512, 256, 1], False)
        rows, cols = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", rows)
        self.register_buffer("lj", cols)

    def forward(self, dense, keys, offsets):
        bot = self.bottom(dense)
        embs = [e(keys[:, i], offsets) for i, e in enumerate(self.emb)]
        z = torch.stack([bot] + embs, dim=1)              # batch x 27 x D
        full = torch.bmm(z, z.transpose(1, 2))            # batch x 27 x 27
        inter = full[:, self.li, self.lj]                  # batch x 351
        return self.top(torch.cat([bot, inter], dim=1)).squeeze(1)


def zipf_keys(rng, batch, vocab):
    # Zipf(1.05)-like ids in [0, vocab): inverse-CDF of a power law, cheap and repeatable
    u = torch.rand((batch, FIELDS), generator=rng)
    return torch.clamp((vocab ** u).long() - 1, 0, vocab - 1)


def run(batch, dim, device, steps, vocab):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    model = DLRM(dim, vocab).to(device)
    sparse = [p for n, p in model.named_parameters() if n.startswith("emb")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("emb")]
    opt_s = torch.optim.SGD(sparse, lr=0.05)
    opt_d = torch.optim.Adam(dense, lr=0.001)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = torch.Generator().manual_seed(2)
    host = []
    for _ in range(4):  # a few host batches, pinned when the device is a GPU
        b = (torch.randn(batch, DENSE, generator=rng), zipf_keys(rng, batch, vocab),
             (torch.rand(batch, generator=rng) < 0.25).float())
        host.append(tuple(t.pin_memory() for t in b) if device.startswith("cuda") else b)
    offsets = torch.arange(batch, device=device)

    def step(i):
        d, k, y = (t.to(device, non_blocking=True) for t in host[i % len(host)])
        opt_s.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)
        loss = loss_fn(model(d, k, offsets), y)
        loss.backward()
        opt_s.step()
        opt_d.step()
        return loss

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for i in range(5):  # warm-up: allocator, cuBLAS handles, kernels
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    sync()
    secs = time.perf_counter() - t0
    return {"batch": batch, "dim": dim, "device": device, "steps": steps,
            "samples_per_s": batch * steps / secs, "step_ms": 1e3 * secs / steps,
            "loss": loss.item(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--dim", type=int, action="append")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--vocab", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for batch in a.batch or [4096, 32768]:
        for dim in a.dim or [16, 64]:
            r = run(batch, dim, a.device, a.steps, a.vocab)
            if a.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"pytorch dlrm batch {batch} dim {dim} on {a.device}: "
                      f"{r['samples_per_s']:.0f} samples/s ({r['step_ms']:.2f} ms/step)",
                      flush=True)


if __name__ == "__main__":
    main()
