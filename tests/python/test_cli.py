"""Every Ferry tool's command line, run as the real binaries (FERRY_BIN_DIR, default build/src):
--version, the exit codes of docs/cli.md (0 ok, 1 failed, 2 usage, 3 ferryd unreachable or
lost, 4 timed out, 5 ferryd could not start), ferryctl's options after the command's name,
`ferryd --set`, `ferryctl top` and `ferry-bench --json`."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from typing import Iterator

import pytest
import yaml

from conftest import (BIN_DIR, KV_ONLY_POOLS, REPO, Daemon, daemon_config, free_port, start_daemon,
                      start_pair)

TOOLS = ("ferryd", "ferryctl", "ferry-bench", "ferry-soak")
OK, FAILED, USAGE, UNREACHABLE, TIMED_OUT, COULD_NOT_START = 0, 1, 2, 3, 4, 5


def run(tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN_DIR / tool), *args], capture_output=True, text=True,
                          timeout=timeout)


def one_document(r: subprocess.CompletedProcess[str]) -> dict:
    """The one JSON document a --json command printed on one line."""
    assert r.stdout.count("\n") == 1 and r.stdout.endswith("\n"), (r.stdout, r.stderr)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def work() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ferry-cli-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def pair(work: str) -> Iterator[tuple[Daemon, Daemon]]:
    """A prefill and a decode ferryd with a small kv pool."""
    p, d = start_pair(work, "prefill-c", "decode-c", KV_ONLY_POOLS)
    yield p, d
    codes = [p.stop(), d.stop()]
    assert codes == [0, 0], [open(x.log).read()[-3000:] for x in (p, d)]


def config_file(work: str, name: str, role: str = "decode") -> str:
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(daemon_config(name, role, free_port(), os.path.join(work, name + ".sock"),
                              KV_ONLY_POOLS))
    return path


# --------------------------------------------------------------------------------------------
# --version and usage errors, every tool


def test_every_tool_prints_its_version_and_the_protocol_versions() -> None:
    version = (REPO / "VERSION").read_text().strip()  # Ferry's one version
    schema = yaml.safe_load((REPO / "src/core/wire.yaml").read_text())["client"]
    lo, hi = schema["min_version"], schema["max_version"]
    for tool in TOOLS:
        r = run(tool, "--version")
        assert r.returncode == OK, (tool, r.stdout, r.stderr)
        assert r.stdout.startswith(f"{tool} {version} (protocol versions {lo}-{hi}"), r.stdout
        assert r.stdout.endswith(")\n") and r.stdout.count("\n") == 1 and r.stderr == ""
    messages = (REPO / "src/core/peer_messages.hpp").read_text()
    peer_hi = re.search(r"peer_protocol_version = (\d+);", messages).group(1)
    peer_lo = re.search(r"peer_protocol_min_version = (\d+);", messages).group(1)
    assert f", peer protocol versions {peer_lo}-{peer_hi})" in run("ferryd", "--version").stdout
    # --help is not an error either
    for tool in TOOLS:
        assert run(tool, "--help").returncode == OK


@pytest.mark.parametrize("tool,args", [
    ("ferryd", ["--no-such-option"]),
    ("ferryd", []),                                   # neither --config nor --check-config
    ("ferryd", ["--config", "/nonexistent.yaml"]),    # CLI11's ExistingFile check
    ("ferryctl", ["--no-such-option", "status"]),
    ("ferryctl", ["status", "--no-such-option"]),
    ("ferryctl", []),                                 # no command
    ("ferryctl", ["poll"]),                           # --room is required
    ("ferryctl", ["wait", "-r", "x"]),
    ("ferryctl", ["top", "--interval-ms", "0"]),
    ("ferry-bench", ["--no-such-option"]),
    ("ferry-bench", ["--requests", "0"]),
    ("ferry-soak", ["--no-such-option"]),
    ("ferry-soak", ["--rate", "0"]),
])
def test_a_bad_command_line_exits_2(tool: str, args: list[str]) -> None:
    r = run(tool, *args)
    assert r.returncode == USAGE, (r.stdout, r.stderr)
    assert r.stderr != ""


def test_ferryctl_usage_errors_under_json_are_documents_and_exit_2(tmp_path) -> None:
    r = run("ferryctl", "-s", str(tmp_path / "none.sock"), "--json", "poll")
    assert r.returncode == USAGE
    doc = one_document(r)
    assert doc["error"]["code"] == "invalid_request" and "--room" in doc["error"]["message"]
    # A page list ferryctl cannot read is a usage error too, found before any connection.
    r = run("ferryctl", "-s", str(tmp_path / "none.sock"), "fill", "-r", "1", "-p", "5-2")
    assert r.returncode == USAGE and "bad --pages '5-2'" in r.stderr


# --------------------------------------------------------------------------------------------
# ferryd: --set, and its exit codes


def test_ferryd_catalogue_lists_the_documented_architectures_and_conventions() -> None:
    r = run("ferryd", "--catalogue")
    assert r.returncode == 0, r.stderr
    doc = (REPO / "docs" / "configuration.md").read_text()
    table = doc[doc.index("| architecture | engines |"):]
    documented = re.findall(r"^\| `(\w+ForCausalLM)`(?:, `(\w+ForCausalLM)`)? \| ([a-z, ]+) \|",
                            table, re.M)
    assert len(documented) >= 7
    for first, second, engines in documented:
        for arch in filter(None, (first, second)):
            line = next(l for l in r.stdout.splitlines() if l.split()[:1] == [arch])
            assert engines.strip() in line, (arch, line)
    assert "  sglang@2026-12  read from SGLang" in r.stdout
    assert "  vllm@2026-12  read from vLLM" in r.stdout


def test_ferryd_set_changes_the_effective_config(work: str) -> None:
    path = config_file(work, "set-a")
    plain = run("ferryd", "--check-config", path)
    assert plain.returncode == OK, plain.stderr
    assert "\n  provider: tcp\n" in plain.stdout
    r = run("ferryd", "--check-config", path, "--set", "fabric.provider=shm", "--set",
            "tp.size=2", "--set", "tp.rank=1", "--set", "pools.kv.pages=1024")
    assert r.returncode == OK, r.stderr
    assert "\n  provider: shm\n" in r.stdout and "\n  provider: tcp\n" not in r.stdout
    assert re.search(r"\ntp:\n  size: 2\n  rank: 1\n", r.stdout), r.stdout
    assert "\n    pages: 1024\n" in r.stdout and "\n    pages: 2048\n" not in r.stdout


def test_ferryd_set_is_checked_like_the_file(work: str) -> None:
    path = config_file(work, "set-b")
    for args, text in [
        (["--set", "fabric.providr=shm"], "fabric.providr: unknown key"),
        (["--set", "metricz.port=1"], "metricz: unknown key"),
        (["--set", "tp.rank=4"], "tp.rank: expected a rank below tp.size 1, got 4"),
        (["--set", "pools.kv.dtype_bytes=3"],
         "pools.kv.dtype_bytes: expected 1, 2, 4 or 8, got 3"),
    ]:
        for mode in ("--check-config", "--config"):
            r = run("ferryd", mode, path, *args)
            assert r.returncode == USAGE, (args, r.stdout, r.stderr)
            assert r.stderr == f"ferryd: invalid config: {text}\n", r.stderr
    r = run("ferryd", "--check-config", path, "--set", "fabric.provider")
    assert r.returncode == USAGE
    assert r.stderr.startswith("ferryd: --set 'fabric.provider': expected key=value")


def test_ferryd_that_cannot_start_exits_5(pair: tuple[Daemon, Daemon], work: str) -> None:
    # A second ferryd on the running decode's client socket: the config lock refuses it.
    _, d = pair
    path = config_file(work, "second")
    r = run("ferryd", "--config", path, "--set", f"listen.client={d.sock}", timeout=60)
    assert r.returncode == COULD_NOT_START, r.stdout + r.stderr
    assert "another ferryd" in r.stdout + r.stderr


# --------------------------------------------------------------------------------------------
# ferryctl: global options after the command, exit codes 1, 3 and 4


def test_ferryctl_global_options_go_before_or_after_the_command(
        pair: tuple[Daemon, Daemon]) -> None:
    _, d = pair
    before = one_document(run("ferryctl", "-s", d.sock, "--json", "status"))
    after = one_document(run("ferryctl", "status", "-s", d.sock, "--json"))
    mixed = one_document(run("ferryctl", "--json", "status", "--socket", d.sock))
    assert before["node"] == after["node"] == mixed["node"] == "decode-c"
    assert before["instance"] == after["instance"]
    text = run("ferryctl", "peers", "-s", d.sock)
    assert text.returncode == OK and not text.stdout.startswith("{")


def test_ferryctl_cannot_reach_the_daemon_exits_3(tmp_path, fake) -> None:
    missing = str(tmp_path / "missing.sock")
    for args in (["status"], ["--json", "status"], ["wait", "-r", "1"], ["top", "--count", "1"]):
        r = run("ferryctl", "-s", missing, *args)
        assert r.returncode == UNREACHABLE, (args, r.stdout, r.stderr)
    assert "cannot connect to ferryd at" in one_document(
        run("ferryctl", "-s", missing, "--json", "status"))["error"]["message"]
    # A socket that is not a ferryd's: it closes without answering the hello.
    fake.serve(lambda conn: conn.sock.close(), connections=1)
    r = run("ferryctl", "-s", fake.path, "status")
    fake.join()
    assert r.returncode == UNREACHABLE, (r.stdout, r.stderr)
    r = run("ferry-bench", "--prefill-socket", missing, "--decode-socket", missing)
    assert r.returncode == UNREACHABLE, r.stderr


def test_ferryctl_refusals_exit_1(pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferryctl", "-s", d.sock, "poll", "-r", "424242")
    assert r.returncode == FAILED and "unknown room 424242" in r.stderr
    r = run("ferryctl", "-s", p.sock, "--json", "prepare", "-r", "5", "--peer", p.control)
    assert r.returncode == FAILED and one_document(r)["error"]["code"] == "wrong_role"


def test_ferryctl_wait_exits_1_for_a_failed_room(pair: tuple[Daemon, Daemon]) -> None:
    _, d = pair
    # The prefill it names does not listen: the room fails (peer_unreachable).
    closed = f"127.0.0.1:{free_port()}"
    r = run("ferryctl", "-s", d.sock, "prepare", "-r", "7001", "--peer", closed, "-p", "0-3")
    assert r.returncode == OK, r.stderr
    r = run("ferryctl", "-s", d.sock, "wait", "-r", "7001", "--json", "--timeout-ms", "60000")
    assert r.returncode == FAILED, (r.stdout, r.stderr)
    doc = one_document(r)
    assert doc["room"] == 7001 and doc["status"] == "Failed" and doc["reason"] != ""


def test_ferryctl_wait_exits_4_on_its_timeout(pair: tuple[Daemon, Daemon]) -> None:
    p, _ = pair
    # A chunk no decode prepared: the room stays Bootstrapping (timeouts.bootstrapping_ms, 30 s).
    assert run("ferryctl", "-s", p.sock, "send", "-r", "7002", "-p", "0-3").returncode == OK
    r = run("ferryctl", "-s", p.sock, "wait", "-r", "7002", "--timeout-ms", "200")
    assert r.returncode == TIMED_OUT, (r.stdout, r.stderr)
    assert r.stdout == "room 7002: Bootstrapping\n"
    assert "room 7002: not terminal after 200 ms" in r.stderr
    r = run("ferryctl", "-s", p.sock, "--json", "wait", "-r", "7002", "--timeout-ms", "200")
    assert r.returncode == TIMED_OUT
    assert one_document(r)["error"]["code"] == "timed_out"


def test_ferryctl_wait_exits_3_when_the_daemon_goes_away(work: str) -> None:
    d = start_daemon(work, "lost-c", "prefill", KV_ONLY_POOLS)
    try:
        assert run("ferryctl", "-s", d.sock, "send", "-r", "7003", "-p", "0-3").returncode == OK
        w = subprocess.Popen([str(BIN_DIR / "ferryctl"), "-s", d.sock, "wait", "-r", "7003",
                              "--timeout-ms", "60000"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            assert w.stdout is not None
            # Its first line comes after it subscribed: then the daemon stops.
            assert w.stdout.readline() == "room 7003: Bootstrapping\n"
            assert d.stop() == 0
            assert w.wait(timeout=30) == UNREACHABLE
            assert w.stderr is not None and w.stderr.read().startswith("ferryctl: ")
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
    finally:
        d.stop()


# --------------------------------------------------------------------------------------------
# ferryctl top


def test_ferryctl_top_prints_count_frames(pair: tuple[Daemon, Daemon]) -> None:
    p, _ = pair
    assert run("ferryctl", "-s", p.sock, "send", "-r", "7004", "-p", "8-11").returncode == OK
    r = run("ferryctl", "-s", p.sock, "top", "--count", "2", "--interval-ms", "50", "--json")
    assert r.returncode == OK, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and r.stdout.endswith("\n")
    frames = [json.loads(x) for x in lines]
    assert [f["frame"] for f in frames] == [1, 2]
    for f in frames:
        assert f["node"] == "prefill-c" and f["role"] == "prefill"
        assert isinstance(f["clients"], int) and isinstance(f["peers"], list)
        for side in ("prefill", "decode"):
            s = f["rooms"][side]
            for key in ("active", "succeeded", "failed", "bytes"):
                assert isinstance(s[key], int), (side, key, s)
            assert set(s["by_status"]) >= {"Bootstrapping", "WaitingForInput", "Transferring"}
        assert f["rooms"]["prefill"]["by_status"]["Bootstrapping"] >= 1
        assert f["rooms"]["prefill"]["active"] >= 1
    first, second = frames
    assert first["elapsed_s"] is None and first["rooms"]["prefill"]["bytes_per_s"] is None
    assert second["elapsed_s"] > 0
    for side in ("prefill", "decode"):
        for key in ("succeeded_per_s", "failed_per_s", "bytes_per_s"):
            assert isinstance(second["rooms"][side][key], (int, float)), (side, key)
    # Text, to a pipe: no screen clearing, the table and the peers.
    r = run("ferryctl", "-s", p.sock, "top", "--count", "1")
    assert r.returncode == OK and "\x1b[" not in r.stdout
    assert r.stdout.startswith("prefill-c (prefill)") and "\nprefill " in r.stdout


# --------------------------------------------------------------------------------------------
# ferry-bench --json


def test_ferry_bench_json_is_one_document_on_stdout(pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "2", "--concurrency", "1", "--verify",
            "--room-base", "880000", "--poll-many", "4", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    doc = json.loads(r.stdout)  # the whole of stdout is the document; the report went to stderr
    assert "ferry-bench: prefill-c" in r.stderr and "commit latency" in r.stderr
    assert doc["ok"] is True and doc["provider"] == "tcp"
    assert doc["workload"]["requests"] == 2 and doc["workload"]["prompt_tokens"] == 8
    assert doc["ferry"]["committed"] == 2 and doc["ferry"]["failed"] == 0
    assert doc["verified"] == 2 and doc["first_failure"] == ""
    assert doc["per_request"]["bytes"] > 0 and doc["per_request"]["writes"] > 0
    assert len(doc["runs"]) == 1 and doc["runs"][0]["requests"] == 2
    run0 = doc["runs"][0]
    assert isinstance(run0["raw_gbps"], (int, float)) and isinstance(run0["ratio"], (int, float))
    assert doc["raw"]["gbps_median"] > 0 and doc["ratio"] > 0
    assert doc["commit_latency_ms"]["samples"] == 2
    assert doc["poll_many"]["rooms"] == 4
    assert doc["lent"] == [{"socket": p.sock, "pools": 0}, {"socket": d.sock, "pools": 0}]


def test_ferry_bench_pipeline_verifies_every_room_and_reports_cpu_per_room(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "7", "--concurrency", "3", "--pipeline",
            "--verify", "--room-base", "890000", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ferry"]["mode"] == "pipeline"
    assert doc["ferry"]["committed"] == 7 and doc["verified"] == 7
    assert doc["commit_latency_ms"]["samples"] == 7
    run0 = doc["runs"][0]
    assert run0["requests"] == 7 and run0["rooms_per_s"] > 0
    writes = doc["per_request"]["writes"]
    assert abs(run0["writes_per_s"] - run0["rooms_per_s"] * writes) <= 1e-6 * run0["writes_per_s"]
    # Both daemons run here, so their CPU is read through /proc; the raw run's too.
    for side in ("prefill", "decode", "bench"):
        assert run0["cpu_ms_per_room"][side] >= 0, run0
    assert set(run0["raw_cpu_ms_per_room"]) == {"initiator", "target"}
    assert doc["ferry"]["cpu_ms_per_room_median"]["decode"] >= 0
    assert "cpu per room: prefill" in r.stderr


def test_ferry_bench_hold_reports_memory_per_room_and_the_rate_against_waves(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--hold", "16", "--hold-reference", "4", "--sustain-s", "0.5",
            "--sample-s", "0.2", "--verify", "--room-base", "3000000", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["mode"] == "hold" and doc["failed"] == 0
    assert doc["rooms"] == 16 and doc["reference_rooms"] == 4
    assert doc["per_room"]["pages"] == 8 and doc["per_room"]["writes"] > 0
    run0 = doc["runs"][0]
    assert run0["reference"]["rooms"] == 16 and run0["hold"]["rooms"] == 16
    assert run0["ratio"] == run0["hold"]["rooms_per_s"] / run0["reference"]["rooms_per_s"]
    # Each daemon's memory from /proc: before, with the rooms open, after; per room in KiB.
    assert [m["side"] for m in run0["memory"]] == ["prefill", "decode"]
    for m in run0["memory"]:
        for when in ("before", "held", "after"):
            assert m[when]["rss_kib"] > 0 and m[when]["anon_kib"] > 0, m
        assert isinstance(m["per_room_held_kib"]["anon_kib"], float)
    assert "KiB per room" in r.stderr and "held / reference" in r.stderr
    sustain = doc["sustain"]
    assert sustain["open"] == 16 and sustain["send_window"] == 64
    assert sustain["committed"] > 0 and sustain["samples"]
    # The reference, the hold and the sustained rooms: every byte of each checked.
    assert doc["verified"] == 32 + sustain["committed"]


def test_ferry_bench_hold_and_fan_in_refuse_what_the_daemons_cannot_hold(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--hold", "300", "--json", timeout=60)
    assert r.returncode == USAGE, r.stdout + r.stderr
    assert "--hold 300 rooms of 8 pages need 2400 kv pages on the decode (it has 2048)" in r.stderr
    assert json.loads(r.stdout)["ok"] is False
    # Fan-in takes independent prefill instances, not one twice.
    r = run("ferry-bench", "--fan-in-socket", f"{p.sock},{p.sock}", "--decode-socket", d.sock,
            "--prompt-tokens", "8", timeout=60)
    assert r.returncode == USAGE, r.stdout + r.stderr
    assert "are the same prefill" in r.stderr and "fan-in needs independent instances" in r.stderr
    r = run("ferry-bench", "--hold", "4", "--fan-in-socket", p.sock, "--decode-socket", d.sock,
            timeout=60)
    assert r.returncode == USAGE and "--hold and --fan-in-socket are separate modes" in r.stderr


def test_ferry_bench_fan_in_of_one_prefill_compares_it_with_itself(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--fan-in-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "6", "--concurrency", "2", "--verify",
            "--room-base", "4000000", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "fan_in" and doc["prefills"] == 1 and doc["failed"] == 0
    run0 = doc["runs"][0]
    assert run0["one_to_one"]["committed"] == 6 and run0["fan_in"]["committed"] == 6
    assert doc["verified"] >= 12  # the warm-up's rooms are checked too
    assert "1 -> 1" in r.stderr and "ratio" in r.stderr
    # CPU per room by side (every prefill instance summed), beside each rate.
    for phase in ("one_to_one", "fan_in"):
        assert set(run0[phase]["cpu_ms_per_room"]) == {"prefill", "decode", "bench"}, run0
    assert "cpu per room: 1 -> 1" in r.stderr


def test_ferry_bench_background_rooms_reports_idle_and_loaded_latency(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "3", "--concurrency", "1",
            "--background-rooms", "2", "--background-tokens", "512", "--no-baseline",
            "--room-base", "895000", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    f = json.loads(r.stdout)["fairness"]
    assert f["background_rooms"] == 2 and f["background_tokens"] == 512
    assert f["idle_ms"]["samples"] == 3 and 1 <= f["loaded_ms"]["samples"] <= 3
    assert f["ratio_p50"] == f["loaded_ms"]["p50"] / f["idle_ms"]["p50"]
    assert "fairness: 3 rooms of 8 tokens one at a time" in r.stderr
    # Background rooms that do not fit the pools are refused before anything starts.
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "1", "--background-rooms", "3",
            "--background-tokens", "4096", "--no-baseline", timeout=60)
    assert r.returncode == USAGE
    assert "3 background rooms of 4096 pages do not fit beside the timed rooms" in r.stderr


def check_latency_document(doc: dict, gaps: list[float], rooms: int, provider: str) -> None:
    """--latency's figures: every gap with its samples, percentiles in order, ratios of p50s."""
    assert doc["ok"] is True and doc["provider"] == provider
    assert doc["workload"]["concurrency"] == 1
    lat = doc["latency"]
    assert lat["rooms_per_gap"] == rooms and lat["warmup"] == 2
    assert lat["raw_writes"] == doc["per_request"]["writes"]
    assert lat["raw_provider"].startswith(provider) and lat["raw_error"] is None
    assert [g["gap_ms"] for g in lat["gaps"]] == gaps
    for g in lat["gaps"]:
        for key in ("ferry_ms", "raw_ms", "raw_single_write_ms"):
            s = g[key]
            assert s["samples"] == rooms, (key, s)
            assert 0 < s["min"] <= s["p50"] <= s["p99"] <= s["max"], (key, s)
        assert g["ratio_p50"] == pytest.approx(g["ferry_ms"]["p50"] / g["raw_ms"]["p50"])
        assert g["ratio_p50_single_write"] == pytest.approx(
            g["ferry_ms"]["p50"] / g["raw_single_write_ms"]["p50"])
    # Every timed room and the 2 warm-up rooms committed.
    assert doc["ferry"] == {"committed": rooms * len(gaps) + 2, "failed": 0}


