#!/usr/bin/python3
"""examples/torch_dlrm.py: a DLRM written in PyTorch whose embeddings live on EmberPS servers.

The dense part (bottom MLP, dot interaction, top MLP) is torch, trained with torch.optim.Adam;
the 26 categorical fields' rows are pulled from the servers' table by emberps.torch.EmbeddingBag
and their gradients pushed back, where the table's optimizer (Adagrad by default) applies them.
The model, its initialization and the data's features are ps-worker's DLRM (docs/training.md):
13 dense features log1p(max(x, 0)), one key per field from emberps.feature_key (the empty value:
missing_key), bottom 13-64-16, top (16 + 351)-128-64-1, Glorot-uniform weights, mean BCE.

    deploy/local-cluster.sh up                  # servers with the table emb, dim 16
    build/bin/ps-datagen --rows=200000 --out=train.tsv --test-out=test.tsv
    /usr/bin/python3 examples/torch_dlrm.py --servers="$(cat run/cluster/cluster.map)" \\
        --train=train.tsv --test=test.tsv --worker=build/bin/ps-worker

prints the test AUC, and with --worker the AUC of ps-worker trained on the same data with the
same settings (each on a fresh table: the claim resets it). --nproc=2 trains with two processes
(torch.distributed over gloo, the dense gradients averaged by DistributedDataParallel; rank r
reads rows r, r + 2, ...). --json: the last line is one JSON object (auc, worker_auc,
auc_minus_worker, samples_per_s, steps).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import emberps  # noqa: E402
from emberps.torch import EmbeddingBag  # noqa: E402

DENSE, FIELDS = 13, 26


def read_criteo(path, rank=0, world=1, max_rows=0):
    """Criteo TSV -> labels (n,), dense (n, 13) float32, keys (n, 26) int64 (the keys' bits),
    rows rank, rank + world, ... of the file (at most max_rows of them when > 0)."""
    labels, dense, cats = [], [], [[] for _ in range(FIELDS)]
    with open(path) as f:
        for i, line in enumerate(f):
            if i % world != rank:
                continue
            if max_rows and len(labels) >= max_rows:
                break
            cols = line.rstrip("\r\n").split("\t")
            if len(cols) != 1 + DENSE + FIELDS:
                raise ValueError("%s:%d: %d columns, Criteo has 40" % (path, i + 1, len(cols)))
            labels.append(float(cols[0]))
            dense.append([float(x) if x else 0.0 for x in cols[1:1 + DENSE]])
            for j in range(FIELDS):
                cats[j].append(cols[1 + DENSE + j])
    n = len(labels)
    d = np.log1p(np.maximum(np.array(dense, dtype=np.float64).reshape(n, DENSE), 0))
    keys = np.empty((n, FIELDS), dtype=np.uint64)
    for j in range(FIELDS):
        vals = np.array([int(v, 16) if v else 0 for v in cats[j]], dtype=np.uint64)
        keys[:, j] = emberps.feature_keys(j, vals)
        empty = np.array([not v for v in cats[j]])
        keys[empty, j] = emberps.missing_key(j)
    return (np.array(labels, dtype=np.float32), d.astype(np.float32),
            keys.view(np.int64))


def mlp(widths, relu_last):
    layers = []
    for i in range(len(widths) - 1):
        lin = nn.Linear(widths[i], widths[i + 1])
        nn.init.xavier_uniform_(lin.weight)  # as ps-worker: Glorot uniform, zero bias
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i + 2 < len(widths) or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """The dense part: bottom MLP, DLRM's dot interaction of the 27 vectors, top MLP."""

    def __init__(self, dim, bottom=(64, 16), top=(128, 64, 1)):
        super().__init__()
        self.bottom = mlp([DENSE, *bottom], True)
        f = FIELDS + 1
        self.top = mlp([dim + f * (f - 1) // 2, *top], False)
        li, lj = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, emb):  # emb: batch x 26 x dim
        bot = self.bottom(dense)
        z = torch.cat([bot.unsqueeze(1), emb], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([bot, inter], dim=1)).squeeze(1)


def embed(emb, keys):
    """keys (batch, 26) -> (batch, 26, dim): every field its own bag of one key."""
    b = keys.shape[0]
    flat = keys.reshape(-1)
    return emb(flat, torch.arange(0, flat.numel(), dtype=torch.int64)).reshape(b, FIELDS, -1)


def auc(labels, scores):
    """Area under the ROC curve (Mann-Whitney, ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = labels > 0.5
    npos, nneg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def train(a, rank=0, world=1):
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    client = emberps.Client(a.servers, token=a.token, tls_ca=a.tls_ca, timeout_ms=30000)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 0:  # a fresh table for this job; the other ranks join the same job's claim
        client.claim(a.table, a.job, "fresh")
    if world > 1:
        dist.barrier()
        client.claim(a.table, a.job, "check")
    emb = EmbeddingBag(client, a.table, a.dim)
    model = DLRM(a.dim)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.dense_lr)
    lossf = nn.BCEWithLogitsLoss()
    y, d, k = read_criteo(a.train, rank, world, a.max_rows // world if a.max_rows else 0)
    y, d, k = torch.from_numpy(y), torch.from_numpy(d), torch.from_numpy(k)
    n = len(y)
    steps, t0 = 0, time.monotonic()
    for _ in range(a.epochs):
        starts = list(range(0, n, a.batch))
        if world > 1:  # every rank takes the same number of steps (DDP's collectives)
            cnt = torch.tensor([len(starts)])
            dist.all_reduce(cnt, op=dist.ReduceOp.MIN)
            starts = starts[:int(cnt)]
        for s_i, s in enumerate(starts):
            sl = slice(s, s + a.batch)
            logits = model(d[sl], embed(emb, k[sl]))
            loss = lossf(logits, y[sl])
            opt.zero_grad()
            loss.backward()  # pushes the rows' gradients
            if s_i + 1 < len(starts):  # the next batch's rows, while Adam steps
                nxt = starts[s_i + 1]
                emb.prefetch(k[nxt:nxt + a.batch].reshape(-1))
            opt.step()
            steps += 1
    seconds = time.monotonic() - t0
    result = {"steps": steps, "samples_per_s": steps * a.batch / seconds if seconds else 0}
    if world > 1:
        dist.barrier()  # every rank's pushes are in before rank 0 evaluates
    if rank == 0 and a.test:
        ty, td, tk = read_criteo(a.test)
        if world > 1:
            model = model.module  # rank 0 alone: no DDP collectives
        emb.eval()
        model.eval()
        scores = []
        with torch.no_grad():
            for s in range(0, len(ty), 8192):
                sl = slice(s, s + 8192)
                scores.append(model(torch.from_numpy(td[sl]),
                                    embed(emb, torch.from_numpy(tk[sl]))).numpy())
        result["auc"] = auc(ty, np.concatenate(scores))
    client.close()
    if world > 1:
        dist.destroy_process_group()
    return result


def _spawned(rank, a, world, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        r = train(a, rank, world)
    except BaseException:  # say which rank failed and why (spawn reports only the first)
        import traceback
        traceback.print_exc()
        raise
    if rank == 0:
        q.put(r)


def run_worker(a):
    """ps-worker on the same data and settings, on a fresh table; its test AUC."""
    cmd = [a.worker, "--servers=" + a.servers, "--train=" + a.train, "--test=" + a.test,
           "--table-name=" + a.table, "--dim=%d" % a.dim, "--batch=%d" % a.batch,
           "--epochs=%d" % a.epochs, "--dense-lr=%g" % a.dense_lr, "--seed=%d" % a.seed,
           "--job=" + a.job + "-ps-worker", "--fresh", "--progress-every=0", "--json"]
    if a.max_rows:
        cmd.append("--max-samples=%d" % a.max_rows)
    if a.tls_ca:
        cmd.append("--tls-ca=" + a.tls_ca)
    env = dict(os.environ, PS_WORKER_TOKEN=a.token) if a.token else None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if out.returncode:
        raise SystemExit("ps-worker failed (%d): %s" % (out.returncode, out.stderr[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])["auc"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", required=True, help="a cluster map text or host:port")
    p.add_argument("--train", required=True)
    p.add_argument("--test", default="")
    p.add_argument("--table", default="emb")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dense-lr", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-rows", type=int, default=0, help="train on at most this many rows")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--nproc", type=int, default=1, help="processes (torch.distributed, gloo)")
    p.add_argument("--job", default="torch_dlrm")
    p.add_argument("--token", default=os.environ.get("EMBERPS_TOKEN"))
    p.add_argument("--tls-ca", default=None)
    p.add_argument("--worker", default="", help="ps-worker binary: train it too and compare")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.nproc > 1:
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        q = mp.get_context("spawn").SimpleQueue()
        mp.spawn(_spawned, args=(a, a.nproc, port, q), nprocs=a.nproc, join=True)
        r = q.get()
    else:
        r = train(a)
    if "auc" in r:
        print("torch DLRM, embeddings on EmberPS: test AUC %.4f (%d steps, %.0f samples/s per "
              "process)" % (r["auc"], r["steps"], r["samples_per_s"]))
    if a.worker and a.test:
        r["worker_auc"] = run_worker(a)
        r["auc_minus_worker"] = r["auc"] - r["worker_auc"]
        print("ps-worker, same data and settings:  test AUC %.4f (torch - ps-worker: %+.4f)"
              % (r["worker_auc"], r["auc_minus_worker"]))
    if a.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
