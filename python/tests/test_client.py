"""emberps.Client against live ps-server processes: the same results as the C client for the same
calls (byte for byte, two servers, slot routing), futures, threads, the cluster calls."""
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import emberps
from conftest import BUILD

TABLE = "name=emb,dim=8,optimizer=adagrad,shards=4"


def splitmix64(x):
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_same_as_c(servers, tmp_path):
    """tests/unit/client/psc_replay.c's sequence, through the C client on one fresh 2-server
    cluster and through this package on another: every byte of every result equal."""
    n, dim = 3000, 8
    cmap_c, _ = servers(TABLE, n=2)
    out = str(tmp_path / "c.bin")
    subprocess.run([os.path.join(BUILD, "tests", "psc_replay"), cmap_c, "emb", str(dim), str(n),
                    out], check=True, timeout=60)
    c_bytes = open(out, "rb").read()

    cmap, _ = servers(TABLE, n=2)
    with emberps.Client(cmap) as c:
        base = np.array([splitmix64(i) for i in range(n)], dtype=np.uint64)
        keys = np.concatenate([base, base])
        lk = np.concatenate([base, np.array([splitmix64(10 ** 9 + i) for i in range(n)],
                                            dtype=np.uint64)])
        i = np.arange(2 * n)[:, None]
        j = np.arange(dim)[None, :]
        g = (((i * 7 + j) % 13) - 6).astype(np.float32) / np.float32(64)
        a = c.pull("emb", keys)
        res = c.push("emb", keys, g)
        b = c.pull("emb", keys)
        rows, found = c.lookup("emb", lk)
    assert res == {"applied": n, "skipped_nonfinite": 0, "dropped_unadmitted": 0}
    py_bytes = a.tobytes() + b.tobytes() + rows.tobytes() + found.view(np.uint8).tobytes()
    assert len(py_bytes) == len(c_bytes)
    assert py_bytes == c_bytes
    assert found[:n].all() and not found[n:].any()
    assert not np.array_equal(a, b)  # the push changed the rows


def test_wire_dtype(servers):
    """Compressed rows: bf16 and f16 pulls are the f32 rows rounded (within half an ulp: relative
    for normal values, f16's subnormal step 2^-24 below 2^-14), lookups agree, a push in bf16
    applies, and a bad name is refused before connecting."""
    addr, _ = servers(TABLE)
    keys = np.arange(1, 2001, dtype=np.uint64)
    with emberps.Client(addr) as c32, emberps.Client(addr, wire_dtype="bf16") as cb, \
            emberps.Client(addr, wire_dtype="f16") as ch:
        assert (c32.wire_dtype, cb.wire_dtype, ch.wire_dtype) == ("f32", "bf16", "f16")
        exact = c32.pull("emb", keys)
        for cl, ulp, sub in ((cb, 2.0 ** -8, 0.0), (ch, 2.0 ** -11, 2.0 ** -25)):
            got = cl.pull("emb", keys)
            assert got.dtype == np.float32 and got.shape == exact.shape
            assert not np.array_equal(got, exact)  # really rounded
            assert np.all(np.abs(got - exact) <= np.abs(exact) * ulp + sub)
            rows, found = cl.lookup("emb", keys)
            assert np.array_equal(rows, got) and found.all()
        g = np.full((len(keys), 8), 1.0 / 3.0, dtype=np.float32)
        assert cb.push("emb", keys, g)["applied"] == len(keys)
        after = c32.pull("emb", keys)
        assert not np.array_equal(after, exact)
    try:
        emberps.Client(addr, wire_dtype="f8")
        raise AssertionError("wire_dtype=f8 accepted")
    except ValueError as e:
        assert "f32, bf16, f16" in str(e)


def test_async_and_threads(servers):
    addr, _ = servers(TABLE)
    with emberps.Client(addr) as c:
        batches = [np.arange(1 + 500 * b, 1 + 500 * (b + 1), dtype=np.uint64) for b in range(16)]
        want = [c.pull("emb", k) for k in batches]
        futs = [c.pull_async("emb", k) for k in batches]  # 16 in flight
        for f, w in zip(futs, want):
            assert np.array_equal(f.result(timeout=30), w)
        out = np.empty((500, 8), dtype=np.float32)
        assert c.pull_async("emb", batches[3], out=out).result(timeout=30) is out
        assert np.array_equal(out, want[3])
        lf = c.lookup_async("emb", batches[0])
        assert np.array_equal(lf.result(timeout=30)[0], want[0])
        pf = c.push_async("emb", batches[1], np.zeros((500, 8), np.float32))
        assert pf.result(timeout=30)["applied"] == 500

        errors = []

        def worker(t):
            try:
                for r in range(20):
                    k = batches[(t + r) % 16]
                    assert np.array_equal(c.pull("emb", k), want[(t + r) % 16])
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors


