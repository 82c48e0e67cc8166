"""Shared helpers of the Python client's pytest suite.

- the client under test is imported from clients/python (not an installed copy);
- :class:`FakeDaemon`: a real unix socket server thread that speaks the protocol through the
  Python codec, scripted by each test;
- :func:`start_daemon`: a real ferryd from ``FERRY_BIN_DIR`` (default build/src of this repo).
"""

from __future__ import annotations

import array
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "clients" / "python"
sys.path.insert(0, str(CLIENT_DIR))

from ferry.protocol import (FrameReader, Hello, HelloReply, Message, Ok,  # noqa: E402
                            check_flags, decode, encode, Error)

BIN_DIR = Path(os.environ.get("FERRY_BIN_DIR", str(REPO / "build" / "src")))
IO_TIMEOUT = 10.0  # every wait in these tests is bounded by this
FORCED_STOP = 6  # ferryd stopped before its drain finished (src/core/exit_codes.hpp)


# --------------------------------------------------------------------------------------------
# A fake daemon


class FakeConn:
    """One accepted connection of :class:`FakeDaemon`.

    It reads with recvmsg and keeps the file descriptors that come with the bytes (SCM_RIGHTS)
    as ferryd does: a batch belongs to the stream position where the recvmsg that brought it
    began, and a frame claims the batches at its first byte (``fds``, after :meth:`recv`); any
    other batch is kept in ``stray_fds``. The test owns (and closes) them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(IO_TIMEOUT)
        self.frames = FrameReader()
        self.version = 4  # for decoding requests and encoding replies, once the hello settled it
        self.stream_in = 0  # bytes received so far
        self.frame_at = 0  # stream position of the next frame
        self.fd_batches: list[tuple[int, list[int]]] = []
        self.fds: list[int] = []  # the descriptors of the last frame returned
        self.stray_fds: list[int] = []

    def _receive(self) -> None:
        data, anc, flags, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 64))
        if not data:
            raise EOFError("the client closed the connection")
        got: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                got.extend(a)
        if got:
            self.fd_batches.append((self.stream_in, got))
        self.stream_in += len(data)
        self.frames.feed(data)

    def _next_frame(self):  # -> Frame
        while True:
            f = self.frames.next()
            if f is not None:
                start, self.frame_at = self.frame_at, self.frame_at + 4 + len(f.body) + 8
                self.fds = []
                while self.fd_batches and self.fd_batches[0][0] < self.frame_at:
                    at, fds = self.fd_batches.pop(0)
                    (self.fds if at == start else self.stray_fds).extend(fds)
                return f
            self._receive()

    def recv(self) -> tuple[int, Message]:
        """The next request: ``(seq, message)``; raises on EOF or after IO_TIMEOUT."""
        f = self._next_frame()
        check_flags(f)
        return f.seq, decode(f.type, f.seq, f.body, self.version)

    def recv_raw(self) -> tuple[int, int, bytes]:
        """The next request as ``(type, seq, body)``, undecoded."""
        f = self._next_frame()
        return f.type, f.seq, f.body

    def close_fds(self) -> None:
        for fd in self.fds + self.stray_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds, self.stray_fds = [], []

    def send(self, msg: Message, seq: int, version: Optional[int] = None) -> None:
        self.sock.sendall(encode(msg, seq, self.version if version is None else version))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def hello(self, speaks: tuple[int, int] = (3, 4), role: str = "decode") -> Hello:
        """Read the hello and answer it as a daemon speaking ``speaks`` would."""
        seq, msg = self.recv()
        assert isinstance(msg, Hello), msg
        lo, hi = max(msg.min_version, speaks[0]), min(msg.version, speaks[1])
        if lo > hi:
            self.send(Error(312, f"client speaks protocol versions {msg.min_version}.."
                                 f"{msg.version}, ferryd speaks {speaks[0]}..{speaks[1]}"), seq)
            raise EOFError("unsupported version")
        self.version = hi
        self.send(HelloReply(version=hi, node="fake", instance="0", role=role,
                             control="127.0.0.1:1", min_version=speaks[0],
                             max_version=speaks[1]), seq)
        return msg

    def wait_closed(self) -> None:
        """Block until the client closes (bounded)."""
        try:
            while True:
                self._receive()
        except (OSError, EOFError):
            pass
        self.close_fds()


class FakeDaemon:
    """A unix socket server thread; ``serve(handler)`` runs ``handler(conn)`` for each of the
    next ``connections`` connections. ``join()`` re-raises what a handler raised (EOFError from
    a client that closed is fine)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "fake.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(8)
        self.srv.settimeout(IO_TIMEOUT)
        self.thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None
        self.conns: list[FakeConn] = []

    def serve(self, handler: Callable[[FakeConn], None], connections: int = 1) -> None:
        def run() -> None:
            try:
                for _ in range(connections):
                    sock, _ = self.srv.accept()
                    conn = FakeConn(sock)
                    self.conns.append(conn)
                    try:
                        handler(conn)
                    except EOFError:
                        pass
                    finally:
                        conn.close_fds()
                        sock.close()
            except BaseException as e:  # reported by join()
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True, name="fake-ferryd")
        self.thread.start()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(IO_TIMEOUT)
        assert not self.thread.is_alive(), "the fake daemon's handler did not finish in time"
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.srv.close()

    def serve_ok(self, version: int, got: list[Any], requests: int = 8) -> None:
        """Serve one connection in protocol ``version``: keep each of its next ``requests``
        requests in ``got`` and answer it ok."""
        def serve(c: FakeConn) -> None:
            c.hello(speaks=(3, version))
            c.version = version
            for _ in range(requests):
                try:
                    seq, msg = c.recv()
                except EOFError:
                    return
                got.append(msg)
                c.close_fds()
                c.send(Ok(), seq)
        self.serve(serve)


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A short temporary directory (unix socket paths are limited to 107 bytes)."""
    d = tempfile.mkdtemp(prefix="ferry-py-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake(short_tmp: str) -> Iterator[FakeDaemon]:
    d = FakeDaemon(short_tmp)
    try:
        yield d
    finally:
        d.close()


# --------------------------------------------------------------------------------------------
# Real daemons


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon_config(name: str, role: str, port: int, sock: str, pools: str,
                  extra: str = "", provider: str = "tcp") -> str:
    return f"""node: {{name: {name}}}