def test_ferry_bench_latency_times_rooms_against_the_raw_reference(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "3", "--concurrency", "4", "--latency",
            "--gap-ms", "0,5", "--verify", "--room-base", "897000", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    check_latency_document(doc, [0, 5], 3, "tcp")
    assert doc["verified"] == 3 * 2 + 2 and doc["first_failure"] == ""
    assert "latency, gap 5 ms: ferry p50" in r.stderr
    # Without the reference: Ferry's figures only.
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--prompt-tokens", "8", "--requests", "2", "--latency", "--gap-ms", "1",
            "--no-baseline", "--json", timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    g = json.loads(r.stdout)["latency"]["gaps"]
    assert len(g) == 1 and g[0]["ferry_ms"]["samples"] == 2
    assert g[0]["raw_ms"] is None and g[0]["ratio_p50"] is None
    # One mode at a time.
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock, "--latency",
            "--pipeline", timeout=60)
    assert r.returncode == USAGE
    assert "--latency, --open-loop, --background-rooms, --layer-wise and --pipeline are separate modes" in r.stderr


def shm_available() -> bool:
    fi_info = shutil.which("fi_info")
    return fi_info is not None and subprocess.run(
        [fi_info, "-p", "shm"], capture_output=True, timeout=30).returncode == 0


