"""What both engines of the fake engine (tests/fake_engine/fake_engine.py) share: one engine rank's memory
and adapter manager, built as SGLang builds them (:class:`Rank`), how a TP rank slices the full
shapes (:class:`Geometry`), the adapter-call latency record (:class:`Calls`), and the progress
log.

Importing it puts this tree's clients/python first on ``sys.path``: the fake engine runs the
client it is checked out with, not an installed copy.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from hmac import compare_digest
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python"))

from ferry.sglang import KVManager  # noqa: E402

IO_TIMEOUT = 30.0
GiB = float(1 << 30)
T0 = time.monotonic()


def log(who: str, msg: str) -> None:
    print(f"{time.monotonic() - T0:6.1f}s [{who}] {msg}", flush=True)


def server_args(bootstrap_port: int) -> SimpleNamespace:
    """The ServerArgs fields the adapter reads, with SGLang's defaults."""
    return SimpleNamespace(host="127.0.0.1", port=30000,
                           disaggregation_bootstrap_port=bootstrap_port, dist_init_addr=None,
                           dp_size=1, enable_dp_attention=False, kv_cache_dtype="auto",
                           load_balance_method="follow_bootstrap_room")


def ferry_env(socket_template: str) -> None:
    """The FERRY_* settings SGLang's process would carry (this engine process only)."""
    for k in [k for k in os.environ if k.startswith("FERRY_") and k != "FERRY_BIN_DIR"]:
        del os.environ[k]
    os.environ.update(FERRY_SOCKET=socket_template, FERRY_TIMEOUT=str(IO_TIMEOUT),
                      FERRY_REGISTER_TIMEOUT="60", FERRY_DRAIN_TIMEOUT="10")


_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_memcmp.restype = ctypes.c_int


def same(got: Any, want: Any) -> bool:
    """Whether two buffers hold the same bytes: libc's memcmp when both are writable buffers
    (the engine's memory, the pattern block), else a C loop over both (``==`` on memoryviews
    compares item by item: on 40 GiB that alone would take a core from the daemons)."""
    if len(got) != len(want):
        return False
    try:
        a = ctypes.addressof(ctypes.c_char.from_buffer(got))
        b = ctypes.addressof(ctypes.c_char.from_buffer(want))
    except (TypeError, ValueError):
        return compare_digest(got, want)
    return _memcmp(a, b, len(got)) == 0


class Calls:
    """Every adapter call's duration, by kind (the script's report: p50, p99, max)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def __call__(self, kind: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            self.times.setdefault(kind, []).append(time.perf_counter() - t)


class Rank:
    """One engine rank: its memory (fake_engine_memory.RankMemory) and its manager,
    ``KVManager(kv_args, mode, server_args, is_mla_backend)`` with FERRY_* from the
    environment (FERRY_SOCKET names this rank's ferryd by mode and TP rank)."""

    def __init__(self, mem: Any, mode: str, sargs: SimpleNamespace) -> None:
        self.mem, self.mode = mem, mode
        self.mgr = KVManager(mem.kv_args(), mode, sargs, False)
        assert self.mgr.registered == ["kv", "state", "aux"], self.mgr.registered
        assert self.mgr.page_size == mem.m.page, (self.mgr.page_size, mem.m.page)

    def active_rooms(self) -> int:
        return int(self.mgr.client.info("status")[self.mode]["active"])

    def close(self) -> None:
        self.mgr.close()
        self.mem.close()


class Geometry:
    """The full (TP 1) shapes and how a rank of ``tp`` slices them (docs/geometry.md §1)."""

    # per state tensor: (full shape, dtype bytes, slice_axis, shard_groups)
    TENSORS = [((8192, 3), 2, 0, (2048, 2048, 4096)), ((32, 128, 128), 4, 0, (32,))]

    def __init__(self, m: Any) -> None:
        self.m = m
        self.token_bytes = m.kv_heads * m.head_dim * 2
        self.page_bytes = self.token_bytes * m.page  # a full page of one K or V buffer
        self.layers = len(getattr(m, "mamba_layers", ()))  # the SWA phase's model has none

    def kv_slice(self, full: Any, tp: int, rank: int) -> Any:
        """Rank ``rank`` of ``tp``'s bytes of full pages (its heads of every token)."""
        if tp == 1:
            return full
        tb = self.token_bytes
        hb = tb // tp
        return bytearray(b"".join(full[t * tb + rank * hb:t * tb + (rank + 1) * hb]
                                  for t in range(len(full) // tb)))

    def state_parts(self, t: int, tp: int, rank: int) -> list[tuple[int, int]]:
        """(offset in the full slot item, length) of what ``rank`` holds, in its slot order."""
        shape, dt, axis, groups = self.TENSORS[t]
        outer = 1
        for d in shape[:axis]:
            outer *= d
        unit = dt
        for d in shape[axis + 1:]:
            unit *= d
        full = shape[axis]
        parts = []
        for o in range(outer):
            off = 0
            for g in groups:
                parts.append(((o * full + off + rank * g // tp) * unit, g // tp * unit))
                off += g
        return parts

    def state_full_bytes(self, e: int) -> int:
        shape, dt, _, _ = self.TENSORS[e // self.layers]
        n = dt
        for d in shape:
            n *= d
        return n

    def state_slice(self, full: Any, e: int, tp: int, rank: int) -> Any:
        if tp == 1:
            return full
        return bytearray(b"".join(full[off:off + n]
                                  for off, n in self.state_parts(e // self.layers, tp, rank)))
