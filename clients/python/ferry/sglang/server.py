"""The SGLang adapter's bootstrap server (see :mod:`ferry.sglang`): SGLang's
``KVBootstrapServer(host=, port=)``, the HTTP service a prefill instance runs beside its ranks,
with SGLang's routes and JSON, on the standard library's threaded HTTP server.

A prefill rank registers itself with ``PUT /route`` (its ferryd's control address as
``rank_ip``/``rank_port``, its attention TP/CP/DP and PP position and sizes); a decode asks
``GET /route`` for the instance's parallel info (all four ranks -1) and for the address of one
rank; ``POST /register_dp_rank`` and ``POST /query_dp_ranks`` keep the room -> prefill DP rank
map SGLang uses when rooms do not pick their DP group themselves; ``GET /health`` answers OK.
A request that is not understood is answered 4xx with a text naming what was wrong.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

_log = logging.getLogger("ferry")

ROUTES = "PUT/GET /route, POST /register_dp_rank, POST /query_dp_ranks, GET /health"
RANK_QUERY = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")


@dataclass
class FerryPrefillInfo:
    """SGLang's ``PrefillServerInfo``: a prefill instance's parallel info, as ``GET /route``
    answers it and as a decode manager keeps it in ``prefill_info_table[bootstrap_addr]``
    (SGLang's scheduler reads ``dp_size`` and ``follow_bootstrap_room``)."""

    attn_tp_size: int = 1
    attn_cp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    page_size: Optional[int] = None
    kv_cache_dtype: Optional[str] = None
    follow_bootstrap_room: bool = True
    enable_dsa_cache_layer_split: bool = False
    prefill_http_port: Optional[int] = None

    @classmethod
    def from_json(cls, data: Any) -> FerryPrefillInfo:
        """From ``GET /route``'s answer (unknown fields are ignored; a missing size is 1)."""
        if not isinstance(data, dict):
            raise ValueError(f"the parallel info is not a JSON object: {data!r}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        info = cls(**known)
        for k in ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size"):
            setattr(info, k, int(getattr(info, k)))
        return info


class BadRequest(Exception):
    """A request the server refuses: its status (4xx/5xx) and the text naming why."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def _int(data: dict, key: str, where: str, default: Any = None, low: int = 0) -> Any:
    """``data[key]`` as an int >= ``low`` (``default`` when absent and not None)."""
    if key not in data or data[key] is None:
        if default is None:
            raise BadRequest(400, f"{where}: missing field {key}")
        return default
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise BadRequest(400, f"{where}: {key} must be an integer, got {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise BadRequest(400, f"{where}: {key} must be an integer, got {v!r}") from None
    if n < low:
        raise BadRequest(400, f"{where}: {key} must be at least {low}, got {n}")
    return n


class FerryKVBootstrapServer:
    """SGLang's bootstrap server for a Ferry prefill instance, constructed as SGLang does:
    ``FerryKVBootstrapServer(host=server_args.host,
    port=server_args.disaggregation_bootstrap_port)``.
    It serves at once from a daemon thread (``port=0`` picks a free port: :attr:`port` says
    which) until :meth:`close`.

    The instance is ready (``GET /route`` answers the parallel info, and ranks) once
    dp x cp x tp x pp distinct ranks have registered; the sizes are fixed by the first rank that
    registers, and a rank naming other sizes is refused (409). A rank registering again (its
    engine or ferryd restarted) replaces its entry. Room -> DP rank entries are forgotten
    ``entry_ttl`` seconds after they were registered (SGLang's
    ``SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL``, 120 s)."""

    def __init__(self, host: str, port: int, *, entry_ttl: float = 120.0) -> None:
        self.host = host
        self.entry_ttl = entry_ttl
        self.lock = threading.Lock()
        self.info: Optional[FerryPrefillInfo] = None  # set by the first registration
        self.ranks: dict[tuple[int, int, int, int], dict[str, Any]] = {}  # (dp, cp, tp, pp)
        self.room_to_dp_rank: dict[int, tuple[int, float]] = {}  # room -> (dp rank, when)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._serve("GET")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def _serve(self, method: str) -> None:
                try:
                    status, body = server._handle(method, self.path, self._body())
                except BadRequest as e:
                    status, body = e.status, e.text
                except Exception as e:  # a bug: say so rather than drop the connection
                    _log.exception("ferry bootstrap server: %s %s", method, self.path)
                    status, body = 500, f"internal error: {e}"
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8"
                                 if isinstance(body, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n > 0 else b""

            def log_message(self, fmt: str, *args: Any) -> None:
                _log.debug("ferry bootstrap server: " + fmt, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,),
                                       daemon=True, name=f"ferry-bootstrap-{self.port}")
        self.thread.start()
        _log.info("ferry: bootstrap server on %s:%d", host, self.port)

    @property
    def address(self) -> str:
        """``host:port`` as a decode reaches it (a wildcard host as loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def poll(self) -> None:
        """SGLang's base class declares it; nothing to report."""

    def __enter__(self) -> FerryKVBootstrapServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the routes ------------------------------------------------------------------------------

    def _handle(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        url = urlsplit(target)
        route = {"/route": {"PUT": self._put_route, "GET": self._get_route},
                 "/register_dp_rank": {"POST": self._register_dp_rank},
                 "/query_dp_ranks": {"POST": self._query_dp_ranks},
                 "/health": {"GET": lambda q, b: (200, "OK")}}.get(url.path)
        if route is None:
            raise BadRequest(404, f"no route {url.path}: this server serves {ROUTES}")
        if method not in route:
            raise BadRequest(405, f"{method} {url.path} is not served: use "
                                  f"{' or '.join(route)}")
        return route[method](url.query, body)

    @staticmethod
    def _json(body: bytes, where: str) -> dict:
        try:
            data = json.loads(body or b"null")
        except ValueError as e:
            raise BadRequest(400, f"{where}: the body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise BadRequest(400, f"{where}: the body must be a JSON object, got {data!r}")
        return data

    def _put_route(self, query: str, body: bytes) -> tuple[int, Any]:
        """A prefill rank registers (SGLang's ``register_to_bootstrap`` payload)."""
        where = "PUT /route"
        d = self._json(body, where)
        tp_size = _int(d, "attn_tp_size", where, low=1)
        cp_size = _int(d, "attn_cp_size", where, 1, low=1)
        attn_dp_size = _int(d, "attn_dp_size", where, 1, low=1)
        system_dp_size = _int(d, "system_dp_size", where, 1, low=1)
        pp_size = _int(d, "pp_size", where, low=1)
        dp_size = attn_dp_size if system_dp_size == 1 else system_dp_size
        pos = {"attn_tp_rank": (_int(d, "attn_tp_rank", where), tp_size, "attn_tp_size"),
               "attn_cp_rank": (_int(d, "attn_cp_rank", where, 0), cp_size, "attn_cp_size"),
               "attn_dp_rank": (_int(d, "attn_dp_rank", where, 0), attn_dp_size, "attn_dp_size"),
               "system_dp_rank": (_int(d, "system_dp_rank", where, 0), system_dp_size,
                                  "system_dp_size"),
               "pp_rank": (_int(d, "pp_rank", where), pp_size, "pp_size")}
        for name, (rank, size, size_key) in pos.items():
            if rank >= size:
                raise BadRequest(400, f"{where}: {name} {rank} is not below {size_key} {size}")
        ip = d.get("rank_ip")
        if not isinstance(ip, str) or not ip.strip():
            raise BadRequest(400, f"{where}: rank_ip must be the rank's host (its ferryd's "
                                  f"control address), got {ip!r}")
        port = _int(d, "rank_port", where, low=1)
        if port > 65535:
            raise BadRequest(400, f"{where}: rank_port {port} is not a port")
        page_size = _int(d, "page_size", where, -1, low=-1)
        http_port = _int(d, "prefill_http_port", where, -1, low=-1)
        lb = d.get("load_balance_method") or "follow_bootstrap_room"
        dtype = d.get("kv_cache_dtype")
        info = FerryPrefillInfo(tp_size, cp_size, dp_size, pp_size,
                                None if page_size < 0 else page_size,
                                None if dtype is None else str(dtype),
                                lb == "follow_bootstrap_room",
                                bool(d.get("enable_dsa_cache_layer_split", False)),
                                None if http_port < 0 else http_port)
        dp_group = pos["attn_dp_rank"][0] if system_dp_size == 1 else pos["system_dp_rank"][0]
        key = (dp_group, pos["attn_cp_rank"][0], pos["attn_tp_rank"][0], pos["pp_rank"][0])
        with self.lock:
            if self.info is None:
                self.info = info
            else:
                for f in ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size"):
                    have, got = getattr(self.info, f), getattr(info, f)
                    if have != got and got is not None:
                        raise BadRequest(409, f"{where}: {f} {got} differs from the {have} the "
                                              f"instance's first rank registered")
            self.ranks[key] = {"rank_ip": ip.strip(), "rank_port": port}
            n, want = len(self.ranks), self._expected()
        _log.info("ferry bootstrap server: prefill DP %d CP %d TP %d PP %d at %s:%d (%d of %d "
                  "registered)", *key, ip, port, n, want)
        return 200, "OK"

    def _expected(self) -> int:
        i = self.info
        return 0 if i is None else i.dp_size * i.attn_cp_size * i.attn_tp_size * i.pp_size

    def _not_ready(self) -> Optional[str]:
        if self.info is None:
            return "prefill instance not registered yet: no rank has registered"
        n, want = len(self.ranks), self._expected()
        if n < want:
            i = self.info
            return (f"prefill instance not fully registered yet: {n} of {want} ranks (dp "
                    f"{i.dp_size} x cp {i.attn_cp_size} x tp {i.attn_tp_size} x pp {i.pp_size})")
        return None

    def _get_route(self, query: str, body: bytes) -> tuple[int, Any]:
        """The parallel info (every rank -1) or one rank's address."""
        where = "GET /route"
        q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        missing = [k for k in RANK_QUERY if not q.get(k)]
        if missing:
            raise BadRequest(400, f"{where}: missing query parameter(s) {', '.join(missing)} "
                                  f"(all four -1 ask for the parallel info)")
        ranks = [_int(q, k, where, low=-1) for k in RANK_QUERY]
        with self.lock:
            not_ready = self._not_ready()
            if all(r == -1 for r in ranks):
                if not_ready:
                    raise BadRequest(503, not_ready)
                assert self.info is not None
                return 200, asdict(self.info)
            if any(r == -1 for r in ranks):
                given = ", ".join(f"{k}={r}" for k, r in zip(RANK_QUERY, ranks))
                raise BadRequest(400, f"{where}: {given}: either all four are -1 (the "
                                      f"parallel info) or none is")
            if not_ready:
                raise BadRequest(503, not_ready)
            found = self.ranks.get((ranks[0], ranks[1], ranks[2], ranks[3]))
        if found is None:
            raise BadRequest(404, f"{where}: no prefill rank dp_rank={ranks[0]} "
                                  f"cp_rank={ranks[1]} tp_rank={ranks[2]} pp_rank={ranks[3]} "
                                  f"is registered")
        return 200, dict(found)

    def _register_dp_rank(self, query: str, body: bytes) -> tuple[int, Any]:
        where = "POST /register_dp_rank"
        d = self._json(body, where)
        room, dp = _int(d, "bootstrap_room", where), _int(d, "dp_rank", where)
        now = time.monotonic()
        with self.lock:
            if self.info is not None and dp >= self.info.dp_size:
                raise BadRequest(400, f"{where}: dp_rank {dp} is not below the instance's "
                                      f"dp_size {self.info.dp_size}")
            self.room_to_dp_rank[room] = (dp, now)
            for r in [r for r, (_, t) in self.room_to_dp_rank.items()
                      if now - t > self.entry_ttl]:
                del self.room_to_dp_rank[r]
        return 200, "OK"

    def _query_dp_ranks(self, query: str, body: bytes) -> tuple[int, Any]:
        where = "POST /query_dp_ranks"
        d = self._json(body, where)
        rooms = d.get("bootstrap_rooms")
        if not isinstance(rooms, list):
            raise BadRequest(400, f"{where}: bootstrap_rooms must be a list of room ids, got "
                                  f"{rooms!r}")
        ids = [_int({"bootstrap_rooms[]": r}, "bootstrap_rooms[]", where) for r in rooms]
        now = time.monotonic()
        with self.lock:
            return 200, {str(r): self.room_to_dp_rank[r][0] for r in ids
                         if r in self.room_to_dp_rank
                         and now - self.room_to_dp_rank[r][1] <= self.entry_ttl}


__all__ = ["FerryKVBootstrapServer", "FerryPrefillInfo"]
