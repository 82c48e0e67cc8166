"""The SGLang adapter's side of the bootstrap server's HTTP routes (see :mod:`ferry.sglang` and
:mod:`ferry.sglang.server`): a prefill rank registering itself, a sender registering its room's
DP rank, and :class:`FerryHTTPBootstrap`, which finds a prefill instance's ranks for a decode
through ``GET /route``, as SGLang's receivers do.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Optional, Sequence

from ..client import Client
from .bootstrap import FerryBootstrap
from .server import FerryPrefillInfo

_log = logging.getLogger("ferry")


class BootstrapHTTPError(Exception):
    """An answer of the bootstrap server other than 200: ``status`` (0: no answer) and the
    server's text."""

    def __init__(self, url: str, status: int, text: str) -> None:
        super().__init__(f"{url}: {status or 'no answer'}: {text}")
        self.url, self.status, self.text = url, status, text


def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> Any:
    """One request; the JSON answer (or its text). Raises :class:`BootstrapHTTPError`."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            if "json" in (r.headers.get("Content-Type") or ""):
                return json.loads(text)
            return text
    except urllib.error.HTTPError as e:
        raise BootstrapHTTPError(url, e.code, e.read().decode(errors="replace")) from None
    except (OSError, ValueError) as e:
        raise BootstrapHTTPError(url, 0, str(getattr(e, "reason", e))) from None


def control_address(rank: dict) -> str:
    """``host:port`` of a rank from ``GET /route``'s ``rank_ip`` and ``rank_port``."""
    ip, port = str(rank["rank_ip"]), int(rank["rank_port"])
    return f"[{ip}]:{port}" if ":" in ip and not ip.startswith("[") else f"{ip}:{port}"


def register_rank(bootstrap_addr: str, payload: dict, deadline: float,
                  timeout: float = 5.0) -> None:
    """``PUT /route`` until the server answers 200 or ``deadline`` (monotonic) passes; a 4xx is
    final (the payload is wrong). Raises ``ConnectionError`` naming the URL and the last
    answer."""
    url = f"http://{bootstrap_addr}/route"
    delay = 0.05
    while True:
        try:
            http("PUT", url, payload, timeout)
            return
        except BootstrapHTTPError as e:
            if 400 <= e.status < 500 or time.monotonic() + delay > deadline:
                raise ConnectionError(f"could not register prefill rank with the bootstrap "
                                      f"server: PUT {e}") from None
            _log.info("ferry: bootstrap server not there yet (PUT %s); again in %.2f s", e,
                      delay)
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def register_dp_rank(bootstrap_addr: str, room: int, dp_rank: int,
                     timeout: float = 5.0) -> Optional[str]:
    """``POST /register_dp_rank``; None, or why it failed."""
    try:
        http("POST", f"http://{bootstrap_addr}/register_dp_rank",
             {"bootstrap_room": int(room), "dp_rank": int(dp_rank)}, timeout)
        return None
    except BootstrapHTTPError as e:
        return str(e)


def query_prefill_dp_ranks(bootstrap_addr: str, bootstrap_rooms: Sequence[int],
                           timeout: float = 5.0) -> dict[str, int]:
    """SGLang's ``query_prefill_dp_ranks``: ``{str(room): dp_rank}`` for the rooms whose
    prefill registered their DP rank; ``{}`` when the server cannot be asked."""
    try:
        got = http("POST", f"http://{bootstrap_addr}/query_dp_ranks",
                   {"bootstrap_rooms": [int(r) for r in bootstrap_rooms]}, timeout)
    except BootstrapHTTPError as e:
        _log.error("ferry: querying prefill DP ranks failed: %s", e)
        return {}
    return {str(k): int(v) for k, v in got.items()} if isinstance(got, dict) else {}


