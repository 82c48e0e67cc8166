"""What both engines of the fake engine (scripts/fake_engine.py) share: one engine rank's memory
and adapter manager (:class:`Rank`), the model's shapes and how a TP rank slices them
(:class:`Geometry`), the bootstrap address, and the progress log.

Importing it puts this tree's clients/python first on ``sys.path``: the fake engine runs the
client it is checked out with, not an installed copy.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))

from ferry import Client  # noqa: E402
from ferry.memory import MemfdPool  # noqa: E402
from ferry.sglang import FerryBootstrap, FerryKVArgs, FerryKVManager  # noqa: E402

BOOT = "fake-prefill:8998"
IO_TIMEOUT = 30.0
GiB = float(1 << 30)
T0 = time.monotonic()


def log(who: str, msg: str) -> None:
    print(f"{time.monotonic() - T0:6.1f}s [{who}] {msg}", flush=True)


class Rank:
    """One engine rank's memory (MemfdPools as its ferryd lays them out) and manager."""

    def __init__(self, sock: str, mode: str, bootstrap: FerryBootstrap, tag: str) -> None:
        with Client(sock, name=f"{tag}-layout", timeout=IO_TIMEOUT) as c:
            pools = dict(c.pools)
        self.kv = MemfdPool("kv", pools["kv"], name=f"{tag}-kv")
        self.state = MemfdPool("state", pools["state"], name=f"{tag}-state")
        self.aux = MemfdPool("aux", pools["aux"], name=f"{tag}-aux")
        args = FerryKVArgs.from_memfd_pools(kv=self.kv, state=self.state, aux=self.aux)
        self.mgr = FerryKVManager(args, mode, socket_path=sock, bootstrap=bootstrap,
                                  name=tag, timeout=IO_TIMEOUT, drain_timeout=10.0)
        assert self.mgr.registered == ["kv", "state", "aux"], self.mgr.registered
        self.page_tokens = self.mgr.page_size

    def active_rooms(self, side: str) -> int:
        return int(self.mgr.client.info("status")[side]["active"])

    def close(self) -> None:
        self.mgr.close()
        for p in (self.kv, self.state, self.aux):
            p.close()


class Geometry:
    """The full (decode TP 1) shapes from configs/decode.yaml and how a prefill rank of
    ``tp`` slices them (docs/geometry.md section 1)."""

    KV_HEADS, HEAD_DIM, DTYPE = 2, 256, 2
    # per state tensor: (full shape, dtype bytes, slice_axis, shard_groups)
    TENSORS = [((8192, 3), 2, 0, (2048, 2048, 4096)), ((32, 128, 128), 4, 0, (32,))]

    def __init__(self, tp: int, page_tokens: int) -> None:
        self.tp, self.page_tokens = tp, page_tokens
        self.token_bytes = self.KV_HEADS * self.HEAD_DIM * self.DTYPE
        self.page_bytes = page_tokens * self.token_bytes
        self.head_bytes = self.token_bytes // tp  # per rank and token (heads not replicated)

    def state_parts(self, t: int, rank: int) -> list[tuple[int, int]]:
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
                parts.append(((o * full + off + rank * g // self.tp) * unit,
                              g // self.tp * unit))
                off += g
        return parts

    def state_full_bytes(self, t: int) -> int:
        shape, dt, _, _ = self.TENSORS[t]
        n = dt
        for d in shape:
            n *= d
        return n

