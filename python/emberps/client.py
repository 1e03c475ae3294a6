"""emberps.Client: pull, push and look up rows of EmberPS tables from Python (libpsclient).

DESIGN: a thin layer over the C client, which does the work (slot routing, one connection per
server, retries, deadlines). Arrays cross without copies: keys are read from a C-contiguous
uint64 array, rows are written into a C-contiguous float32 array (the caller's `out=` or a new
one), gradients are read from a float32 array (converted once if given in another float type).
Every call goes through the async API and psc_wait_detail, so a failure is an EmberError whose
`detail` names the server and what it said. Futures (the *_async methods) are
concurrent.futures.Future objects completed by one waiter thread per client, which takes
finished calls in the order they were started (psc_wait_detail releases the GIL, as every cffi
call does); the arrays of a pending call are held by its future until it completed.
Thread rule: a Client may be used by several threads at once; close() waits until calls
already started have completed (each is bounded by timeout_ms).
"""
import collections
import numbers
import os
import threading
import time
import weakref
from concurrent.futures import Future, InvalidStateError

import numpy as np

from ._lib import ABI_MINOR_UNCLEAN, ABI_MINOR_WIRE, err_name, ffi, lib
from .errors import CODES, EmberError, check

WHY = 1024  # bytes of a call's failure detail (psclient.c's PSC_WHY_MAX, 736, is below this)
WAITER_IDLE_S = 1.0  # the async calls' waiter thread leaves after this long with none
CLAIM_MODES = {"check": 0, "warm_start": 1, "fresh": 2, "inspect": 3}
WIRE_TYPES = {"f32": 0, "bf16": 1, "f16": 2}  # psclient.h PSC_WIRE_*
CLAIM_ACTIONS = ("new", "continued", "warm_started", "reset", "none")

# Every live Client of this process: a forked child fails their pending futures (Client._forked)
_CLIENTS = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_CLIENTS):
        if c._pid != os.getpid():
            c._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
NAME_MAX, JOB_MAX = 64, 127  # bytes of a table name and a job name (pc_wire.h)


def _name(s, what, most, empty_ok=False):
    """Refuse a name libpsclient would refuse with a bare "invalid argument", or read as another
    (C strings end at a NUL: "emb\0x" would name table "emb")."""
    if not isinstance(s, str) or (not s and not empty_ok):
        raise ValueError("%s must be a non-empty str" % what)
    if "\0" in s or len(s.encode()) > most:
        raise ValueError("%s must be at most %d bytes, with no NUL: %r" % (what, most, s))


def as_keys(keys):
    """keys as a 1-D C-contiguous uint64 array (no copy when it is one already). A numpy array
    must be uint64 (a signed array is refused: say .view(np.uint64) for 64-bit patterns, such as
    keys kept in an int64 torch tensor, or .astype(np.uint64) for values); a sequence must hold
    ints in [0, 2^64)."""
    if isinstance(keys, np.ndarray):
        if keys.dtype != np.uint64:
            raise TypeError("keys must be a numpy uint64 array, got %s (use .view(np.uint64) "
                            "for 64-bit patterns, .astype(np.uint64) for values)" % keys.dtype)
        if keys.ndim != 1:
            raise ValueError("keys must be 1-D, got shape %s" % (keys.shape,))
        return np.ascontiguousarray(keys)
    keys = list(keys)
    for k in keys:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 0 <= k < 2 ** 64:
            raise TypeError("keys must be ints in [0, 2^64), got %r" % (k,))
    return np.array(keys, dtype=np.uint64)


_TEXT_SETTINGS = ("name", "init", "missing", "optimizer", "row_dtype")  # ps_table.c's text settings


def _parse_settings(line):
    """"name=emb,dim=16,lr=0.05,cold=false" -> a dict with numbers and booleans converted
    (the text settings stay text: a table may be named "2024" or "nan")."""
    out = {}
    for item in line.split(","):
        if "=" not in item:
            continue
        k, v = item.split("=", 1)
        if k in _TEXT_SETTINGS:
            out[k] = v
            continue
        if v in ("true", "false"):
            out[k] = v == "true"
            continue
        for conv in (int, float):
            try:
                out[k] = conv(v)
                break
            except ValueError:
                pass
        else:
            out[k] = v
    return out


