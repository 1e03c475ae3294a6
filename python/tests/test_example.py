"""examples/torch_dlrm.py on ps-datagen data against a live ps-server: its test AUC within 0.01
of ps-worker's on the same data and settings, and the 2-process torch.distributed (gloo) run."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (apt install python3-torch)")

from conftest import BIN, REPO  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "torch_dlrm.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    subprocess.run([os.path.join(BIN, "ps-datagen"), "--rows=60000", "--test-rows=20000",
                    "--out=%s/train.tsv" % d, "--test-out=%s/test.tsv" % d], check=True,
                   capture_output=True, timeout=120)
    return str(d)


def run(args, timeout=600):
    out = subprocess.run([sys.executable, EXAMPLE, "--json"] + args, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_auc_as_ps_worker(servers, data):
    addr, _ = servers("name=emb,dim=16")
    r = run(["--servers=" + addr, "--train=%s/train.tsv" % data, "--test=%s/test.tsv" % data,
             "--worker=" + os.path.join(BIN, "ps-worker")])
    print(r)
    assert r["auc"] > 0.65 and r["worker_auc"] > 0.65  # both learned
    assert abs(r["auc_minus_worker"]) <= 0.01


def test_two_processes(servers, data):
    addr, _ = servers("name=emb,dim=16")
    r = run(["--servers=" + addr, "--train=%s/train.tsv" % data, "--test=%s/test.tsv" % data,
             "--nproc=2"])
    print(r)
    assert r["steps"] == 30 and r["auc"] > 0.6  # 30000 rows a process, batch 1024