role: {role}
listen: {{control: "127.0.0.1:{port}", client: {sock}}}
fabric: {{provider: {provider}, write_piece_bytes: 262144}}
{pools}{extra}"""


MAMBA_POOLS = """pools:
  kv: {layer_ids: [3, 7], page_tokens: 1, kv_heads: 2, head_dim: 256, dtype_bytes: 2, pages: 256}
  mamba:
    slots: 4
    layer_ids: [0, 1]
    tensors:
      - {name: conv, shape: [8192, 3], dtype_bytes: 2, slice_axis: 0, shard_groups: [2048, 2048, 4096]}
      - {name: temporal, shape: [4, 128, 128], dtype_bytes: 4, slice_axis: 0}
  aux: {rows: 8, row_bytes: 5632}
"""

KV_ONLY_POOLS = """pools:
  kv: {layer_ids: [0], page_tokens: 1, kv_heads: 1, head_dim: 64, dtype_bytes: 2, pages: 2048}
"""


class Daemon:
    """A launched ferryd: ``sock`` (client socket path), ``control`` ("127.0.0.1:port"),
    ``config`` (its file)."""

    def __init__(self, proc: subprocess.Popen, sock: str, control: str, log: str,
                 config: str = "") -> None:
        self.proc, self.sock, self.control, self.log = proc, sock, control, log
        self.config = config
        self._ready = threading.Event()  # set once the daemon wrote its line (or exited)
        self._line = ""

    def wait_ready(self) -> "Daemon":
        """Wait (30 s at most) for the 'ready' line of a launched daemon; fail with its log
        otherwise (the daemon is killed)."""
        if not self._ready.wait(30) or self._line != "ready":
            self.proc.kill()
            self.proc.wait(timeout=15)
            pytest.fail(f"{Path(self.config).stem} did not start: {open(self.log).read()}")
        return self

    def stop(self) -> int:
        """Stop at once: SIGTERM begins a drain (the rooms accepted may finish), SIGINT right
        after it ends the drain (docs/operations.md). The forced stop asked for is what
        happened: its exit code 6 (rooms were still active, docs/cli.md) is returned as 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=15)
            return 0 if rc == FORCED_STOP else rc
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
            return -9


def start_daemon(tmp: str, name: str, role: str, pools: str, extra: str = "",
                 provider: str = "tcp") -> Daemon:
    """Start ferryd with ``--ready-fd`` and wait (bounded) until it says ``ready``."""
    return _launch_new(tmp, name, role, pools, extra, provider).wait_ready()


def start_pair(tmp: str, prefill: str, decode: str, pools: str, extra: str = "",
               provider: str = "tcp", decode_pools: Optional[str] = None) -> tuple[Daemon, Daemon]:
    """A prefill and a decode ferryd started at once (most of a start is libfabric probing the
    machine, which overlaps); both are stopped if either does not start."""
    p = _launch_new(tmp, prefill, "prefill", pools, extra, provider)
    d = _launch_new(tmp, decode, "decode", decode_pools or pools, extra, provider)
    try:
        return p.wait_ready(), d.wait_ready()
    except BaseException:
        p.stop()
        d.stop()
        raise


def restart_daemon(d: Daemon) -> Daemon:
    """Start ferryd again on the config of ``d``, which has exited: the same socket and ports
    (a new instance); its log is appended to ``d``'s."""
    assert d.proc.poll() is not None, "restart_daemon: the daemon is still running"
    return _launch(d.config, d.sock, d.control, d.log, append=True).wait_ready()


def _launch_new(tmp: str, name: str, role: str, pools: str, extra: str,
                provider: str) -> Daemon:
    if not (BIN_DIR / "ferryd").is_file():
        pytest.fail(f"no ferryd at {BIN_DIR / 'ferryd'}: build it, or set FERRY_BIN_DIR to the "
                    f"directory holding it")
    port, sock = free_port(), os.path.join(tmp, name + ".sock")
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(daemon_config(name, role, port, sock, pools, extra, provider))
    return _launch(path, sock, f"127.0.0.1:{port}", os.path.join(tmp, name + ".log"))


def _launch(path: str, sock: str, control: str, log: str, append: bool = False) -> Daemon:
    """Fork ferryd with a pipe for ``--ready-fd``; the Daemon's wait_ready() waits for its
    line."""
    ferryd = BIN_DIR / "ferryd"
    r, w = os.pipe()
    with open(log, "a" if append else "w") as logf:
        proc = subprocess.Popen([str(ferryd), "--config", path, "--ready-fd", str(w)],
                                pass_fds=(w,), stdout=logf, stderr=logf)
    os.close(w)
    d = Daemon(proc, sock, control, log, path)

    def read() -> None:
        with os.fdopen(r) as f:  # "ready", or EOF when the daemon exits
            d._line = f.readline().strip()
        d._ready.set()
    threading.Thread(target=read, daemon=True).start()
    return d
