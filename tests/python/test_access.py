"""Engines running as another user, with a real ferryd (FERRY_BIN_DIR, default build/src) and
the Python client: a forked child drops to an unused uid (the config names it by number; the
kernel's SO_PEERCRED reports numbers), connects, maps every pool read-write and writes a byte
ferryd's own client then sees; a uid the config does not name gets ``FerryError`` 313
``ACCESS_DENIED`` with words naming its ids and the keys to change. Changing users needs root:
elsewhere these tests are reported skipped."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

from conftest import MAMBA_POOLS, start_daemon
from ferry import Client, Errc, FerryError

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="connecting as another user needs root (setuid)")

KINDS = ("kv", "state", "aux")


@pytest.fixture
def tmp() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ferry-py-")
    os.chmod(d, 0o755)  # the other users must reach the socket
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(sock: str, uid: int, gid: int, groups: list[int]) -> str:
    """In a forked child running as ``uid``/``gid``/``groups``: connect, map every pool and mark
    its first byte. What happened: ``mapped kv state aux``, or ``error CODE: MESSAGE``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here, only os._exit
        os.close(r)
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            with Client(sock, "other-user", timeout=10) as c:
                for k in KINDS:
                    view = c.pool(k)
                    view[0] = 0x5A
                    view.release()
            said = "mapped " + " ".join(KINDS)
        except FerryError as e:
            said = f"error {int(e.code)}: {e.message}"
        except BaseException as e:  # noqa: BLE001 - reported to the parent as text
            said = f"child failed: {e!r}"
        os.write(w, said.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_a_named_uid_maps_the_pools_and_another_is_refused_with_313(tmp: str) -> None:
    d = start_daemon(tmp, "decode-access", "decode", MAMBA_POOLS,
                     "security: {client_users: [\"4242\"]}\n")
    try:
        with Client(d.sock, "own") as own:
            assert as_user(d.sock, 4242, 4242, []) == "mapped kv state aux"
            for k in KINDS:
                view = own.pool(k)
                assert view[0] == 0x5A, k  # the other user's byte is in ferryd's pool
                view.release()
            refused = as_user(d.sock, 4343, 4343, [4300])
            assert refused.startswith(f"error {int(Errc.ACCESS_DENIED)}: access denied: uid 4343 "
                                      "(gid 4343, pid "), refused
            assert refused.endswith("add the uid to security.client_users or one of its groups "
                                    "to security.client_groups in ferryd's config"), refused
            own.info("status")  # served on
    finally:
        d.stop()