class FerryHTTPBootstrap(FerryBootstrap):
    """The prefill ranks from SGLang's bootstrap server at the request's ``bootstrap_addr``
    (:class:`~ferry.sglang.server.FerryKVBootstrapServer`, where each prefill manager
    registered its ferryd's control address): what a decode manager uses when constructed as
    SGLang constructs it.

    :meth:`parallel_info` is ``GET /route`` with every rank -1 (None until every rank has
    registered); :meth:`prefill_peers` then asks ``GET /route`` for each TP and PP rank of the
    request's DP group (CP rank 0) and keeps the answer per (address, DP rank) until
    :meth:`forget_ranks`. With ``discover=True`` the first address answered is used as a seed
    for ferryd's ``discover`` instead (:class:`FerryBootstrap`). ``timeout`` bounds each HTTP
    request (SGLang's is 5 s)."""

    def __init__(self, *, timeout: float = 5.0, discover: bool = False,
                 discover_ttl: float = 30.0) -> None:
        super().__init__(self._from_server, discover=discover, discover_ttl=discover_ttl)
        self.timeout = timeout
        self._infos: dict[str, FerryPrefillInfo] = {}
        self._rank_cache: dict[tuple[str, int], list[str]] = {}
        self._http_lock = threading.Lock()

    def parallel_info(self, bootstrap_addr: str, client: Optional[Client] = None,
                      prefill_dp_rank: int = 0) -> Optional[FerryPrefillInfo]:
        """The instance's parallel info, None while not every rank registered (or the server
        does not answer: logged)."""
        with self._http_lock:
            hit = self._infos.get(bootstrap_addr)
        if hit is not None:
            return hit
        url = (f"http://{bootstrap_addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
               f"&target_tp_rank=-1&target_pp_rank=-1")
        try:
            info = FerryPrefillInfo.from_json(http("GET", url, timeout=self.timeout))
        except BootstrapHTTPError as e:
            (_log.info if e.status == 503 else _log.warning)(
                "ferry: prefill parallel info not available: GET %s", e)
            return None
        with self._http_lock:
            self._infos[bootstrap_addr] = info
        return info

    def _from_server(self, bootstrap_addr: str, prefill_dp_rank: int) -> list[str]:
        key = (bootstrap_addr, prefill_dp_rank)
        with self._http_lock:
            hit = self._rank_cache.get(key)
        if hit is not None:
            return list(hit)
        info = self.parallel_info(bootstrap_addr)
        if info is None:
            raise LookupError(f"the bootstrap server at {bootstrap_addr} has no complete "
                              f"prefill instance (not every rank registered, or no answer)")
        if not 0 <= prefill_dp_rank < info.dp_size:
            raise LookupError(f"prefill_dp_rank {prefill_dp_rank} is not below the instance's "
                              f"dp_size {info.dp_size}")
        peers = []
        for tp in range(info.attn_tp_size):
            for pp in range(info.pp_size):
                url = (f"http://{bootstrap_addr}/route?prefill_dp_rank={prefill_dp_rank}"
                       f"&prefill_cp_rank=0&target_tp_rank={tp}&target_pp_rank={pp}")
                try:
                    peers.append(control_address(http("GET", url, timeout=self.timeout)))
                except (BootstrapHTTPError, KeyError, TypeError, ValueError) as e:
                    raise LookupError(f"GET {url}: {e}") from None
        with self._http_lock:
            self._rank_cache[key] = peers
        return list(peers)

    def forget_ranks(self, bootstrap_addr: str) -> None:
        """Drop what was learned about ``bootstrap_addr`` (asked again at next use)."""
        super().forget_ranks(bootstrap_addr)
        with self._http_lock:
            self._infos.pop(bootstrap_addr, None)
            for key in [k for k in self._rank_cache if k[0] == bootstrap_addr]:
                del self._rank_cache[key]


__all__ = ["BootstrapHTTPError", "FerryHTTPBootstrap", "query_prefill_dp_ranks",
           "register_dp_rank", "register_rank"]
