"""The SGLang adapter's bootstrap server (clients/python/ferry/sglang/server.py) over real HTTP
on 127.0.0.1 with an ephemeral port: SGLang's routes and JSON (a prefill rank's PUT /route, a
decode's GET /route for the parallel info and for one rank, /register_dp_rank,
/query_dp_ranks, /health), readiness once every rank registered, and a clear 4xx naming what
was wrong for each bad request; plus FerryHTTPBootstrap, the decode's side of it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterator, Optional

import pytest

from conftest import IO_TIMEOUT
from ferry.sglang import (FerryHTTPBootstrap, FerryKVReceiver, FerryPrefillInfo, KVBootstrapServer,
                          PrefillServerInfo)
from ferry.sglang.http import query_prefill_dp_ranks

ALL = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


@pytest.fixture
def server() -> Iterator[KVBootstrapServer]:
    s = KVBootstrapServer(host="127.0.0.1", port=0)  # as SGLang constructs it, keywords
    try:
        yield s
    finally:
        s.close()


def call(s: KVBootstrapServer, method: str, path: str, body: Any = None,
         raw: Optional[bytes] = None) -> tuple[int, Any]:
    """One request: (status, JSON answer or text)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{s.port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=IO_TIMEOUT) as r:
            status, ctype, text = r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, text = e.code, e.headers.get("Content-Type", ""), e.read().decode()
    return status, json.loads(text) if "json" in ctype else text


def rank(tp: int, port: int, tp_size: int = 2, **kw: Any) -> dict:
    """SGLang's register_to_bootstrap payload of one prefill rank."""
    d = {"attn_tp_size": tp_size, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0,
         "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
         "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "127.0.0.1", "rank_port": port,
         "page_size": 16, "kv_cache_dtype": "auto", "load_balance_method": "round_robin",
         "enable_dsa_cache_layer_split": False, "prefill_http_port": 30000}
    d.update(kw)
    return d


def test_a_prefill_instance_registers_and_a_decode_reads_it(server: KVBootstrapServer) -> None:
    assert call(server, "GET", "/health") == (200, "OK")
    status, text = call(server, "GET", f"/route?{ALL}")
    assert (status, text) == (503, "prefill instance not registered yet: no rank has "
                                   "registered")
    assert call(server, "PUT", "/route", rank(1, 7402)) == (200, "OK")
    status, text = call(server, "GET", f"/route?{ALL}")
    assert (status, text) == (503, "prefill instance not fully registered yet: 1 of 2 ranks "
                                   "(dp 1 x cp 1 x tp 2 x pp 1)")
    status, text = call(server, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0"
                                       "&target_tp_rank=1&target_pp_rank=0")
    assert status == 503  # a rank is not answered before the instance is complete, as SGLang
    assert call(server, "PUT", "/route", rank(0, 7401)) == (200, "OK")
    assert call(server, "PUT", "/route", rank(0, 7401)) == (200, "OK")  # again: no new rank
    status, info = call(server, "GET", f"/route?{ALL}")
    assert status == 200
    assert info == {"attn_tp_size": 2, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1,
                    "page_size": 16, "kv_cache_dtype": "auto", "follow_bootstrap_room": False,
                    "enable_dsa_cache_layer_split": False, "prefill_http_port": 30000}
    assert PrefillServerInfo is FerryPrefillInfo
    assert FerryPrefillInfo.from_json(info).dp_size == 1
    for tp, port in ((0, 7401), (1, 7402)):
        assert call(server, "GET", f"/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank="
                                   f"{tp}&target_pp_rank=0") == \
            (200, {"rank_ip": "127.0.0.1", "rank_port": port})
    status, text = call(server, "GET", "/route?prefill_dp_rank=1&prefill_cp_rank=0"
                                       "&target_tp_rank=0&target_pp_rank=0")
    assert (status, text) == (404, "GET /route: no prefill rank dp_rank=1 cp_rank=0 tp_rank=0 "
                                   "pp_rank=0 is registered")


