"""What an operator meets beside the rooms (issue 28): exit codes of ferryctl's bounded waits
and of discover, the config lock gone after a clean stop, the example cluster configs that take
their socket directory from the environment, and no source file of the binaries above 600
lines. Real binaries (FERRY_BIN_DIR, default build/src); every wait is bounded."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

from conftest import (BIN_DIR, IO_TIMEOUT, KV_ONLY_POOLS, REPO, daemon_config, free_port,
                      start_daemon)

OK, USAGE, UNREACHABLE, TIMED_OUT = 0, 2, 3, 4


def run(tool: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN_DIR / tool), *args], capture_output=True, text=True,
                          timeout=120, env=env)


def get(port: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:port/path: its status and body (raises OSError when refused)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=IO_TIMEOUT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def eventually(probe: Callable[[], object], want: Callable[[object], bool]) -> object:
    """Probe until `want` holds of the answer (a refused connection is no answer yet), bounded
    by 3 x IO_TIMEOUT; the last answer."""
    deadline = time.monotonic() + 3 * IO_TIMEOUT
    got: object = None
    while time.monotonic() < deadline:
        try:
            got = probe()
        except OSError as e:
            got = e
        if want(got):
            return got
        time.sleep(0.02)
    pytest.fail(f"still {got!r} after {3 * IO_TIMEOUT} s")


def launch(tmp_path: Path, name: str, pools: str, metrics: int,
           failpoints: str = "") -> subprocess.Popen:
    """ferryd (decode) with its operator endpoint on 127.0.0.1:metrics; not waited for."""
    sock = str(tmp_path / f"{name}.sock")
    config = tmp_path / f"{name}.yaml"
    config.write_text(daemon_config(name, "decode", free_port(), sock, pools))
    env = dict(os.environ)
    if failpoints:
        env["FERRY_FAILPOINTS"] = failpoints
    with open(tmp_path / f"{name}.log", "w") as log:
        return subprocess.Popen([str(BIN_DIR / "ferryd"), "--config", str(config), "--set",
                                 f"listen.metrics=127.0.0.1:{metrics}"], stdout=log,
                                stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen, held: bool = False) -> int:
    """SIGTERM (a drain); `held`: the failpoint's SIGUSR1 first, so a held start goes on."""
    if held:
        proc.send_signal(signal.SIGUSR1)
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=IO_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_health_is_served_from_the_first_moment_of_a_start_naming_its_phase(tmp_path) -> None:
    port = free_port()
    # Held in its first pool's creation until SIGUSR1: what the endpoint answers then is fixed.
    proc = launch(tmp_path, "hold-c", KV_ONLY_POOLS, port, "start_hold_creating_pools=1")
    sock = str(tmp_path / "hold-c.sock")
    try:
        eventually(lambda: get(port, "/readyz"),
                   lambda r: r == (503, "starting: creating pool kv\n"))
        assert get(port, "/healthz") == (200, "starting\n")
        assert get(port, "/metrics") == (503, "starting: creating pool kv\n")
        r = run("ferryctl", "-s", sock, "wait-ready", "--timeout-ms", "100")
        assert r.returncode == TIMED_OUT, (r.stdout, r.stderr)  # agrees: not ready
        proc.send_signal(signal.SIGUSR1)
        eventually(lambda: get(port, "/readyz"), lambda r: r == (200, "ready\n"))
        assert get(port, "/healthz") == (200, "ok\n")
        r = run("ferryctl", "-s", sock, "wait-ready", "--timeout-ms", "10000")
        assert r.returncode == OK, (r.stdout, r.stderr)
    finally:
        assert stop(proc, held=True) == OK
    log = (tmp_path / "hold-c.log").read_text()
    assert "failpoint start_hold_creating_pools: holding the start before the pools" in log


def test_wait_ready_and_readyz_agree_while_a_client_pool_is_not_registered(tmp_path) -> None:
    port = free_port()
    pools = KV_ONLY_POOLS.replace("pages: 2048}", "pages: 2048, memory: client}")
    proc = launch(tmp_path, "client-pool-c", pools, port)
    sock = str(tmp_path / "client-pool-c.sock")
    why = "pool kv is client memory and no client has registered it"
    try:
        eventually(lambda: get(port, "/readyz"), lambda r: r == (503, f"not ready: {why}\n"))
        r = run("ferryctl", "-s", sock, "wait-ready", "--timeout-ms", "200")
        assert r.returncode == TIMED_OUT, (r.stdout, r.stderr)
        assert r.stderr == f"ferryctl: not ready after 200 ms: {why}\n"
        doc = json.loads(run("ferryctl", "-s", sock, "--json", "status").stdout)
        assert (doc["ready"], doc["not_ready"]) == (False, why)
    finally:
        assert stop(proc) == OK


def test_a_negative_timeout_is_a_usage_error(tmp_path) -> None:
    sock = str(tmp_path / "none.sock")
    for args in (["wait", "-r", "1", "--timeout-ms", "-5"], ["wait-ready", "--timeout-ms", "-5"],
                 ["drain", "--wait", "--timeout-ms", "-5"]):
        r = run("ferryctl", "-s", sock, *args)
        assert r.returncode == USAGE, (args, r.stdout, r.stderr)
        assert "--timeout-ms" in r.stderr, r.stderr


