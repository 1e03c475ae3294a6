#!/usr/bin/env python3
"""The PyTorch side of `ps-bench serve`: the served DLRM scored by PyTorch on the CPU, batch 32.

ps-bench serve writes what its Predict requests carry and what the replica holds, and this
script scores the same samples with the same model (bench/bench_serve.c says what is compared):

  --model   the dense model file the replica serves (ps-worker's published `model`,
            pw_model_io.h: "EMBRDNS1", u32 format, u32 layers, per layer u32 in, u32 out, then
            per layer the out x in weights and out biases as f32, then a checksum), loaded into
            emberps.dlrm.DLRM (ps-worker's DLRM in PyTorch): the same trained weights;
  --table   "EMBTABL1", u32 rows, u32 dim, the sorted keys (u64), the rows (f32): the replica's
            rows of every key the samples use, padded with other rows to the replica's size;
  --samples "EMBSAMP1", u32 n, u32 ndense, u32 fields, the dense inputs (f32, already
            log1p'd by ps-worker's parser) and one key per field (u64): the Predict requests'
            lines, parsed in C by the daemon's parser.

One timed batch (torch.inference_mode, one thread): key -> row index by np.searchsorted over the
sorted keys (the replica's hash lookup), nn.EmbeddingBag (sum, one key per bag) over the
in-memory table, DLRM's dense part, sigmoid. Not included: text parsing, RPC. Rounds alternate
with the C side's through two pipes (--sync=R,W: 'r' written before each round, 'g' awaited).
The last line is one JSON object: torch_predict_qps (median of the rounds' batches/s) and the
scores of the first batch (checked against Predict's by the C side).
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def read_model(path):
    """[(weight out x in, bias out)] of a dense model file."""
    raw = open(path, "rb").read()
    if raw[:8] != b"EMBRDNS1":
        raise ValueError("%s: not a dense model file" % path)
    fmt, n = np.frombuffer(raw, dtype="<u4", count=2, offset=8)
    shapes = np.frombuffer(raw, dtype="<u4", count=2 * n, offset=16).reshape(n, 2)
    off, layers = 16 + 8 * int(n), []
    for fin, fout in shapes:
        w = np.frombuffer(raw, dtype="<f4", count=int(fin * fout), offset=off)
        off += 4 * int(fin * fout)
        b = np.frombuffer(raw, dtype="<f4", count=int(fout), offset=off)
        off += 4 * int(fout)
        layers.append((w.reshape(int(fout), int(fin)).copy(), b.copy()))
    return layers


def read_table(path):
    raw = open(path, "rb").read()
    if raw[:8] != b"EMBTABL1":
        raise ValueError("%s: not a table file" % path)
    rows, dim = (int(v) for v in np.frombuffer(raw, dtype="<u4", count=2, offset=8))
    keys = np.frombuffer(raw, dtype="<u8", count=rows, offset=16)
    vals = np.frombuffer(raw, dtype="<f4", count=rows * dim, offset=16 + 8 * rows)
    return keys.copy(), vals.reshape(rows, dim).copy()


def read_samples(path):
    raw = open(path, "rb").read()
    if raw[:8] != b"EMBSAMP1":
        raise ValueError("%s: not a samples file" % path)
    n, nd, nf = (int(v) for v in np.frombuffer(raw, dtype="<u4", count=3, offset=8))
    dense = np.frombuffer(raw, dtype="<f4", count=n * nd, offset=20).reshape(n, nd)
    keys = np.frombuffer(raw, dtype="<u8", count=n * nf, offset=20 + 4 * n * nd)
    return dense, keys.reshape(n, nf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sync", default="")
    a = ap.parse_args()
    try:
        import torch
        from torch import nn

        from emberps.dlrm import DLRM, embed
    except Exception as e:  # noqa: BLE001 - any import failure means: skip, saying why
        print("torch unavailable: %s: %s" % (type(e).__name__, e))
        return 0
    torch.set_num_threads(1)
    layers = read_model(a.model)
    tkeys, trows = read_table(a.table)
    dense, keys = read_samples(a.samples)
    dim = trows.shape[1]
    nb = next(i for i in range(1, len(layers)) if layers[i][0].shape[1] != layers[i - 1][0].shape[0])
    bottom = tuple(w.shape[0] for w, _ in layers[:nb])
    top = tuple(w.shape[0] for w, _ in layers[nb:])
    model = DLRM(dim, bottom=bottom, top=top)
    lins = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for lin, (w, b) in zip(lins, layers):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
    model.eval()
    emb = nn.EmbeddingBag(len(tkeys), dim, mode="sum")
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(trows))
    nbatch = len(dense) // a.batch
    batches = [(torch.from_numpy(dense[i * a.batch:(i + 1) * a.batch].copy()),
                keys[i * a.batch:(i + 1) * a.batch]) for i in range(nbatch)]

    def score(d, k):
        idx = torch.from_numpy(np.searchsorted(tkeys, k).astype(np.int64))
        return torch.sigmoid(model(d, embed(emb, idx)))

    rfd = wfd = None
    if a.sync:
        rfd, wfd = (int(x) for x in a.sync.split(","))
    rates, first = [], None
    with torch.inference_mode():
        first = score(*batches[0]).tolist()
        for i in range(20):  # warm up
            score(*batches[i % nbatch])
        for _ in range(a.rounds):
            if wfd is not None:
                os.write(wfd, b"r")
                if os.read(rfd, 1) != b"g":
                    break  # the C side is gone
            n, t0 = 0, time.perf_counter()
            while True:
                score(*batches[n % nbatch])
                n += 1
                el = time.perf_counter() - t0
                if el >= a.seconds:
                    break
            rates.append(n / el)
    if not rates:
        print("no round ran")
        return 1
    rates.sort()
    print(json.dumps({"torch_predict_qps": rates[len(rates) // 2], "torch_rounds": rates,
                      "torch_first_scores": first, "torch_version": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