def test_cluster_calls(servers):
    cmap, group = servers(TABLE + ";name=aux,dim=4,optimizer=sgd,lr=0.5", n=2)
    with emberps.Client(group[0].addr) as c:  # one address: the client adopts the map
        assert c.map_text().startswith("version=1;")
        tables = {t["name"]: t for t in c.tables()}
        assert set(tables) == {"emb", "aux"}
        assert tables["emb"]["dim"] == 8 and tables["emb"]["optimizer"] == "adagrad"
        assert tables["aux"]["lr"] == 0.5 and tables["aux"]["rows"] == 0
        c.push("aux", np.arange(1, 101, dtype=np.uint64), np.ones((100, 4), np.float32))
        aux = {t["name"]: t for t in c.tables()}["aux"]
        assert aux["rows"] == 100 and aux["version"] >= 1
        for bad in ("e" * 65, "emb\0x", ""):  # refused before anything is sent
            for call in (lambda: c.pull(bad, np.arange(1, 3, dtype=np.uint64), dim=8),
                         lambda: c.claim(bad, "job-a")):
                try:
                    call()
                    raise AssertionError("table %r was accepted" % bad)
                except ValueError as e:
                    assert "table" in str(e)
        assert c.claim("emb", "job-a")["action"] == "new"
        assert c.claim("emb", "", "inspect")["previous"] == "job-a"
        try:
            c.claim("emb", "job-b")
            raise AssertionError("a second job's claim was accepted")
        except emberps.EmberError as e:
            assert e.name == "PC_EOWNED" and "job-a" in e.detail
        h = c.health()
        assert [x["addr"] for x in h] == cmap.split("servers=")[1].split(";")[0].split(",")
        assert all(x["ok"] and x["rtt_ms"] >= 0 for x in h)
        group[1].signal(19)  # SIGSTOP: no answer within the deadline
        h = c.health(timeout_ms=300)
        assert h[0]["ok"] and not h[1]["ok"] and h[1]["error"] == "PC_ETIMEDOUT"
        group[1].signal(18)
        assert c.stats()["calls"] > 0
        assert c.stats()["unclean_slots"] == 0  # no promotion lost rows (map without unclean=)


def test_names_that_look_like_numbers(servers):
    """A table named "2024" or "nan" is a name (text), not a number: tables() keeps it text, and
    dim() finds the tables (it raised on the .encode() of a number for every table)."""
    _, group = servers("name=2024,dim=4,optimizer=sgd;name=nan,dim=2,optimizer=sgd")
    with emberps.Client(group[0].addr) as c:
        names = sorted(t["name"] for t in c.tables())
        assert names == ["2024", "nan"]
        assert c.dim("2024") == 4 and c.dim("nan") == 2
        rows = c.pull("2024", np.arange(1, 4, dtype=np.uint64))
        assert rows.shape == (3, 4)


def test_fork_refused(servers):
    """A client used in a forked child (a DataLoader worker, say) raises at once: the child has
    its memory but not its C I/O thread, so the call waited for ever, and so did closing it
    there. The parent's client goes on working."""
    addr, _ = servers(TABLE)
    with emberps.Client(addr) as c:
        keys = np.arange(1, 100, dtype=np.uint64)
        want = c.pull("emb", keys)
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only when the call is refused and close() returns
            code = 3
            try:
                try:
                    c.pull("emb", keys)
                    code = 1
                except emberps.EmberError as e:
                    code = 0 if "forked process" in str(e) else 2
                c.close()
            finally:
                os._exit(code)
        status = None
        for _ in range(400):  # 20 s at most
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung on the client")
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert np.array_equal(c.pull("emb", keys), want)


def test_fork_fails_pending_futures(servers):
    """A future pending when the process forked fails in the child at once (PC_ECLOSED): only
    the parent's waiter thread completes it, so its result() waited for ever there (and so did
    EmbeddingBag.flush() on a push still on its way). In the parent it completes as usual."""
    _, group = servers(TABLE)
    with emberps.Client(group[0].addr) as c:
        keys = np.arange(1, 100, dtype=np.uint64)
        want = c.pull("emb", keys)
        group[0].signal(signal.SIGSTOP)  # the pull below stays pending
        try:
            fut = c.pull_async("emb", keys)
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    try:
                        fut.result(timeout=10)
                        code = 1
                    except emberps.EmberError as e:
                        code = 0 if "before the fork" in str(e) else 2
                    except Exception:  # (a timeout: it would have waited for ever)
                        code = 4
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)  # (the child is bounded by its own timeout)
        finally:
            group[0].signal(signal.SIGCONT)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert np.array_equal(fut.result(timeout=20), want)


def test_options_checked(servers):
    """Options libpsclient would read otherwise are refused; retries=0 means none (libpsclient
    reads 0 as its default of 3: a fail-fast caller got 3 retries with backoff)."""
    addr, group = servers(TABLE)
    for bad in ({"retries": -1}, {"timeout_ms": 0}, {"max_inflight": 0},
                {"connect_timeout_ms": -5}, {"retries": 1.5}, {"timeout_ms": True}):
        with pytest.raises(ValueError):
            emberps.Client(addr, **bad)
    with emberps.Client(addr, retries=0, timeout_ms=3000) as none, \
            emberps.Client(addr, timeout_ms=3000) as default:
        keys = np.arange(1, 10, dtype=np.uint64)
        none.pull("emb", keys)
        default.pull("emb", keys)
        group[0].kill()
        for c in (none, default):
            with pytest.raises(emberps.EmberError):
                c.pull("emb", keys)
        assert none.stats()["retries"] == 0
        assert default.stats()["retries"] > 0