def test_rooms_dp_ranks_are_registered_and_queried(server: KVBootstrapServer) -> None:
    for r in (rank(0, 7401, 1, attn_dp_size=2, attn_dp_rank=0),
              rank(0, 7402, 1, attn_dp_size=2, attn_dp_rank=1)):
        assert call(server, "PUT", "/route", r) == (200, "OK")
    assert call(server, "POST", "/register_dp_rank", {"bootstrap_room": 12, "dp_rank": 1}) == \
        (200, "OK")
    assert call(server, "POST", "/register_dp_rank", {"bootstrap_room": 2**63, "dp_rank": 0}) \
        == (200, "OK")
    assert call(server, "POST", "/query_dp_ranks", {"bootstrap_rooms": [12, 13, 2**63]}) == \
        (200, {"12": 1, str(2**63): 0})
    # what SGLang's decode scheduler calls (a static method of its receiver class), and ours
    assert FerryKVReceiver.query_prefill_dp_ranks(server.address, [12, 13]) == {"12": 1}
    assert query_prefill_dp_ranks("127.0.0.1:1", [12]) == {}  # no server: nothing known
    assert call(server, "GET", f"/route?{ALL}")[1]["dp_size"] == 2


def test_room_entries_are_forgotten_after_their_ttl() -> None:
    with KVBootstrapServer("127.0.0.1", 0, entry_ttl=0.0) as s:
        assert call(s, "POST", "/register_dp_rank", {"bootstrap_room": 5, "dp_rank": 0}) == \
            (200, "OK")
        assert call(s, "POST", "/query_dp_ranks", {"bootstrap_rooms": [5]}) == (200, {})


BAD = [
    # (method, path, body, status, the text)
    ("GET", "/nowhere", None, 404, "no route /nowhere: this server serves PUT/GET /route, POST "
                                   "/register_dp_rank, POST /query_dp_ranks, GET /health"),
    ("POST", "/route", {}, 405, "POST /route is not served: use PUT or GET"),
    ("GET", "/register_dp_rank", None, 405, "GET /register_dp_rank is not served: use POST"),
    ("PUT", "/route", b"{not json", 400, "PUT /route: the body is not JSON: Expecting property "
                                         "name enclosed in double quotes: line 1 column 2 "
                                         "(char 1)"),
    ("PUT", "/route", [1, 2], 400, "PUT /route: the body must be a JSON object, got [1, 2]"),
    ("PUT", "/route", {"attn_tp_rank": 0}, 400, "PUT /route: missing field attn_tp_size"),
    ("PUT", "/route", rank(2, 7401), 400, "PUT /route: attn_tp_rank 2 is not below attn_tp_size "
                                          "2"),
    ("PUT", "/route", rank(0, 7401, pp_rank="x"), 400, "PUT /route: pp_rank must be an integer, "
                                                       "got 'x'"),
    ("PUT", "/route", rank(0, 7401, attn_tp_size=0), 400, "PUT /route: attn_tp_size must be at "
                                                          "least 1, got 0"),
    ("PUT", "/route", rank(0, 70000), 400, "PUT /route: rank_port 70000 is not a port"),
    ("PUT", "/route", rank(0, 7401, rank_ip=""), 400, "PUT /route: rank_ip must be the rank's "
                                                      "host (its ferryd's control address), "
                                                      "got ''"),
    ("PUT", "/route", rank(0, 7401, rank_port=True), 400, "PUT /route: rank_port must be an "
                                                          "integer, got True"),
    ("GET", "/route?prefill_dp_rank=0&target_tp_rank=0", None, 400,
     "GET /route: missing query parameter(s) prefill_cp_rank, target_pp_rank (all four -1 ask "
     "for the parallel info)"),
    ("GET", "/route?prefill_dp_rank=a&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", None,
     400, "GET /route: prefill_dp_rank must be an integer, got 'a'"),
    ("GET", "/route?prefill_dp_rank=-1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
     None, 400, "GET /route: prefill_dp_rank=-1, prefill_cp_rank=0, target_tp_rank=0, "
                "target_pp_rank=0: either all four are -1 (the parallel info) or none is"),
    ("POST", "/register_dp_rank", {"bootstrap_room": 1}, 400,
     "POST /register_dp_rank: missing field dp_rank"),
    ("POST", "/register_dp_rank", {"bootstrap_room": -1, "dp_rank": 0}, 400,
     "POST /register_dp_rank: bootstrap_room must be at least 0, got -1"),
    ("POST", "/query_dp_ranks", {"bootstrap_rooms": 5}, 400,
     "POST /query_dp_ranks: bootstrap_rooms must be a list of room ids, got 5"),
    ("POST", "/query_dp_ranks", {"bootstrap_rooms": [1, "x"]}, 400,
     "POST /query_dp_ranks: bootstrap_rooms[] must be an integer, got 'x'"),
]


