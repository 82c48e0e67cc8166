"""The SGLang adapter's bootstrap (see :mod:`ferry.sglang`): where a decode rank learns the
control addresses of a prefill instance's ranks, and whether they are ready, in place of
SGLang's bootstrap server. A table or a callable names the ranks, or ferryd's ``discover``
finds them from one seed address per instance.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence, Union

from ..client import Client
from ..errors import FerryError
from .server import FerryPrefillInfo

PrefillRanks = Union[Mapping[str, Sequence[str]], Callable[[str, int], Sequence[str]]]


class FerryBootstrap:
    """Where a decode rank learns about a prefill instance, in place of SGLang's bootstrap
    server.

    ``prefill_ranks``: a dict from a bootstrap address (what SGLang's requests carry as
    ``bootstrap_host:bootstrap_port``) to the ``"host:port"`` control addresses of every rank of
    that prefill instance's ferryds, or a callable ``(bootstrap_addr, prefill_dp_rank) ->
    addresses``. Naming every rank is fine: ferryd uses the ranks the geometry needs.

    With ``discover=True`` the addresses given are seeds instead: the decode's ferryd is asked
    (protocol v4 ``discover``) for every rank of the instance behind the first seed that
    answers, as the prefill daemons' ``discovery.instance_ranks`` list them, and the ranks that
    are up in the request's attention DP group (``prefill_dp_rank``; the ranks' ``dp.rank``) are
    named. Answers are kept ``discover_ttl`` seconds per bootstrap address.

    ``ready``: where prefill ranks say their memory is registered (SGLang's
    ``register_to_bootstrap``), any mutable mapping both sides reach (a dict when both run in
    one process, a ``multiprocessing.Manager`` dict, a key-value store), keyed by the rank's
    control address. With it, a decode's
    :meth:`FerryKVManager.try_ensure_parallel_info` answers False until every named rank is
    there, as SGLang's decode waits for a prefill to register with its bootstrap server (a
    prepare reaching a ferryd whose engine has not lent its memory yet fails with
    ``peer_unreachable``). Without it readiness is not tracked. Discovery needs no store: a rank
    whose memory is not registered refuses the handshake and is reported down.

    ``dp_size`` and ``follow_bootstrap_room``: what :meth:`parallel_info` says of an instance
    given by a table (SGLang's scheduler picks a request's prefill DP rank from them); with
    discovery, the DP size the ranks report."""

    def __init__(self, prefill_ranks: PrefillRanks, *, discover: bool = False,
                 discover_ttl: float = 30.0,
                 ready: Optional[MutableMapping[str, Any]] = None, dp_size: int = 1,
                 follow_bootstrap_room: bool = True) -> None:
        self._ranks = prefill_ranks
        self._ready = ready
        self.discover = discover
        self.discover_ttl = discover_ttl
        self.dp_size = dp_size
        self.follow_bootstrap_room = follow_bootstrap_room
        self._discovered: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._shapes: dict[str, FerryPrefillInfo] = {}  # what discovery reported
        self._lock = threading.Lock()

    def parallel_info(self, bootstrap_addr: str, client: Optional[Client] = None,
                      prefill_dp_rank: int = 0) -> Optional[FerryPrefillInfo]:
        """The instance's parallel info (SGLang's ``PrefillServerInfo``) once it takes
        prepares: every named rank ready (when tracked), or, with discovery, a rank up; None
        before. An address that names no rank raises ``LookupError`` (without discovery)."""
        try:
            peers = self.prefill_peers(bootstrap_addr, prefill_dp_rank, client)
        except LookupError:
            if self.discover:
                return None  # no rank up yet: asked again on the next call
            raise
        if self.unready(peers):
            return None
        with self._lock:
            shape = self._shapes.get(bootstrap_addr)
        if shape is not None:
            return dataclasses.replace(shape, follow_bootstrap_room=self.follow_bootstrap_room)
        return FerryPrefillInfo(dp_size=self.dp_size,
                                follow_bootstrap_room=self.follow_bootstrap_room)

    def prefill_peers(self, bootstrap_addr: str, prefill_dp_rank: int = 0,
                      client: Optional[Client] = None) -> list[str]:
        """The control addresses of the prefill instance at ``bootstrap_addr``; raises
        ``LookupError`` naming the address when there are none. ``client`` (the asking rank's)
        serves discovery."""
        seeds = self._given(bootstrap_addr, prefill_dp_rank)
        if not self.discover:
            return seeds
        key = (bootstrap_addr, prefill_dp_rank)
        with self._lock:
            hit = self._discovered.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.discover_ttl:
            return list(hit[1])
        if client is None:
            raise LookupError("discovery needs the asking rank's ferry client")
        why: list[str] = []
        for seed in seeds:
            try:
                ranks = client.discover(seed)
            except FerryError as e:
                why.append(f"{seed}: {e.message}")
                continue
            alive = [r for r in ranks if r.up]
            if alive:
                with self._lock:
                    self._shapes[bootstrap_addr] = FerryPrefillInfo(
                        attn_tp_size=max(1, alive[0].tp_size), dp_size=max(1, alive[0].dp_size),
                        pp_size=max(1, alive[0].pp_size))
            # With attention DP a room's KV lives in one group: name that group's ranks only.
            up = [r.address for r in alive if r.dp_rank == prefill_dp_rank]
            if up:
                with self._lock:
                    self._discovered[key] = (time.monotonic(), up)
                return up
            if alive:
                groups = sorted({f"{r.dp_rank} of {r.dp_size}" for r in alive})
                why.append(f"{seed}: no rank up in DP group {prefill_dp_rank} (up: DP "
                           f"{', '.join(groups)})")
                continue
            why.append("; ".join(f"{r.address}: {r.reason}" for r in ranks) or f"{seed}: no ranks")
        raise LookupError(f"no prefill rank of bootstrap_addr {bootstrap_addr} is up ("
                          f"{'; '.join(why)})")

    def mark_ready(self, control: str) -> None:
        """A prefill rank (its ferryd's control address) has lent its memory and takes
        prepares."""
        if self._ready is not None:
            self._ready[control] = True

    def unready(self, peers: Sequence[str]) -> list[str]:
        """Those of ``peers`` that have not said they are ready (none when not tracked)."""
        if self._ready is None:
            return []
        return [p for p in peers if p not in self._ready]

    def forget_ranks(self, bootstrap_addr: str) -> None:
        """Drop what discovery learned about ``bootstrap_addr`` (asked again at next use)."""
        with self._lock:
            for key in [k for k in self._discovered if k[0] == bootstrap_addr]:
                del self._discovered[key]
            self._shapes.pop(bootstrap_addr, None)

    def _given(self, bootstrap_addr: str, prefill_dp_rank: int) -> list[str]:
        found: Union[Sequence[str], str, None]
        if callable(self._ranks):
            found = self._ranks(bootstrap_addr, prefill_dp_rank)
        else:
            found = self._ranks.get(bootstrap_addr)
        peers = [found] if isinstance(found, str) else list(found or [])
        if not peers:
            raise LookupError(f"no prefill ranks are known for bootstrap_addr {bootstrap_addr}")
        return peers


__all__ = ["FerryBootstrap", "PrefillRanks"]
