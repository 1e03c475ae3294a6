#!/usr/bin/python3
"""examples/torch_dlrm.py: a DLRM written in PyTorch whose embeddings live on EmberPS servers.

The dense part (emberps.dlrm.DLRM: ps-worker's model, initialization and features) is torch,
trained with torch.optim.Adam; the 26 categorical fields' rows are pulled from the servers'
table by emberps.torch.EmbeddingBag and their gradients pushed back, where the table's optimizer
(Adagrad by default) applies them.

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
from emberps.dlrm import DLRM, auc, embed, read_criteo  # noqa: E402
from emberps.torch import EmbeddingBag  # noqa: E402


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
    emb.flush()  # the last backward's push (its error raised here)
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
           "--table-name=" + a.table, "--dim=%d" % a.dim, "--bottom=64,%d" % a.dim,
           "--batch=%d" % a.batch,
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
    p.add_argument("--dense-lr", type=float, default=0.003)  # ps-worker's default
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