def test_ferry_bench_latency_runs_on_shm(work: str) -> None:
    if not shm_available():
        pytest.skip("the shm provider is missing (fi_info -p shm)")
    p, d = start_pair(work, "prefill-shm", "decode-shm", KV_ONLY_POOLS, provider="shm")
    try:
        r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
                "--prompt-tokens", "8", "--requests", "2", "--latency", "--gap-ms", "0,2",
                "--verify", "--json", timeout=300)
        assert r.returncode == OK, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        check_latency_document(doc, [0, 2], 2, "shm")
        assert doc["verified"] == 2 * 2 + 2
    finally:
        assert [p.stop(), d.stop()] == [0, 0]


def test_ferry_bench_open_loop_counts_every_arrival_per_class(
        pair: tuple[Daemon, Daemon]) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--open-loop", "200", "--mix", "8:0.75,64:0.2,512:0.05", "--duration-s", "10",
            "--requests", "24", "--seed", "3", "--verify", "--room-base", "905000", "--json",
            timeout=300)
    assert r.returncode == OK, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    ol = doc["open_loop"]
    assert doc["ok"] is True and doc["first_failure"] == ""
    assert ol["rate"] == 200 and ol["mix"] == "8:0.75,64:0.2,512:0.05" and ol["seed"] == 3
    assert ol["max_arrivals"] == 24 and ol["arrivals"] == 24  # --requests bounds the arrivals
    assert ol["kv_pages"] == 2048 and ol["slots"] == 16384  # no state pool: admission bounds it
    classes = ol["classes"]
    assert [c["tokens"] for c in classes] == [8, 64, 512]
    assert [c["pages"] for c in classes] == [8, 64, 512]
    assert sum(c["arrivals"] for c in classes) == 24
    for c in classes:
        # Every arrival started or was refused, and counted; every started room committed.
        assert c["arrivals"] == c["started"] + c["refused_no_pages"] + c["refused_no_slot"], c
        assert c["committed"] == c["started"] and c["failed"] == 0, c
        assert c["latency_ms"]["samples"] == c["committed"]
        assert c["issue_ms"]["samples"] == c["started"]
        if c["committed"]:
            lat = c["latency_ms"]
            assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
        assert c["bytes_per_room"] == c["pages"] * 2 * 64 * 2  # 1 layer x K, V x 64 dims x bf16
    refused = ol["refused"]["no_pages"] + ol["refused"]["no_slot"]
    assert ol["started"] + refused == 24
    assert ol["committed"] == ol["started"] == sum(c["committed"] for c in classes)
    assert ol["verified"] == ol["committed"] and ol["failed"] == 0
    assert ol["start_lag_ms"]["samples"] == ol["started"]
    assert ol["bytes"] == sum(c["committed"] * c["bytes_per_room"] for c in classes)
    assert ol["achieved_rooms_per_s"] > 0 and ol["gbps"] > 0 and ol["window_s"] > 0
    assert ol["sustained"] == (refused == 0 and ol["failed"] == 0 and
                               ol["start_lag_ms"]["p99"] <= ol["max_lag_ms"])
    assert ol["late_starts"] <= ol["started"]
    assert 1 <= ol["in_flight_max"] <= 24
    assert "open loop: 24 arrivals in" in r.stderr and "     8 tokens: " in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--mix", "8:0.5,64:0.4"], "--mix '8:0.5,64:0.4': the fractions sum to 0.9, not 1"),
    (["--mix", "8:0.5;64:0.5"], "--mix entry '8:0.5;64:0.5': the fraction must be a number"),
    (["--mix", "8:1,4096:0"], "--mix entry '4096:0': the fraction must be in (0, 1], got 0"),
    (["--mix", "8:0.5,4096:0.5"], "--mix: a room of 4096 tokens needs 4096 kv pages, the kv "
                                  "pools hold 2048: start the pair with more pools.kv.pages"),
    (["--latency"], "--latency, --open-loop, --background-rooms, --layer-wise and --pipeline "
                    "are separate modes: choose one"),
    (["--layer-wise", "2"], "--latency, --open-loop, --background-rooms, --layer-wise and "
                            "--pipeline are separate modes: choose one"),
])
def test_ferry_bench_open_loop_refuses_a_mix_it_cannot_run(
        pair: tuple[Daemon, Daemon], args: list[str], message: str) -> None:
    p, d = pair
    r = run("ferry-bench", "--prefill-socket", p.sock, "--decode-socket", d.sock,
            "--open-loop", "10", "--duration-s", "1", *args, "--json", timeout=60)
    assert r.returncode == USAGE, r.stdout + r.stderr
    assert message in r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["exit_code"] == USAGE and message in doc["error"]
