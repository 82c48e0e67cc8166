"""clients/python installs offline into a venv with Debian's pip and setuptools, and the installed
package imports (not the source tree's copy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLIENT_DIR, REPO

# Debian's interpreter: its pip (23) and setuptools (66) are the ones the install must work with.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL",
                                                            "PIP_EXTRA_INDEX_URL")}
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_offline_install_into_a_venv(tmp_path: Path) -> None:
    probe = run([PYTHON, "-c", "import ensurepip, venv"], tmp_path)
    if probe.returncode != 0:
        pytest.skip(f"{PYTHON} has no venv/ensurepip (Debian: apt-get install python3-venv): "
                    f"{probe.stderr.strip()}")
    venv = tmp_path / "v"
    made = run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    # A copy of the sources: the build must not write into the work tree (build/, *.egg-info).
    # Laid out as the repository is: the version comes from its top, the file VERSION.
    src = tmp_path / "repo" / "clients" / "python"
    src.mkdir(parents=True)
    (tmp_path / "repo" / "VERSION").write_bytes((REPO / "VERSION").read_bytes())
    for name in ("pyproject.toml", "README.md", "ferry_client.py"):
        (src / name).write_bytes((CLIENT_DIR / name).read_bytes())
    shutil.copytree(CLIENT_DIR / "ferry", src / "ferry",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-index",
               str(src)], tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = run([str(venv / "bin" / "python"), "-c", """
import ferry, ferry_client, ferry.protocol, ferry.errors, ferry.client, ferry.memory, ferry.sglang, os, importlib.resources
import ferry.messages, ferry.encoder, ferry.decoder, ferry.frames, ferry.connection
import ferry.sglang.bootstrap, ferry.sglang.kvargs, ferry.sglang.manager, ferry.sglang.rooms
for m in (ferry.messages, ferry.encoder, ferry.decoder, ferry.frames, ferry.connection,
          ferry.sglang.bootstrap, ferry.sglang.kvargs, ferry.sglang.manager, ferry.sglang.rooms):
    assert 'site-packages' in m.__file__, m.__file__
assert 'site-packages' in ferry.__file__, ferry.__file__
assert 'site-packages' in ferry_client.__file__, ferry_client.__file__
assert importlib.resources.files('ferry').joinpath('py.typed').is_file()
assert ferry_client.Client is ferry.Client
frame = ferry.encode(ferry.protocol.Poll(7), 2, 4)
assert ferry.protocol.decode_frame(frame, 4) == (2, ferry.protocol.Poll(7))
print(ferry.__version__)
"""], tmp_path)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    version = (REPO / "VERSION").read_text().strip()
    assert probe.stdout.strip() == version
    show = run([str(venv / "bin" / "pip"), "show", "ferry-client"], tmp_path)
    assert show.returncode == 0 and "Name: ferry-client" in show.stdout
    assert f"Version: {version}" in show.stdout
