"""End-to-end test of the Python client against two real ferryd processes on loopback.

Usage: test_python_client.py BIN_DIR   (ctest passes the build's src/ directory)
Prints "N passed, M failed" and exits non-zero on any failure.
"""

import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
from ferry_client import FAILED, SUCCESS, Client, FerryError  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/src"
results = []


def check(name, cond, detail=""):
    results.append(cond)
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(name, role, port, sock):
    return f"""node: {{name: {name}}}
role: {role}
listen: {{control: "127.0.0.1:{port}", client: {sock}}}
fabric: {{provider: tcp, write_piece_bytes: 262144}}
pools:
  kv: {{layer_ids: [3, 7], page_tokens: 1, kv_heads: 2, head_dim: 256, dtype_bytes: 2, pages: 256}}
  mamba:
    slots: 4
    layer_ids: [0, 1]
    tensors:
      - {{name: conv, shape: [8192, 3], dtype_bytes: 2, slice_axis: 0, shard_groups: [2048, 2048, 4096]}}
      - {{name: temporal, shape: [4, 128, 128], dtype_bytes: 4, slice_axis: 0}}
  aux: {{rows: 8, row_bytes: 5632}}
"""


def start(tmp, name, role):
    port, sock = free_port(), os.path.join(tmp, name + ".sock")
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(config(name, role, port, sock))
    r, w = os.pipe()
    log = open(os.path.join(tmp, name + ".log"), "w")
    proc = subprocess.Popen([os.path.join(BIN, "ferryd"), "--config", path, "--ready-fd", str(w)],
                            pass_fds=(w,), stdout=log, stderr=log)
    os.close(w)
    with os.fdopen(r) as ready:  # blocks until "ready" or the daemon exits (EOF)
        line = ready.readline().strip()
    if line != "ready":
        proc.kill()
        raise SystemExit(f"{name} did not start: " + open(log.name).read())
    return proc, sock, f"127.0.0.1:{port}"


def fake_daemon_with_wrong_seq(tmp):
    """A daemon that answers hello, then answers the next request with another seq."""
    path = os.path.join(tmp, "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def frame(mtype, seq, body):
        payload = struct.pack("<HHI", mtype, 0, seq) + body
        return struct.pack("<I", len(payload)) + payload

    def serve():
        conn, _ = srv.accept()
        with conn:
            def read_request():
                head = conn.recv(4, socket.MSG_WAITALL)
                (length,) = struct.unpack("<I", head)
                return conn.recv(length, socket.MSG_WAITALL)
            read_request()  # hello, seq 1
            s = lambda t: struct.pack("<I", len(t)) + t.encode()
            body = struct.pack("<H", 3) + s("fake") + s("0") + s("prefill") + s("127.0.0.1:1")
            body += struct.pack("<III", 1, 0, 1) + s("")
            body += (struct.pack("<B", 0) + s("") + struct.pack("<QI", 0, 0)) * 3
            conn.sendall(frame(102, 1, body))
            read_request()  # poll, seq 2
            conn.sendall(frame(100, 99, b""))  # ok, for a seq nobody sent
            conn.recv(1)  # until the client closes
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    c = Client(path, timeout=10)
    try:
        c.poll(5)
        check("a reply with an unknown seq is a protocol error", False, "no error")
    except FerryError as e:
        check("a reply with an unknown seq is a protocol error naming it",
              e.code == 310 and "seq 99" in e.message and "seq 2" in e.message, e.message)
    c.close()
    t.join(timeout=10)
    srv.close()


def main():
    with tempfile.TemporaryDirectory(prefix="ferry-py-") as tmp:
        procs = []
        try:
            pp, psock, pctl = start(tmp, "prefill-0", "prefill")
            procs.append(pp)
            dp, dsock, _ = start(tmp, "decode-0", "decode")
            procs.append(dp)
            fake_daemon_with_wrong_seq(tmp)
            p, d = Client(psock), Client(dsock)
            check("hello describes the pools", p.pools["kv"].present and len(p.pools["kv"].buffers) == 4,
                  str(p.pools["kv"]))

            room, src, dst = 42, [10, 11, 12, 40, 41], [7, 8, 9, 10, 11]
            kv, st, ax = p.pool("kv"), p.pool("state"), p.pool("aux")
            expect = {}
            for b in range(4):
                for pos, page in enumerate(src):
                    off, n = p.item("kv", b, page)
                    kv[off:off + n] = expect[("kv", b, pos)] = os.urandom(n)
            for b in range(len(p.pools["state"].buffers)):
                off, n = p.item("state", b, 1)
                st[off:off + n] = expect[("state", b)] = os.urandom(n)
            off, n = p.item("aux", 0, 2)
            ax[off:off + n] = expect[("aux",)] = room.to_bytes(8, "little") + os.urandom(n - 8)

            try:
                d.prepare(room, pctl, dst, state_slot=None, aux_row=3)
                check("a prepare without a state slot is refused", False, "no error")
            except FerryError as e:
                check("a prepare without a state slot is refused",
                      e.message.startswith("mamba requires single state index: room 42 got dst=none"), e.message)

            d.prepare(room, [pctl], dst, state_slot=2, aux_row=3)  # a list of prefill ranks
            d.subscribe(room)
            p.send(room, src[:3])
            p.send(room, src[3:], last=True, state_slot=1, aux_row=2)
            ev = d.wait_terminal(room, timeout=60)
            check("decode reports Success", ev.status == SUCCESS, str(ev))
            p.subscribe(room)  # the prefill learns of the commit from the decode, a moment later
            pev = p.wait_terminal(room, timeout=60)
            check("prefill reports Success", pev.status == SUCCESS, str(pev))
            check("poll agrees", p.poll(room).status == SUCCESS)

            dkv, dst_state, dax = d.pool("kv"), d.pool("state"), d.pool("aux")
            same = all(bytes(dkv[o:o + n]) == expect[("kv", b, pos)]
                       for b in range(4) for pos, page in enumerate(dst)
                       for o, n in [d.item("kv", b, page)])
            check("every KV byte landed at its position", same)
            same = all(bytes(dst_state[o:o + n]) == expect[("state", b)]
                       for b in range(len(d.pools["state"].buffers)) for o, n in [d.item("state", b, 2)])
            check("the one state slot landed", same)
            o, n = d.item("aux", 0, 3)
            check("the aux row landed", bytes(dax[o:o + n]) == expect[("aux",)])
            try:
                p.send(room, [], last=True, state_slot=1, aux_row=2)
                check("send after Success is refused", False, "no error")
            except FerryError as e:
                check("send after Success is refused", e.code == 403, e.message)

            # A chunk accepted before its prepare, then cancelled: the cancel's reply is `ok`, the
            # room's failure comes as an event, and the next request gets its own reply.
            p.send(700, [1, 2])
            p.send(700, [3])
            p.subscribe(700)
            p.cancel(700)
            ev = p.wait_terminal(700, timeout=60)
            check("a cancelled queued room fails by event", ev.status == FAILED and
                  ev.reason == "cancelled by client", str(ev))
            check("the poll after it is the poll's own reply", p.poll(700).status == FAILED)
            check("info after it is info's own reply", p.info("status")["role"] == "prefill")
            for view in (kv, st, ax, dkv, dst_state, dax):
                view.release()
            p.close()
            d.close()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                check("ferryd exits cleanly", proc.wait(timeout=15) == 0)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
