"""emberps.torch.EmbeddingBag: forward and backward equal torch.nn.EmbeddingBag over the same rows
(1e-6), the pushed gradients change the rows exactly as the table's optimizer formula says
(double-precision reference), prefetch, eval mode (lookups: nothing inserted), DLRM's dims, and
the package without torch."""
import os
import subprocess
import sys

import numpy as np
import pytest

import emberps

torch = pytest.importorskip("torch", reason="PyTorch is not installed (apt install python3-torch)")
from emberps.torch import EmbeddingBag  # noqa: E402

from conftest import REPO  # noqa: E402


def bags(seed, b=6, n=5, vocab=40):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(0, vocab, (b, n), generator=g) * 0x1E3779B97F4A7 + 12345
    keys[0, 0] = -7  # a key >= 2^63 (its int64 bits are negative)
    return keys


def reference(client, keys, mode, psw=None):
    """nn.EmbeddingBag over the pulled rows of the unique keys, and its output."""
    flat = keys.reshape(-1).numpy().view(np.uint64)
    uk = np.unique(flat)
    w = client.pull("emb", uk).astype(np.float32)
    ref = torch.nn.EmbeddingBag(len(uk), w.shape[1], mode=mode, _weight=torch.from_numpy(w.copy()))
    inv = torch.from_numpy(np.searchsorted(uk, flat).astype(np.int64)).reshape(keys.shape)
    return uk, w, ref, ref(inv, per_sample_weights=psw)


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_forward_backward_as_nn(servers, mode, weighted):
    addr, _ = servers("name=emb,dim=8,optimizer=sgd,lr=1,init_scale=0.5")
    with emberps.Client(addr) as c:
        keys = bags(1)
        psw = torch.rand(keys.shape, generator=torch.Generator().manual_seed(2)) if weighted \
            else None
        uk, w, ref, want = reference(c, keys, mode, psw)
        emb = EmbeddingBag(c, "emb", 8, mode=mode)
        got = emb(keys, per_sample_weights=psw)
        assert got.shape == (6, 8)
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
        up = torch.linspace(-1, 1, 48).reshape(6, 8)
        (got * up).sum().backward()
        (want * up).sum().backward()
        assert emb.last_push["applied"] == len(uk)
        after = c.pull("emb", uk)
        # sgd with lr 1: row - grad, the grad torch's own EmbeddingBag computes
        np.testing.assert_allclose(after, w - ref.weight.grad.numpy(), atol=1e-6, rtol=0)
        # 1-D input with offsets: the same bags
        again = emb(keys.reshape(-1), torch.arange(0, 30, 5), per_sample_weights=(
            psw.reshape(-1) if weighted else None))
        with torch.no_grad():
            assert torch.allclose(again, EmbeddingBag(c, "emb", 8, mode=mode)(
                keys, per_sample_weights=psw), atol=0, rtol=0)


def test_adagrad_formula(servers):
    """Two backward passes through an Adagrad table: rows follow G += g^2, w -= lr g /
    (sqrt(G) + eps) in double precision, G starting at adagrad_init."""
    lr, init, eps = 0.1, 0.01, 1e-8
    addr, _ = servers("name=emb,dim=4,optimizer=adagrad,lr=%g,adagrad_init=%g,eps=%g" %
                      (lr, init, eps))
    with emberps.Client(addr) as c:
        keys = torch.tensor([[11, 12], [12, 13]], dtype=torch.int64)
        uk = np.unique(keys.numpy().reshape(-1).view(np.uint64))
        w = c.pull("emb", uk).astype(np.float64)
        G = np.full_like(w, init)
        emb = EmbeddingBag(c, "emb", 4)
        for step in range(2):
            up = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 1.0, -1.0, 2.0]]) * (step + 1)
            (emb(keys) * up).sum().backward()
            # d/d row: the sum of `up` rows of the bags holding the key, once per occurrence
            g = np.zeros_like(w)
            for b in range(2):
                for k in keys[b].numpy().view(np.uint64):
                    g[np.searchsorted(uk, k)] += up[b].numpy()
            G += g * g
            w -= lr * g / (np.sqrt(G) + eps)
            np.testing.assert_allclose(c.pull("emb", uk), w, rtol=2e-6, atol=1e-7)


