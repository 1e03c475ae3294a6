#!/usr/bin/python3
"""The PyTorch reference of `ps-bench train`: ps-worker's DLRM trained on a file, all in PyTorch.

The model, its initialization and the features are emberps.dlrm's (ps-worker's own: the feature
keys come from libpsclient). The embeddings are local: one nn.EmbeddingBag over the dense index
of every key of the training and test files (np.unique), uniform in [-init_scale, init_scale],
trained by torch's sparse Adagrad with the table's lr, initial accumulator and eps, which is the
table's update (G += g^2; w -= lr g / (sqrt(G) + eps), a row's duplicates summed). The dense
layers use the worker's dense optimizer and learning rate. Batches in file order, the last one
partial, as ps-worker; test keys never trained keep their initial rows (ps-worker's lookup of a
missing key returns its initial row). One torch thread (ps-worker: OpenBLAS on one thread).

    PYTHONPATH=python EMBERPS_LIBPSCLIENT=build/lib/libpsclient.so.1 /usr/bin/python3 \\
        bench/torch_train.py --train=train.tsv --test=test.tsv --dense-lr=0.003 --batch=1024 \\
        --table-lr=0.05 --adagrad-init=1e-6 --eps=1e-8 --init-scale=0.01 [--json]

`ps-bench train` runs it with ps-worker's defaults (every setting is passed: the defaults are
declared once, in C). Prints the test AUC; with --json the last line is one JSON object (auc,
logloss, train_rows, test_rows, rows, samples_per_s, seconds).
"""
import argparse
import json
import math
import time

import numpy as np
import torch
from torch import nn

from emberps.dlrm import DLRM, auc, embed, read_criteo

SHARE_ROWS = 250000  # rows parsed per pass (read_criteo holds Python strings: ~3.6 KB a row)


def read(path):
    """read_criteo of the whole file in file order, parsed in interleaved shares of about
    SHARE_ROWS rows (rank r of W: rows r, r + W, ...) to bound the parser's memory."""
    with open(path, "rb") as f:
        n = sum(1 for _ in f)
    world = max(1, math.ceil(n / SHARE_ROWS))
    y = np.empty(n, dtype=np.float32)
    d = np.empty((n, 13), dtype=np.float32)
    k = np.empty((n, 26), dtype=np.int64)
    for r in range(world):
        y[r::world], d[r::world], k[r::world] = read_criteo(path, r, world)
    return y, d, k


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    for name in ("dense-lr", "table-lr", "adagrad-init", "eps", "init-scale"):
        p.add_argument("--" + name, type=float, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--dense-optimizer", default="adam", choices=("sgd", "adagrad", "adam"))
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--bottom", default="64,16")
    p.add_argument("--top", default="128,64,1")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    t0 = time.monotonic()
    y, d, k = read(a.train)
    ty, td, tk = read(a.test)
    vocab = np.unique(np.concatenate([np.unique(k), np.unique(tk)]))
    k = torch.from_numpy(np.searchsorted(vocab, k))  # the keys' dense indices
    tk = torch.from_numpy(np.searchsorted(vocab, tk))
    y, d = torch.from_numpy(y), torch.from_numpy(d)
    read_s = time.monotonic() - t0

    emb = nn.EmbeddingBag(len(vocab), a.dim, mode="sum", sparse=True)
    nn.init.uniform_(emb.weight, -a.init_scale, a.init_scale)
    model = DLRM(a.dim, tuple(int(w) for w in a.bottom.split(",")),
                 tuple(int(w) for w in a.top.split(",")))
    sparse_opt = torch.optim.Adagrad(emb.parameters(), lr=a.table_lr,
                                     initial_accumulator_value=a.adagrad_init, eps=a.eps)
    dense_opt = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
                 "adam": torch.optim.Adam}[a.dense_optimizer](model.parameters(), lr=a.dense_lr)
    lossf = nn.BCEWithLogitsLoss()
    t1 = time.monotonic()
    for s in range(0, len(y), a.batch):
        sl = slice(s, s + a.batch)
        loss = lossf(model(d[sl], embed(emb, k[sl])), y[sl])
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    train_s = time.monotonic() - t1

    model.eval()
    scores = []
    with torch.no_grad():
        for s in range(0, len(ty), 8192):
            sl = slice(s, s + 8192)
            scores.append(model(torch.from_numpy(td[sl]), embed(emb, tk[sl])).numpy())
    z = np.concatenate(scores).astype(np.float64)
    logloss = float(np.mean(np.logaddexp(0, z) - ty * z))  # BCE on logits
    r = {"auc": auc(ty, z), "logloss": logloss, "train_rows": len(y), "test_rows": len(ty),
         "rows": len(vocab), "samples_per_s": len(y) / train_s if train_s else 0,
         "seconds": time.monotonic() - t0, "read_seconds": read_s, "torch": torch.__version__}
    print("torch DLRM, local embeddings (%d rows): test AUC %.4f, logloss %.4f; %d training "
          "rows at %.0f samples/s (reading %.1f s)" % (r["rows"], r["auc"], logloss, len(y),
                                                       r["samples_per_s"], read_s), flush=True)
    if a.json:
        # (a NaN, e.g. the AUC of a one-class test set, is null: ps-bench parses strict JSON)
        print(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v
                          for k, v in r.items()}))


if __name__ == "__main__":
    main()