def test_discover_of_an_address_where_nothing_listens_exits_3_and_prints_the_answer(
        tmp_path) -> None:
    d = start_daemon(str(tmp_path), "discover-c", "decode", KV_ONLY_POOLS)
    try:
        nowhere = f"127.0.0.1:{free_port()}"
        r = run("ferryctl", "-s", d.sock, "--json", "discover", nowhere)
        assert r.returncode == UNREACHABLE, (r.stdout, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["address"] == nowhere
        assert [k["up"] for k in doc["ranks"]] == [False] and doc["ranks"][0]["reason"] != ""
        r = run("ferryctl", "-s", d.sock, "discover", nowhere)
        assert r.returncode == UNREACHABLE and r.stdout.startswith(f"{nowhere} down: "), r.stdout
    finally:
        d.stop()


def test_the_config_lock_is_removed_at_a_clean_stop(tmp_path) -> None:
    d = start_daemon(str(tmp_path), "lock-c", "decode", KV_ONLY_POOLS)
    lock = Path(d.sock + ".lock")
    try:
        assert lock.exists()
    finally:
        d.proc.send_signal(signal.SIGTERM)  # a drain alone: the clean stop
        assert d.proc.wait(timeout=IO_TIMEOUT) == OK
    assert not lock.exists()
    assert not Path(d.sock).exists()


EXAMPLES = sorted((REPO / "configs" / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_configs_take_their_socket_directory_from_ferry_run_dir(config: Path,
                                                                        tmp_path) -> None:
    client = re.search(r"^  client: (\S+)", config.read_text(), re.M).group(1)
    assert client.startswith("${FERRY_RUN_DIR}/"), client
    env = dict(os.environ, FERRY_RUN_DIR=str(tmp_path))
    r = run("ferryd", "--check-config", str(config), env=env)
    assert r.returncode == OK, r.stderr
    want = client.replace("${FERRY_RUN_DIR}", str(tmp_path))
    assert f"\n  client: {want}\n" in r.stdout, r.stdout
    env.pop("FERRY_RUN_DIR")
    r = run("ferryd", "--check-config", str(config), env=env)
    assert r.returncode == USAGE
    assert r.stderr == ("ferryd: invalid config: listen.client: ${FERRY_RUN_DIR} names the "
                        "environment variable FERRY_RUN_DIR, which is unset or empty\n"), r.stderr


SGLANG = sorted((REPO / "configs").glob("sglang-*.yaml"))


@pytest.mark.parametrize("config", SGLANG, ids=lambda p: p.name)
def test_the_sglang_configs_are_the_base_configs_with_sglangs_timeouts(config: Path,
                                                                       tmp_path) -> None:
    """configs/sglang-{prefill,decode}.yaml (issue 29, items 1 and 6): accepted by ferryd,
    SGLang's 300 s Bootstrapping and WaitingForInput waits, ferryd's longest bounds (1 h) where
    SGLang has none, the socket under systemd's RuntimeDirectory, every pool left to the
    engine's registration; otherwise the base config as is."""
    assert [p.name for p in SGLANG] == ["sglang-decode.yaml", "sglang-prefill.yaml"]
    env = dict(os.environ, RUNTIME_DIRECTORY=str(tmp_path))
    r = run("ferryd", "--check-config", str(config), env=env)
    assert r.returncode == OK, r.stderr
    want = ("timeouts:\n  handshake_ms: 10000\n  bootstrapping_ms: 300000\n"
            "  waiting_for_input_ms: 300000\n  transferring_ms: 3600000\n"
            "  transfer_ms: 3600000\n")
    assert want in r.stdout, r.stdout
    assert f"\n  client: {tmp_path}/ferryd.sock\n" in r.stdout
    base = run("ferryd", "--check-config", str(REPO / "configs" / config.name[len("sglang-"):]))
    assert base.returncode == OK, base.stderr

    pools = r.stdout[r.stdout.index("\npools:"):]
    assert re.findall(r"\n  (\w+):\n    memory: client  # described by the engine's "
                      r"register_memory", pools) == ["kv", "mamba", "aux"], pools

    def rest(text: str) -> list[str]:
        text = text[:text.index("\npools:")]
        return [line for line in text.splitlines()
                if not re.match(r"  (client|bootstrapping_ms|waiting_for_input_ms|"
                                r"transferring_ms|transfer_ms):", line)]
    assert rest(r.stdout) == rest(base.stdout)
    env.pop("RUNTIME_DIRECTORY")
    r = run("ferryd", "--check-config", str(config), env=env)
    assert r.returncode == USAGE and "RUNTIME_DIRECTORY" in r.stderr, r.stderr


def test_no_source_file_of_the_binaries_is_longer_than_600_lines() -> None:
    """The daemon's, the tools' and the C++ client's sources (tests are not held to it)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.cpp", "*.hpp"],
                           capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in files if not f.startswith("tests/")]
    assert len(files) > 100
    long = {f: n for f in files
            if (n := len((REPO / f).read_text(errors="replace").splitlines())) > 600}
    assert long == {}