def test_prefetch_and_eval(servers):
    addr, _ = servers("name=emb,dim=8,optimizer=sgd,lr=1")
    with emberps.Client(addr) as c:
        emb = EmbeddingBag(c, "emb", 8)
        keys = bags(3)
        calls = c.stats()["calls"]
        emb.prefetch(keys)
        out = emb(keys)  # takes the prefetched rows: one call in all
        assert c.stats()["calls"] == calls + 1
        _, _, _, want = reference(c, keys, "sum")
        assert torch.allclose(out, want, atol=1e-6, rtol=0)
        emb.eval()
        version = c.tables()[0]["version"]
        out = emb(keys)
        assert not out.requires_grad
        with torch.no_grad():
            emb.train()(keys)
        assert c.tables()[0]["version"] == version  # nothing pushed
        with pytest.raises(ValueError):
            EmbeddingBag(c, "emb", 16)  # the table's dim is 8
        with pytest.raises(TypeError):
            emb(keys.to(torch.int32))
        with pytest.raises(ValueError):
            emb(keys.reshape(-1))  # 1-D without offsets


def test_prefetch_before_a_push_is_not_used(servers):
    """A prefetch issued before a backward (its push) would give forward rows from before that
    push: forward fetches them again; a prefetch issued after the backward is used."""
    addr, _ = servers("name=emb,dim=4,optimizer=sgd,lr=1")
    with emberps.Client(addr) as c:
        emb = EmbeddingBag(c, "emb", 4)
        a, b = torch.tensor([[1, 2]]), torch.tensor([[1]])
        emb(b)  # key 1 exists
        emb.prefetch(b)
        emb(a).sum().backward()  # key 1's row -= 1
        got = emb(b)
        emb.flush()
        assert torch.allclose(got, torch.from_numpy(c.pull("emb", [1])), atol=0, rtol=0)
        emb.prefetch(b)  # after the push: used
        calls = c.stats()["calls"]
        emb(b)
        assert c.stats()["calls"] == calls


def test_eval_inserts_nothing(servers):
    """Eval mode and no_grad look rows up (as ps-worker evaluates): keys never trained add no
    rows and answer the table's missing-row policy (zeros here); prefetch in eval mode too."""
    addr, _ = servers("name=emb,dim=4,optimizer=sgd,lr=1,missing=zeros")
    with emberps.Client(addr) as c:
        emb = EmbeddingBag(c, "emb", 4)
        trained = torch.tensor([[1, 2]], dtype=torch.int64)
        (emb(trained).sum()).backward()
        emb.flush()
        rows = c.tables()[0]["rows"]
        assert rows == 2
        unseen = torch.tensor([[101, 102], [2, 103]], dtype=torch.int64)
        emb.eval()
        out = emb(unseen)
        assert torch.all(out[0] == 0)  # two missing keys: zeros
        assert torch.allclose(out[1], torch.from_numpy(c.pull("emb", [2])[0]))
        emb.prefetch(unseen)
        assert torch.equal(emb(unseen), out)
        emb.train()
        with torch.no_grad():
            assert torch.equal(emb(unseen), out)
        assert c.tables()[0]["rows"] == rows  # nothing inserted


def test_dlrm_dims():
    """emberps.dlrm.DLRM at another embedding dim: the bottom MLP ends there (ps-worker's
    --bottom=64,DIM); a bottom MLP that does not is refused."""
    from emberps.dlrm import DLRM, DENSE, FIELDS
    m = DLRM(32)
    out = m(torch.zeros(3, DENSE), torch.zeros(3, FIELDS, 32))
    assert out.shape == (3,)
    with pytest.raises(ValueError):
        DLRM(16, bottom=(64, 8))


