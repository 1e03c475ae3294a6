"""Fixtures of the emberps tests: real ps-server processes on loopback ports, started and stopped
by each test (every wait bounded). Binaries come from $EMBERPS_BIN_DIR (ctest passes the
build's), else ../../build/bin; the library from $EMBERPS_LIBPSCLIENT or the build tree."""
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("EMBERPS_BUILD_DIR", os.path.join(REPO, "build")))
BIN = os.path.join(BUILD, "bin")
sys.path.insert(0, os.path.join(REPO, "python"))


def free_port():
    """A free port below the kernel's ephemeral range (32768-60999 here): a port bind(0) handed
    out and took back can go to another socket (a server's --grpc-port=0, a client's connection)
    before the server given it binds it."""
    for _ in range(1000):
        port = random.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29999")


class Server:
    """One ps-server process: port (data plane), addr, stop() (SIGTERM), kill() (SIGKILL)."""

    def __init__(self, workdir, tables, port=0, extra=()):
        os.makedirs(workdir, exist_ok=True)
        pf = os.path.join(workdir, "port-%d-%d" % (port, time.monotonic_ns()))
        args = [os.path.join(BIN, "ps-server"), "--port=%d" % port, "--port-file=" + pf,
                "--grpc-port=0", "--metrics-port=0", "--log-level=warn", "--io-threads=1",
                "--tables=" + tables] + list(extra)
        self.log = open(pf + ".log", "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("ps-server exited with %s: see %s.log" % (self.proc.returncode,
                                                                           pf))
            try:
                with open(pf) as f:
                    parts = f.read().split()
                if len(parts) == 3:
                    self.port = int(parts[0])
                    self.addr = "127.0.0.1:%d" % self.port
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        self.kill()
        raise RuntimeError("ps-server did not come up")

    def signal(self, sig):
        """Send sig; SIGSTOP returns once the kernel reports the process stopped (kill()
        returns before: on a loaded machine the server answered a call made just after)."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        if sig != signal.SIGSTOP:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open("/proc/%d/stat" % self.proc.pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]  # after the command name
            if state in ("T", "t"):
                return
            time.sleep(0.001)
        raise RuntimeError("ps-server %d did not stop" % self.proc.pid)

    def stop(self):
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def servers(tmp_path):
    """start(tables, n=1, extra=()) -> the cluster's address text (a map for n > 1) and its
    Server objects; all are stopped at the end of the test."""
    started = []

    def start(tables, n=1, extra=()):
        if n == 1:
            s = Server(str(tmp_path), tables, extra=extra)
            started.append(s)
            return s.addr, [s]
        ports = [free_port() for _ in range(n)]
        step = 16384 // n
        slots = ",".join("%d-%d:%d" % (i * step, 16383 if i == n - 1 else (i + 1) * step - 1, i)
                         for i in range(n))
        cmap = "version=1;servers=%s;slots=%s" % (
            ",".join("127.0.0.1:%d" % p for p in ports), slots)
        group = []
        for p in ports:
            s = Server(str(tmp_path), tables, port=p, extra=["--cluster-map=" + cmap] + list(extra))
            started.append(s)
            group.append(s)
        return cmap, group

    yield start
    for s in started:
        s.stop()
