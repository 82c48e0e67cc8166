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
from pathlib import Path

import pytest

from conftest import BIN_DIR, IO_TIMEOUT, KV_ONLY_POOLS, REPO, free_port, start_daemon

OK, USAGE, UNREACHABLE = 0, 2, 3


def run(tool: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN_DIR / tool), *args], capture_output=True, text=True,
                          timeout=120, env=env)


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


def test_no_source_file_of_the_binaries_is_longer_than_600_lines() -> None:
    """The daemon's, the tools' and the C++ client's sources (tests are not held to it)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.cpp", "*.hpp"],
                           capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in files if not f.startswith("tests/")]
    assert len(files) > 100
    long = {f: n for f in files
            if (n := len((REPO / f).read_text(errors="replace").splitlines())) > 600}
    assert long == {}