def test_without_torch():
    """The package imports without torch; emberps.torch says what is missing."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import emberps\n"
            "try:\n"
            "    import emberps.torch\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "emberps.torch needs PyTorch" in out.stdout and "python3-torch" in out.stdout


def test_read_criteo_as_the_worker(tmp_path):
    """read_criteo takes the lines ps-worker takes, and refuses the ones it refuses (a label other
    than 0/1, a count that is not an integer, a categorical that is not 1-8 hex digits)."""
    from emberps.dlrm import read_criteo
    good = "\t".join(["1"] + ["3"] * 12 + [""] + ["68fd1e64"] * 25 + [""])
    p = tmp_path / "ok.tsv"
    p.write_text(good + "\n")
    labels, dense, keys = read_criteo(str(p))
    assert labels.tolist() == [1.0] and dense.shape == (1, 13) and keys.shape == (1, 26)
    for bad in (good.replace("1", "2", 1), good.replace("\t3\t", "\t1.5\t", 1),
                good.replace("68fd1e64", "0x1a", 1), good.replace("68fd1e64", "168fd1e64", 1)):
        p.write_text(bad + "\n")
        with pytest.raises(ValueError, match="ok.tsv:1: not a Criteo line"):
            read_criteo(str(p))


def test_two_calls_one_step(servers):
    """One module called twice in a step (one table for two features): backward is one Adagrad
    step of the two calls' gradients summed per key (a key in both: one step of g1 + g2), in
    one push (each call pushed its own part before: two steps, not the same with Adagrad)."""
    lr, init, eps = 0.1, 0.01, 1e-8
    addr, _ = servers("name=emb,dim=4,optimizer=adagrad,lr=%g,adagrad_init=%g,eps=%g" %
                      (lr, init, eps))
    with emberps.Client(addr) as c:
        a = torch.tensor([[11, 12], [12, 13]], dtype=torch.int64)
        b = torch.tensor([[13, 14]], dtype=torch.int64)  # 13 in both
        uk = np.unique(np.concatenate([a.numpy().reshape(-1), b.numpy().reshape(-1)])
                       .view(np.uint64))
        w = c.pull("emb", uk).astype(np.float64)
        emb = EmbeddingBag(c, "emb", 4)
        ua = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 1.0, -1.0, 2.0]])
        ub = torch.tensor([[2.0, 1.0, -1.5, 0.5]])
        ((emb(a) * ua).sum() + (emb(b) * ub).sum()).backward()
        g = np.zeros_like(w)
        for keys, up in ((a, ua), (b, ub)):
            for r in range(keys.shape[0]):
                for k in keys[r].numpy().view(np.uint64):
                    g[np.searchsorted(uk, k)] += up[r].numpy()
        G = init + g * g
        want = w - lr * g / (np.sqrt(G) + eps)
        assert emb.last_push["applied"] == len(uk)  # one push of every key
        np.testing.assert_allclose(c.pull("emb", uk), want, rtol=2e-6, atol=1e-7)


def test_push_after_a_failed_backward(servers):
    """A backward pass that raised after this module's part of it (its end callback never ran)
    does not stop the module: the next backward pushes (it queued no callback again before)."""
    addr, _ = servers("name=emb,dim=4,optimizer=sgd,lr=1")

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("boom")

    with emberps.Client(addr) as c:
        keys = torch.tensor([[11, 12]], dtype=torch.int64)
        emb = EmbeddingBag(c, "emb", 4)
        leaf = torch.ones(3, requires_grad=True)
        z = Boom.apply(leaf)  # made first: its backward runs after the module's
        with pytest.raises(RuntimeError, match="boom"):
            (z.sum() + emb(keys).sum()).backward()
        emb(keys).sum().backward()
        assert emb.last_push is not None and emb.last_push["applied"] == 2
