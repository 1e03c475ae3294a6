"""Failures become EmberError (with the code's name and the server's detail) or TypeError /
ValueError for bad arguments; nothing crashes and the client stays usable."""
import os
import time

import numpy as np
import pytest

import emberps
from conftest import free_port

TABLE = "name=emb,dim=8"


def test_server_down_at_connect():
    with pytest.raises(emberps.EmberError) as e:
        emberps.Client("127.0.0.1:%d" % free_port(), connect_timeout_ms=500)
    assert e.value.name in ("PC_EUNAVAIL", "PC_ETIMEDOUT")
    assert "127.0.0.1" in e.value.detail


def test_error_pickles():
    """An EmberError crosses processes (multiprocessing, DataLoader workers) whole."""
    import copy
    import pickle
    e = emberps.EmberError(emberps.errors.PC_EDIM, "server 1: 8 floats a row, not 4")
    for back in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
        assert isinstance(back, emberps.EmberError)
        assert (back.code, back.name, back.detail) == (e.code, "PC_EDIM", e.detail)
        assert str(back) == str(e)


def test_server_killed(servers):
    addr, group = servers(TABLE)
    c = emberps.Client(addr, timeout_ms=1500, retries=1)
    keys = np.arange(1, 9, dtype=np.uint64)
    c.pull("emb", keys)
    group[0].kill()
    with pytest.raises(emberps.EmberError) as e:
        c.pull("emb", keys)
    assert e.value.name in ("PC_EUNAVAIL", "PC_ETIMEDOUT")
    with pytest.raises(emberps.EmberError):
        c.pull_async("emb", keys).result(timeout=30)
    c.close()


def test_no_waiter_thread(servers, monkeypatch):
    """An async call whose waiter thread cannot start: the error reaches the caller after the
    call was waited for (its arrays were freed under the C client before), and the client is
    still usable and closes (it hung in close() before: the call was never counted done)."""
    import threading

    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    keys = np.arange(1, 9, dtype=np.uint64)

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError):
        c.pull_async("emb", keys)
    monkeypatch.undo()
    assert c.pull("emb", keys).shape == (8, 8)
    closer = threading.Thread(target=c.close)
    closer.start()
    closer.join(timeout=10)
    assert not closer.is_alive()


def test_interrupt_while_handing_over(servers, monkeypatch):
    """A KeyboardInterrupt as an async call is handed to the waiter thread (queued, or not yet):
    the call is waited for once and counted done once (a second count let close() disconnect
    under another call; none left close() waiting for ever)."""
    import threading

    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    keys = np.arange(1, 9, dtype=np.uint64)
    post = emberps.Client._post

    def queued_then_interrupted(self, item):
        post(self, item)
        if item is not None:
            raise KeyboardInterrupt

    def interrupted_before(self, item):
        if item is not None:
            raise KeyboardInterrupt
        post(self, item)

    for patch in (queued_then_interrupted, interrupted_before):
        monkeypatch.setattr(emberps.Client, "_post", patch)
        for _ in range(20):
            with pytest.raises(KeyboardInterrupt):
                c.pull_async("emb", keys)
        monkeypatch.undo()
        deadline = time.monotonic() + 10
        while c._busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c._busy == 0
    assert c.pull_async("emb", keys).result(timeout=10).shape == (8, 8)
    closer = threading.Thread(target=c.close)
    closer.start()
    closer.join(timeout=10)
    assert not closer.is_alive()


