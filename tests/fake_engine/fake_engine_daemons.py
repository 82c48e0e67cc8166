"""The fake engine's daemons (tests/fake_engine/fake_engine.py): this run's configs, rewritten from
configs/*.yaml with pools left to the registration (``memory: client`` and nothing else) and
their own names, sockets and ports, and
one ferryd started from each (checked with ``--check-config``, ready on ``--ready-fd``) and
stopped cleanly. Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REGISTERED_POOLS = ["pools:", "  kv: {memory: client}", "  mamba: {memory: client}",
                    "  aux: {memory: client}"]
BOOTSTRAPPING_MS = 10000


def rewrite_config(text: str, *, name: str, control: str, sock: str, tp: tuple[int, int] = (1, 0),
                   instance_ranks: Optional[list[str]] = None, provider: str = "tcp") -> str:
    """configs/*.yaml with this run's name, addresses and TP position, its pools section
    replaced by pools the registration describes (``memory: client`` and nothing else: the
    engine's tensors are the layout), and ``timeouts.bootstrapping_ms`` shortened to
    BOOTSTRAPPING_MS: a room whose decode aborted before its prepare times out there, as in
    SGLang, and the run should not wait 30 s for it. ``provider``: the fabric provider."""
    size, rank = tp
    out = []
    in_pools = False
    for line in text.splitlines():
        s = line.strip()
        if in_pools and line and not line[0].isspace() and not line.startswith("#"):
            in_pools = False
        if in_pools:
            continue
        if line.startswith("pools:"):
            in_pools = True
            out.extend(REGISTERED_POOLS)
            continue
        if s.startswith("name:") and line.startswith("  name:"):
            line = f"  name: {name}"
        elif s.startswith("control:"):
            line = f"  control: {control}"
        elif s.startswith("client:"):
            line = f"  client: {sock}"
        elif line.startswith("  size:"):
            line = f"  size: {size}"
        elif line.startswith("  rank:"):
            line = f"  rank: {rank}"
        elif s.startswith("provider:"):
            line = f"  provider: {provider}"
        elif s.startswith("bootstrapping_ms:"):
            line = f"  bootstrapping_ms: {BOOTSTRAPPING_MS}"
        out.append(line)
    if instance_ranks:
        out.append("discovery:")
        out.append(f"  instance_ranks: [{', '.join(instance_ranks)}]")
    return "\n".join(out) + "\n"


class Daemon:
    """A ferryd started from ``config_text`` (checked with ``--check-config`` first). With
    ``wait=False`` the constructor only launches it and wait_ready() waits, so that several
    daemons start at once (most of a start is libfabric probing the machine)."""

    def __init__(self, bin_dir: Path, work: str, name: str, config_text: str, control: str,
                 sock: str, wait: bool = True) -> None:
        self.name, self.control, self.sock = name, control, sock
        self.config = os.path.join(work, name + ".yaml")
        self.log = os.path.join(work, name + ".log")
        with open(self.config, "w") as f:
            f.write(config_text)
        chk = subprocess.run([str(bin_dir / "ferryd"), "--check-config", self.config],
                             capture_output=True, text=True, timeout=30)
        if chk.returncode != 0:
            raise RuntimeError(f"{name}: ferryd --check-config refused {self.config}: "
                               f"{chk.stderr.strip() or chk.stdout.strip()}")
        self._ready_r, w = os.pipe()
        with open(self.log, "w") as lf:
            self.proc = subprocess.Popen([str(bin_dir / "ferryd"), "--config", self.config,
                                          "--ready-fd", str(w)], pass_fds=(w,), stdout=lf,
                                         stderr=lf)
        os.close(w)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait (30 s at most) for the daemon's 'ready' line; raise with its log otherwise."""
        r = self._ready_r
        line = b""
        deadline = time.monotonic() + 30
        try:
            while not line.endswith(b"\n") and time.monotonic() < deadline:
                ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                chunk = os.read(r, 64)
                if not chunk:
                    break
                line += chunk
        finally:
            os.close(r)
        if line.strip() != b"ready":
            self.proc.kill()
            self.proc.wait(timeout=15)
            raise RuntimeError(f"{self.name} did not start; its log:\n"
                               f"{open(self.log).read()[-3000:]}")

    def ferryctl(self, bin_dir: Path, command: str) -> dict[str, Any]:
        """``ferryctl --json COMMAND`` against this daemon: its document (docs/protocol.md,
        "Info documents")."""
        out = subprocess.run([str(bin_dir / "ferryctl"), "-s", self.sock, "--json", command],
                             capture_output=True, text=True, timeout=30)
        doc = json.loads(out.stdout)
        if out.returncode != 0 or "error" in doc:
            raise RuntimeError(f"ferryctl {command} on {self.name} failed: {out.stdout}"
                               f"{out.stderr}")
        return doc

    def stop(self) -> str:
        """SIGTERM and wait (bounded); '' when it exited 0 and its log ends with 'stopped'."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
            return f"{self.name} did not exit within 20 s of SIGTERM (killed)"
        lines = open(self.log).read().strip().splitlines()
        if rc != 0:
            return f"{self.name} exited {rc}; log tail: {lines[-3:]}"
        if not lines or not lines[-1].endswith("[ferryd] stopped"):
            return f"{self.name}'s log does not end with 'stopped': {lines[-3:]}"
        return ""