@pytest.mark.parametrize("method,path,body,status,text", BAD,
                         ids=[f"{m} {p.split('?')[0]} {i}" for i, (m, p, *_) in enumerate(BAD)])
def test_a_bad_request_is_refused_naming_what_was_wrong(server: KVBootstrapServer, method: str,
                                                       path: str, body: Any, status: int,
                                                       text: str) -> None:
    raw = body if isinstance(body, bytes) else None
    assert call(server, method, path, None if raw else body, raw) == (status, text)
    assert call(server, "GET", "/health") == (200, "OK")  # and the server serves on


def test_a_rank_of_other_sizes_or_dp_out_of_range_is_refused(server: KVBootstrapServer) -> None:
    assert call(server, "PUT", "/route", rank(0, 7401))[0] == 200
    assert call(server, "PUT", "/route", rank(0, 7409, tp_size=4)) == \
        (409, "PUT /route: attn_tp_size 4 differs from the 2 the instance's first rank "
              "registered")
    assert call(server, "PUT", "/route", rank(1, 7402, page_size=32)) == \
        (409, "PUT /route: page_size 32 differs from the 16 the instance's first rank "
              "registered")
    assert call(server, "POST", "/register_dp_rank", {"bootstrap_room": 1, "dp_rank": 1}) == \
        (400, "POST /register_dp_rank: dp_rank 1 is not below the instance's dp_size 1")


def test_the_decode_finds_the_ranks_of_a_dp_group_through_get_route(
        server: KVBootstrapServer) -> None:
    """FerryHTTPBootstrap: None (not ready) until every rank registered, then every TP and PP
    rank of the request's DP group, as their control addresses."""
    b = FerryHTTPBootstrap(timeout=IO_TIMEOUT)
    addr = server.address
    assert b.parallel_info(addr) is None
    with pytest.raises(LookupError, match="has no complete prefill instance"):
        b.prefill_peers(addr, 0)
    regs = [rank(tp, 7400 + 10 * dp + 2 * pp + tp, 2, attn_dp_size=2, attn_dp_rank=dp,
                  pp_size=2, pp_rank=pp) for dp in (0, 1) for pp in (0, 1) for tp in (0, 1)]
    for r in regs:
        assert call(server, "PUT", "/route", r)[0] == 200
    info = b.parallel_info(addr)
    assert info is not None and (info.dp_size, info.attn_tp_size, info.pp_size) == (2, 2, 2)
    assert b.prefill_peers(addr, 1) == ["127.0.0.1:7410", "127.0.0.1:7412", "127.0.0.1:7411",
                                        "127.0.0.1:7413"]
    with pytest.raises(LookupError, match="prefill_dp_rank 2 is not below the instance's "
                                          "dp_size 2"):
        b.prefill_peers(addr, 2)
    unreachable = FerryHTTPBootstrap(timeout=IO_TIMEOUT)
    assert unreachable.parallel_info("127.0.0.1:1") is None  # no server: not ready, no raise
