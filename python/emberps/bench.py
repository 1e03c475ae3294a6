"""python3 -m emberps.bench: the Python package's figures against a running ps-server.

    python3 -m emberps.bench --servers=127.0.0.1:7400 [--quick] [--json] [--bin-dir=build/bin]

`ps-bench py` starts the server, measures the C client's pull in the same run and adds
`c_pull_rows_per_s` and `py_vs_c` (bench/bench_py.c); run alone, this prints its own keys:
  py_pull_rows_per_s    Client.pull of batches of 4096 random keys of a filled universe (dim 64
                        table `b64`), one call at a time, rounds alternating with the C client's
                        when ps-bench drives it;
  torch_step_overhead   a training step of the DLRM of emberps.dlrm (batch 1024, dim 16, 26
                        fields, Adagrad tables) with emberps.torch.EmbeddingBag on table `d16`
                        over the same step with a local torch.nn.EmbeddingBag of the same rows
                        (sparse gradients, torch.optim.Adagrad), blocks of steps alternating, one
                        torch thread: the cost of keeping the embeddings on the servers;
  torch_auc_minus_worker  with --bin-dir (ps-datagen, ps-worker): examples/torch_dlrm.py's test
                        AUC minus ps-worker's on the same generated data (d16, fresh each).
The last line of --json is one JSON object with these keys.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import Client

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def pull_rate(c, table, dim, nkeys, batch, seconds, rounds, sync=None):
    """Rows/s of blocking pulls of random batches: a median over rounds. sync(round) is called
    before each round (ps-bench alternates its C rounds with these through it)."""
    universe = np.arange(1, nkeys + 1, dtype=np.uint64) * GOLDEN
    for s in range(0, nkeys, 65536):  # every key exists before timing
        c.pull(table, universe[s:s + 65536], dim)
    rng = np.random.default_rng(7)
    batches = [universe[rng.integers(0, nkeys, batch)] for _ in range(64)]
    out = np.empty((batch, dim), dtype=np.float32)
    rates = []
    for r in range(rounds):
        if sync:
            sync(r)
        n, t0 = 0, time.perf_counter()
        while True:
            c.pull(table, batches[n % 64], dim, out=out)
            n += 1
            el = time.perf_counter() - t0
            if el >= seconds:
                break
        rates.append(n * batch / el)
    return float(np.median(rates))


def step_overhead(c, table, vocab, steps, rounds, batch=1024, dim=16):
    """torch_step_overhead (see the module's text) and the two step times in ms."""
    import torch
    from torch import nn

    from .dlrm import DENSE, DLRM, FIELDS, embed
    from .keys import feature_key
    from .torch import EmbeddingBag
    torch.set_num_threads(1)
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(3)
    nb = 16
    idx = [torch.clamp((vocab ** torch.rand((batch, FIELDS), generator=g)).long() - 1, 0,
                       vocab - 1) for _ in range(nb)]
    dense = [torch.rand((batch, DENSE), generator=g) for _ in range(nb)]
    labels = [(torch.rand(batch, generator=g) < 0.25).float() for _ in range(nb)]
    # the same rows both ways: field f's value v is row f * vocab + v locally, feature_key(f, v)
    # on the servers
    fkeys = np.stack([feature_key(f, np.arange(vocab, dtype=np.uint64)) for f in range(FIELDS)])
    skeys = [torch.from_numpy(fkeys[np.arange(FIELDS)[None, :], i.numpy()].view(np.int64))
             for i in idx]
    lidx = [i + torch.arange(FIELDS) * vocab for i in idx]
    c.claim(table, "emberps.bench", "fresh")
    for s in range(0, FIELDS * vocab, 65536):  # every row exists before timing
        c.pull(table, fkeys.reshape(-1)[s:s + 65536], dim)
    remote = EmbeddingBag(c, table, dim)
    local = nn.EmbeddingBag(FIELDS * vocab, dim, mode="sum", sparse=True)
    nn.init.uniform_(local.weight, -0.05, 0.05)
    lopt = torch.optim.Adagrad(local.parameters(), lr=0.05, initial_accumulator_value=1e-6)
    lossf = nn.BCEWithLogitsLoss()
    models = {}
    for name in ("remote", "local"):
        m = DLRM(dim)
        models[name] = (m, torch.optim.Adam(m.parameters(), lr=0.001))

    def run(name, nsteps):
        m, opt = models[name]
        t0 = time.perf_counter()
        for s in range(nsteps):
            b = s % nb
            if name == "remote":
                emb = embed(remote, skeys[b])
            else:
                emb = embed(local, lidx[b])
            loss = lossf(m(dense[b], emb), labels[b])
            opt.zero_grad()
            if name == "local":
                lopt.zero_grad()
            loss.backward()
            if name == "remote":
                if s + 1 < nsteps:  # the next step's rows, as the example does
                    remote.prefetch(skeys[(s + 1) % nb].reshape(-1))
            else:
                lopt.step()
            opt.step()
        return (time.perf_counter() - t0) / nsteps

    run("remote", 3)
    run("local", 3)
    rt, lt = [], []
    for _ in range(rounds):
        rt.append(run("remote", steps))
        lt.append(run("local", steps))
    r, l_ = float(np.median(rt)), float(np.median(lt))
    return r / l_, r * 1e3, l_ * 1e3


def auc_vs_worker(servers, table, bin_dir, rows):
    """examples/torch_dlrm.py --worker on fresh ps-datagen data: its auc_minus_worker and AUC."""
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "examples", "torch_dlrm.py")
    if not os.path.exists(example):
        return None, "examples/torch_dlrm.py is not next to this package (a source checkout)"
    with tempfile.TemporaryDirectory(prefix="emberps-bench-") as d:
        subprocess.run([os.path.join(bin_dir, "ps-datagen"), "--rows=%d" % rows,
                        "--test-rows=%d" % (rows // 5), "--out=%s/train.tsv" % d,
                        "--test-out=%s/test.tsv" % d], check=True, capture_output=True,
                       timeout=600)
        out = subprocess.run([sys.executable, example, "--servers=" + servers,
                              "--table=" + table, "--train=%s/train.tsv" % d,
                              "--test=%s/test.tsv" % d,
                              "--worker=" + os.path.join(bin_dir, "ps-worker"), "--json"],
                             capture_output=True, text=True, timeout=3600)
    if out.returncode:
        return None, "the example failed: " + out.stderr[-500:]
    return json.loads(out.stdout.strip().splitlines()[-1]), None


def main(argv=None):
    p = argparse.ArgumentParser(description="the emberps package's figures (ps-bench py)")
    p.add_argument("--servers", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--bin-dir", default="", help="ps-datagen and ps-worker: the AUC figure")
    p.add_argument("--seconds", type=float, default=0)
    p.add_argument("--keys", type=int, default=0)
    p.add_argument("--sync", default="", help="(ps-bench) a pipe pair 'R,W' to alternate rounds")
    a = p.parse_args(argv)
    size = "smoke" if a.smoke else "quick" if a.quick else "full"
    nkeys = a.keys or {"smoke": 20000, "quick": 200000, "full": 1000000}[size]
    secs = a.seconds or {"smoke": 0.2, "quick": 1.0, "full": 2.0}[size]
    rounds = 1 if a.smoke else 3
    sync = None
    if a.sync:  # before each round: tell ps-bench, and wait for its C round to end
        rfd, wfd = (int(x) for x in a.sync.split(","))

        def sync(r):
            os.write(wfd, b"r")
            if not os.read(rfd, 1):
                raise SystemExit("ps-bench went away")
    res = {}
    with Client(a.servers, timeout_ms=60000) as c:
        res["py_pull_rows_per_s"] = pull_rate(c, "b64", 64, nkeys, 4096, secs, rounds, sync)
        if a.sync:
            os.write(wfd, b"d")  # done: ps-bench's last C round
        print("python pull: %.2fM rows/s (dim 64, batch 4096, 1 call at a time)"
              % (res["py_pull_rows_per_s"] / 1e6), flush=True)
        try:
            import torch  # noqa: F401
        except ImportError as e:
            res["torch_skipped"] = "PyTorch is not installed: %s" % e
        else:
            vocab = {"smoke": 2000, "quick": 20000, "full": 100000}[size]
            steps = {"smoke": 3, "quick": 20, "full": 50}[size]
            ratio, rms, lms = step_overhead(c, "d16", vocab, steps, rounds)
            res.update(torch_step_overhead=ratio, torch_step_ms=rms, torch_local_step_ms=lms)
            print("torch DLRM step: %.2f ms with EmberPS embeddings, %.2f ms with local "
                  "nn.EmbeddingBag (overhead %.2fx)" % (rms, lms, ratio), flush=True)
            if a.bin_dir and not a.smoke:
                r, why = auc_vs_worker(a.servers, "d16", a.bin_dir,
                                       100000 if size == "quick" else 300000)
                if r:
                    res.update(torch_auc_minus_worker=r["auc_minus_worker"], torch_auc=r["auc"],
                               worker_auc=r["worker_auc"])
                    print("torch DLRM AUC %.4f, ps-worker %.4f (%+.4f)" % (
                        r["auc"], r["worker_auc"], r["auc_minus_worker"]), flush=True)
                else:
                    res["torch_auc_skipped"] = why
    if a.json:
        # (a NaN is null: ps-bench parses strict JSON)
        print(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v
                          for k, v in res.items()}))


if __name__ == "__main__":
    main()