class Client:
    """A client of every server of an EmberPS cluster (the data plane).

    servers: a cluster map text, or "host:port" of any server (its map is used).
    token: the servers' token. tls_ca (with tls_cert, tls_key for client certificates,
    tls_server_name to check another name than each server's address): TLS on the data plane.
    timeout_ms bounds every call; retries (0: none) and max_inflight are libpsclient's.
    wire_dtype: "f32" (exact), "bf16" or "f16": rows and gradients travel compressed and are
    converted at both ends (arrays in and out stay float32; docs/wire.md "Compressed rows");
    servers older than libpsclient 1.5's refuse such calls with PC_EUNSUPPORTED.
    """

    def __init__(self, servers, token=None, timeout_ms=10000, max_inflight=8, retries=3,
                 connect_timeout_ms=5000, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name=None, wire_dtype="f32"):
        if not isinstance(servers, str) or not servers:
            raise ValueError("servers must be a cluster map text or 'host:port'")
        if wire_dtype not in WIRE_TYPES:
            raise ValueError("wire_dtype must be one of %s" % ", ".join(WIRE_TYPES))
        if wire_dtype != "f32" and (lib.psc_version() >> 8) & 0xFF < ABI_MINOR_WIRE:
            raise ValueError("wire_dtype=%s needs libpsclient 1.%d or later (loaded: %s)" % (
                wire_dtype, ABI_MINOR_WIRE, ffi.string(lib.psc_version_string()).decode()))
        if (tls_cert or tls_key or tls_server_name) and not tls_ca:
            raise ValueError("tls_cert, tls_key and tls_server_name need tls_ca")
        keep = []

        def cstr(s):
            if s is None:
                return ffi.NULL
            b = ffi.new("char[]", s.encode())
            keep.append(b)
            return b

        for what, v, least in (("timeout_ms", timeout_ms, 1), ("max_inflight", max_inflight, 1),
                               ("retries", retries, 0),
                               ("connect_timeout_ms", connect_timeout_ms, 1)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or not least <= v < 2**31:
                raise ValueError("%s must be an int >= %d, got %r" % (what, least, v))
        o = ffi.new("psc_opts_t *")
        o.servers, o.token = cstr(servers), cstr(token)
        # (libpsclient reads 0 as its default: no retries is -1 there)
        o.timeout_ms, o.max_inflight, o.retries = timeout_ms, max_inflight, retries or -1
        o.connect_timeout_ms = connect_timeout_ms
        tls = ffi.NULL
        if tls_ca:
            tls = ffi.new("psc_tls_opts_t *")
            tls.ca, tls.cert, tls.key = cstr(tls_ca), cstr(tls_cert), cstr(tls_key)
            tls.server_name = cstr(tls_server_name)
        why = ffi.new("char[]", WHY)
        out = ffi.new("psc_t **")
        check(lib.psc_connect2(o, tls, why, WHY, out), ffi.string(why).decode(errors="replace"))
        self._c = out[0]
        if wire_dtype != "f32":
            lib.psc_set_wire_type(self._c, WIRE_TYPES[wire_dtype])
        self.wire_dtype = wire_dtype
        self.timeout_ms = timeout_ms
        self._dims = {}
        self._mu = threading.Condition()
        self._busy = 0
        self._closed = False
        self._pending = collections.deque()  # under _mu: [id, future, result, keep, taken]
        self._waiter = None
        self._close_after = False  # close() ran in a done callback: the waiter disconnects
        # The process that made it: a forked child has the client's memory but not its C I/O
        # thread, so a call there would wait for ever, and so would psc_close (it joins that
        # thread). _enter refuses, close() only forgets the pointer (a DataLoader worker, say).
        self._pid = os.getpid()
        self._current = None  # the item the waiter waits for (under _mu)
        _CLIENTS.add(self)

    # ---- lifetime --------------------------------------------------------------------------
    def close(self):
        """Wait for calls already started, then disconnect. Idempotent. From a future's done
        callback (the waiter thread) it returns at once: the waiter finishes the calls started,
        then disconnects (waiting there would wait for itself); a close() from another thread
        after that waits for it."""
        if getattr(self, "_pid", os.getpid()) != os.getpid():  # a forked child: see __init__
            self._closed, self._c = True, ffi.NULL  # (_mu may be held by a thread not here)
            return
        with self._mu:
            if self._c == ffi.NULL:
                return
            self._closed = True
            in_waiter = self._waiter is not None and threading.current_thread() is self._waiter
            if self._close_after and in_waiter:
                return
            if in_waiter:
                self._close_after = True
                self._post(None)
                return
            waiter = self._waiter
            if not self._close_after:  # (else: a done callback's close, the waiter finishing it)
                while self._busy > 0:  # (interrupted: a later close() waits again)
                    self._mu.wait()
                if waiter:
                    self._post(None)
        if waiter:  # its calls done, it leaves (after a callback's close: disconnected)
            waiter.join()
        self._disconnect()

    def _forked(self):
        """In a forked child (os.register_at_fork): the futures pending at the fork would never
        complete (their waiter thread is the parent's), so they fail with PC_ECLOSED; the lock
        is made anew (a parent's thread may have held it at the fork)."""
        self._mu = threading.Condition()
        self._waiter = None
        items = list(self._pending) + [self._current]
        self._pending.clear()
        self._current = None
        for item in items:
            if item is not None:
                # its lock may have been held by the parent's waiter at the fork (completing it)
                item[1]._condition = threading.Condition()
            if item is not None and not item[1].done():
                try:
                    item[1].set_exception(EmberError(
                        CODES["PC_ECLOSED"], "a call started in process %d before the fork: a "
                        "forked process cannot wait for it" % self._pid))
                except InvalidStateError:  # (completed meanwhile)
                    pass

    def _disconnect(self):
        """Close the C client, once: whichever close() (or the waiter) gets here first."""
        with self._mu:
            c, self._c = self._c, ffi.NULL
        if c != ffi.NULL:
            lib.psc_close(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_c", ffi.NULL) != ffi.NULL:
            self.close()

    def _enter(self):
        if self._pid != os.getpid():
            raise EmberError(CODES["PC_ECLOSED"],
                             "this client was made in process %d: a forked process cannot use it "
                             "(make a Client in each process, e.g. in a DataLoader's "
                             "worker_init_fn)" % self._pid)
        with self._mu:
            if self._closed:
                raise EmberError(CODES["PC_ECLOSED"], "the client is closed")
            self._busy += 1

    def _leave(self):
        with self._mu:
            self._busy -= 1
            if not self._busy:
                self._mu.notify_all()

    # ---- calls -----------------------------------------------------------------------------
    def _wait(self, cid):
        why = ffi.new("char[]", WHY)
        rc = lib.psc_wait_detail(self._c, cid, why, WHY)
        return rc, ffi.string(why).decode(errors="replace")

    def _start(self, op, table, keys, dim, rows, grads, found, res, sync=False, result=None,
               keep=None):
        """Start one call. With sync, wait for it here too and return (rc, why); else hand it to
        the waiter thread and return its Future (`keep`: the arrays, alive until it completed).
        The wait, or the hand-over, is in the same try as the start, so an exception between
        them (KeyboardInterrupt) cannot leave a started call unwaited (the C side writing into
        freed arrays) or counted busy for ever (close() waiting for it)."""
        self._enter()
        cid = done = item = None
        try:
            cid = ffi.new("uint64_t *")
            tb = table.encode()
            kp = ffi.from_buffer("uint64_t[]", keys)
            if op == "push":
                rc = lib.psc_push_async(self._c, tb, kp, keys.size, dim,
                                        ffi.from_buffer("float[]", grads), res, ffi.NULL,
                                        ffi.NULL, cid)
            elif op == "pull":
                rc = lib.psc_pull_async(self._c, tb, kp, keys.size, dim,
                                        ffi.from_buffer("float[]", rows, require_writable=True),
                                        ffi.NULL, ffi.NULL, cid)
            else:
                rc = lib.psc_lookup_async(self._c, tb, kp, keys.size, dim,
                                          ffi.from_buffer("float[]", rows, require_writable=True),
                                          ffi.from_buffer("uint8_t[]", found,
                                                          require_writable=True),
                                          ffi.NULL, ffi.NULL, cid)
            check(rc)
            if not sync:
                fut = Future()
                fut.set_running_or_notify_cancel()
                item = [cid[0], fut, result, keep, False]
                with self._mu:  # the waiter leaves when idle (under _mu): queued while it runs
                    if self._waiter is None:
                        self._start_waiter()
                    self._post(item)
                return fut
            done = self._wait(cid[0])
        except BaseException:  # started (ids are >= 1): waited for, or C writes freed memory
            if not sync and self._unqueue(item):
                self._abandon(cid[0] if cid is not None else 0)  # waits, leaves
            elif sync and done is None and cid is not None and cid[0]:
                self._wait(cid[0])  # (a finished id's second wait answers at once)
            raise
        finally:
            if sync:  # once, whatever happened
                self._leave()
        return done

    def _start_waiter(self):
        """Start the waiter thread (_mu held), tracked before it starts: start() interrupted once
        the thread runs (KeyboardInterrupt in its wait for the thread) left one nobody joined,
        and the next call started a second."""
        waiter = threading.Thread(target=self._wait_loop, name="emberps-waiter", daemon=True)
        self._waiter = waiter
        try:
            waiter.start()
        except BaseException:
            if waiter.ident is None:  # never ran
                self._waiter = None
            raise

    def _post(self, item):
        """Queue an item for the waiter (_mu held)."""
        self._pending.append(item)
        self._mu.notify_all()

    def _unqueue(self, item):
        """Whether a call whose hand-over raised is still the caller's (then taken back from the
        queue): False once the waiter took it (it waits for it and leaves)."""
        if item is None:  # never queued (its start failed); a None queued is close()'s mark
            return True
        with self._mu:
            for i, queued in enumerate(self._pending):
                if queued is item:
                    del self._pending[i]
                    return True
            return not item[4]

    def _abandon(self, cid):
        """A call that raised on its way to being waited for (KeyboardInterrupt, no thread):
        wait for it first when it started, then leave."""
        try:
            if cid:
                self._wait(cid)
        finally:
            self._leave()

    def _finish(self, cid, result):
        try:
            rc, why = self._wait(cid)
        finally:
            self._leave()
        check(rc, why)
        return result()

    def _wait_loop(self):
        """Waits for the async calls in order. It leaves after a second with none (so that a
        client nobody closed can be collected: the running thread holds it), and at close; after
        a close() from a done callback, once the calls started are done, it disconnects."""
        with self._mu:  # a thread start() gave up on (interrupted before it ran) does nothing
            if self._waiter is not threading.current_thread():
                return
        while True:
            with self._mu:
                idle_end = time.monotonic() + WAITER_IDLE_S
                while not self._pending:
                    left = idle_end - time.monotonic()
                    if left <= 0:
                        if self._waiter is threading.current_thread():
                            self._waiter = None
                        return
                    self._mu.wait(left)
                item = self._pending.popleft()
                if item is not None:
                    item[4] = True  # taken: this thread waits for it
                    self._current = item
            if item is None:
                if not self._close_after:
                    return
                with self._mu:
                    busy = self._busy
                if busy:  # a call started before the close, not queued yet
                    time.sleep(0.001)
                    with self._mu:
                        self._post(None)
                    continue
                self._disconnect()
                return
            cid, fut, result, _keep, _ = item
            try:
                fut.set_result(self._finish(cid, result))
            except BaseException as e:  # delivered to the future's owner
                fut.set_exception(e)
            with self._mu:
                self._current = None

    def _rows_out(self, n, dim, out):
        if out is None:
            return np.empty((n, dim), dtype=np.float32)
        if (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != (n, dim)
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError("out must be a writable C-contiguous float32 array of shape (%d, %d)"
                             % (n, dim))
        return out

    def _prep(self, op, table, keys, dim, out=None, grads=None, sync=False):
        """Check and convert a call's arguments and start it: with sync, wait for it and return
        its result; else the Future of its result."""
        _name(table, "table", NAME_MAX)
        keys = as_keys(keys)
        n = keys.size
        if grads is not None:
            grads = np.ascontiguousarray(grads, dtype=np.float32)
            if grads.ndim != 2 or grads.shape[0] != n:
                raise ValueError("grads must have shape (%d, dim), got %s" % (n, grads.shape))
            dim = grads.shape[1] if dim is None else dim
            if grads.shape[1] != dim:
                raise ValueError("grads have dim %d, the call %d" % (grads.shape[1], dim))
        elif dim is None:
            dim = self.dim(table)
        if not isinstance(dim, (int, np.integer)) or not 0 < dim <= 1024:
            raise ValueError("dim must be an int in 1..1024, got %r" % (dim,))
        dim = int(dim)
        rows = found = res = None
        if op == "push":
            res = ffi.new("psc_push_result_t *")
        else:
            rows = self._rows_out(n, dim, out)
            if op == "lookup":
                found = np.zeros(n, dtype=np.uint8)
        if op == "push":
            def result():
                return {"applied": res.applied, "skipped_nonfinite": res.skipped_nonfinite,
                        "dropped_unadmitted": res.dropped_unadmitted}
        elif op == "pull":
            def result():
                return rows
        else:
            def result():
                return rows, found.view(np.bool_)
        if sync:
            rc, why = self._start(op, table, keys, dim, rows, grads, found, res, sync=True)
            check(rc, why)
            return result()
        return self._start(op, table, keys, dim, rows, grads, found, res, result=result,
                           keep=(keys, rows, grads, found, res))

    def pull(self, table, keys, dim=None, out=None):
        """Rows of `keys` (created with the table's initializer when missing): a (n, dim) float32
        array (`out` when given). dim defaults to the table's."""
        return self._prep("pull", table, keys, dim, out, sync=True)

    def push(self, table, keys, grads, dim=None):
        """Apply gradients (n, dim) with the table's server-side optimizer (duplicate keys are
        summed). Returns {"applied", "skipped_nonfinite", "dropped_unadmitted"}."""
        return self._prep("push", table, keys, dim, grads=grads, sync=True)

    def lookup(self, table, keys, dim=None, out=None):
        """Read-only rows: (rows, found) where found[i] is False for a key the table lacks (its
        row is zeros or the table's missing-row policy)."""
        return self._prep("lookup", table, keys, dim, out, sync=True)

    def pull_async(self, table, keys, dim=None, out=None):
        """pull, returning a concurrent.futures.Future of the rows."""
        return self._prep("pull", table, keys, dim, out)

    def push_async(self, table, keys, grads, dim=None):
        """push, returning a Future of its counters."""
        return self._prep("push", table, keys, dim, grads=grads)

    def lookup_async(self, table, keys, dim=None, out=None):
        """lookup, returning a Future of (rows, found)."""
        return self._prep("lookup", table, keys, dim, out)

    # ---- the cluster -----------------------------------------------------------------------
    def claim(self, table, job, mode="check"):
        """Claim `table` for training job `job` on every server (docs/server.md "Table
        owners"); mode: check | warm_start | fresh | inspect. Returns {"action", "dim", "rows",
        "version", "previous", "settings"}."""
        if mode not in CLAIM_MODES:
            raise ValueError("mode must be one of %s" % ", ".join(CLAIM_MODES))
        _name(table, "table", NAME_MAX)
        _name(job, "job", JOB_MAX, empty_ok=mode in ("fresh", "inspect"))  # as psc_claim
        out = ffi.new("psc_claim_t *")
        self._enter()
        try:
            rc = lib.psc_claim(self._c, table.encode(), job.encode(), CLAIM_MODES[mode], out)
        finally:
            self._leave()
        check(rc, ffi.string(out.message).decode(errors="replace"))
        return {"action": CLAIM_ACTIONS[out.action] if 0 <= out.action < 5 else out.action,
                "dim": out.dim, "rows": out.rows, "version": out.version,
                "previous": ffi.string(out.previous).decode(),
                "settings": _parse_settings(ffi.string(out.config).decode())}

    def tables(self):
        """The servers' tables: a list of dicts with the table's settings ("name", "dim",
        "optimizer", "lr", ...) and "rows", "version" (push calls) and "owner", summed over the
        servers."""
        cap = 1 << 14
        while True:
            buf = ffi.new("char[]", cap)
            n = ffi.new("size_t *")
            self._enter()
            try:
                rc = lib.psc_tables(self._c, buf, cap, n)
            finally:
                self._leave()
            if rc == CODES["PC_ETOOBIG"]:
                cap = n[0] + 1
                continue
            check(rc)
            break
        out = []
        for line in ffi.string(buf).decode().splitlines():
            t = _parse_settings(line)
            c = self.claim(t["name"], "", "inspect")
            t.update(rows=c["rows"], version=c["version"], owner=c["previous"])
            self._dims[t["name"]] = t["dim"]
            out.append(t)
        return out

    def dim(self, table):
        """The dim of `table` (asked of the servers once, then remembered)."""
        if table not in self._dims:
            self.tables()
            if table not in self._dims:
                raise EmberError(CODES["PC_ENOTFOUND"], "no table %s on the servers" % table)
        return self._dims[table]

    def health(self, timeout_ms=1000):
        """A round trip to every server of the map: a list of {"addr", "ok", "rtt_ms",
        "error" (the code's name or None), "message"}."""
        cap = 64
        while True:
            out = ffi.new("psc_server_health_t[]", cap)
            self._enter()
            try:
                n = check(lib.psc_health(self._c, timeout_ms, out, cap))
            finally:
                self._leave()
            if n <= cap:
                break
            cap = n
        res = []
        for i in range(n):
            e = out[i]
            res.append({"addr": ffi.string(e.addr).decode(), "ok": e.rc == 0,
                        "rtt_ms": e.rtt_us / 1000.0 if e.rc == 0 else None,
                        "error": None if e.rc == 0 else err_name(e.rc),
                        "message": ffi.string(e.message).decode(errors="replace")})
        return res

    def map_text(self):
        """The cluster map the client uses now."""
        self._enter()
        try:
            n = lib.psc_map_text(self._c, ffi.NULL, 0)
            while True:  # the map may grow (a refresh on another thread) between the calls
                buf = ffi.new("char[]", n + 1)
                got = lib.psc_map_text(self._c, buf, n + 1)
                if got <= n:
                    break
                n = got
        finally:
            self._leave()
        return ffi.string(buf).decode()

    def stats(self):
        """The client's counters: calls, retries, map_refreshes, reconnects, timeouts, and
        unclean_slots: slots whose rows may have gone back (promoted to a backup that had not
        caught up, or held alone by a server that restarted from its checkpoint), over the map's
        history (None with a libpsclient before 1.6)."""
        s = ffi.new("psc_stats_t *")
        unclean = None
        self._enter()
        try:
            lib.psc_stats(self._c, s)
            if (lib.psc_version() >> 8) & 0xFF >= ABI_MINOR_UNCLEAN:
                unclean = lib.psc_map_unclean_slots(self._c)
        finally:
            self._leave()
        out = {k: getattr(s, k) for k in ("calls", "retries", "map_refreshes", "reconnects",
                                          "timeouts")}
        out["unclean_slots"] = unclean
        return out