def test_interrupt_in_thread_start(servers, monkeypatch):
    """A KeyboardInterrupt in Thread.start once the waiter thread runs: the call is waited for,
    and the thread is the client's (close() joins it; none ran untracked beside a second)."""
    import threading

    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    keys = np.arange(1, 9, dtype=np.uint64)
    start = threading.Thread.start

    def started_then_interrupted(self):
        start(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", started_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.pull_async("emb", keys)
    monkeypatch.undo()
    assert c._busy == 0
    waiters = [t for t in threading.enumerate() if t.name == "emberps-waiter"]
    assert waiters and all(t is c._waiter for t in waiters)
    assert c.pull_async("emb", keys).result(timeout=10).shape == (8, 8)
    waiters = [t for t in threading.enumerate() if t.name == "emberps-waiter"]
    assert len(waiters) == 1 and waiters[0] is c._waiter
    c.close()
    assert not any(t.name == "emberps-waiter" for t in threading.enumerate())


def test_close_again_after_interrupt(servers, monkeypatch):
    """A close() interrupted (here as it tells the waiter thread to end) is done by the next
    close(): it disconnected never again before (the client and its thread leaked)."""
    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    c.pull_async("emb", np.arange(1, 9, dtype=np.uint64)).result(timeout=10)  # a waiter runs
    post = emberps.Client._post

    def interrupted(self, item):
        if item is None:
            raise KeyboardInterrupt
        post(self, item)

    monkeypatch.setattr(emberps.Client, "_post", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.close()
    monkeypatch.undo()
    with pytest.raises(emberps.EmberError):
        c.pull("emb", [1])  # closed to new calls already
    c.close()
    assert c._c == emberps.client.ffi.NULL


def test_close_in_done_callback(servers):
    """close() from a future's done callback (the waiter thread) returns at once; the waiter
    finishes the calls started, then disconnects (it waited for itself before)."""
    import threading

    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    keys = np.arange(1, 9, dtype=np.uint64)
    closed = threading.Event()

    def close_it(fut):
        c.close()
        closed.set()

    fut = c.pull_async("emb", keys)
    fut.add_done_callback(close_it)
    assert fut.result(timeout=10).shape == (8, 8)
    assert closed.wait(timeout=10)
    for _ in range(1000):  # the waiter disconnects
        if c._c == emberps._lib.ffi.NULL:
            break
        time.sleep(0.01)
    assert c._c == emberps._lib.ffi.NULL
    with pytest.raises(emberps.EmberError) as e:
        c.pull("emb", keys)
    assert e.value.name == "PC_ECLOSED"


def test_dropped_client_is_collected(servers):
    """A client nobody closed, after async calls: collected (and disconnected by __del__) once
    its waiter thread left; the running waiter held it for good before."""
    import gc
    import weakref

    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    c.pull_async("emb", np.arange(1, 9, dtype=np.uint64)).result(timeout=10)
    ref = weakref.ref(c)
    del c
    for _ in range(50):
        gc.collect()
        if ref() is None:
            break
        time.sleep(0.1)
    assert ref() is None


def test_bad_calls(servers):
    addr, _ = servers(TABLE)
    c = emberps.Client(addr)
    keys = np.arange(1, 9, dtype=np.uint64)
    with pytest.raises(emberps.EmberError) as e:
        c.pull("emb", keys, dim=4)
    assert e.value.name == "PC_EDIM" and e.value.code == emberps.CODES["PC_EDIM"]
    assert "dim 8" in e.value.detail and addr in e.value.detail
    with pytest.raises(emberps.EmberError) as e:
        c.pull("nope", keys)
    assert e.value.name == "PC_ENOTFOUND"
    with pytest.raises(emberps.EmberError) as e:
        c.push("nope", keys, np.zeros((8, 8), np.float32))
    assert e.value.name == "PC_ENOTFOUND" and "nope" in e.value.detail
    with pytest.raises(TypeError):
        c.pull("emb", np.arange(8))  # int64
    with pytest.raises(TypeError):
        c.pull("emb", np.arange(8, dtype=np.float64))
    with pytest.raises(TypeError):
        c.pull("emb", [1, -2, 3])
    with pytest.raises(TypeError):
        c.pull("emb", [1.5])
    with pytest.raises(ValueError):
        c.pull("emb", keys.reshape(2, 4))
    with pytest.raises(ValueError):
        c.push("emb", keys, np.zeros((7, 8), np.float32))
    with pytest.raises(ValueError):
        c.pull("emb", keys, out=np.zeros((8, 8), np.float64))
    with pytest.raises(ValueError):
        c.pull("emb", keys, out=np.zeros((8, 8), np.float32)[:, ::2])
    with pytest.raises(emberps.EmberError) as e:
        c.pull_async("emb", keys, dim=2).result(timeout=30)
    assert e.value.name == "PC_EDIM"
    bad = np.zeros((8, 8), np.float32)
    bad[2, 3] = np.nan
    bad[5, 0] = np.inf
    res = c.push("emb", keys, bad)
    assert res["skipped_nonfinite"] == 2 and res["applied"] == 6
    assert np.isfinite(c.pull("emb", keys)).all()
    assert c.pull("emb", np.zeros(0, np.uint64)).shape == (0, 8)  # empty batch
    c.close()
    c.close()
    with pytest.raises(emberps.EmberError) as e:
        c.pull("emb", keys)
    assert e.value.name == "PC_ECLOSED"


def test_token(servers):
    addr, _ = servers(TABLE, extra=["--token=s3cret"])
    with pytest.raises(emberps.EmberError) as e:
        emberps.Client(addr, token="wrong")
    assert e.value.name == "PC_EAUTH"
    with emberps.Client(addr, token="s3cret") as c:
        assert c.pull("emb", [1, 2]).shape == (2, 8)


def test_tls(servers, tmp_path):
    """TLS on the data plane from Python: the cluster's CA verifies; another CA is PC_ETLS with
    the reason; a plaintext client against a TLS server fails too."""
    from conftest import REPO
    import subprocess
    d = str(tmp_path / "tls")
    subprocess.run(["bash", os.path.join(REPO, "deploy", "make-certs.sh"), d], check=True,
                   capture_output=True, timeout=120)
    addr, _ = servers(TABLE, extra=["--tls-cert=%s/server.pem" % d, "--tls-key=%s/server.key" % d,
                                    "--token=t0k"])
    with emberps.Client(addr, token="t0k", tls_ca=d + "/ca.pem") as c:
        assert c.pull("emb", [5, 6]).shape == (2, 8)
    with pytest.raises(emberps.EmberError) as e:
        emberps.Client(addr, token="t0k", tls_ca=d + "/other-ca.pem")
    assert e.value.name == "PC_ETLS" and "certificate verify failed" in e.value.detail
    with pytest.raises(emberps.EmberError):
        emberps.Client(addr, token="t0k", connect_timeout_ms=2000)
    with pytest.raises(emberps.EmberError) as e:
        emberps.Client(addr, token="t0k", tls_ca=d + "/missing.pem")
    assert e.value.name == "PC_ENOTFOUND"
    with pytest.raises(ValueError):
        emberps.Client(addr, tls_cert=d + "/client.pem")  # a certificate needs tls_ca
