"""Ferry Python client: the local client protocol of docs/protocol.md, standard library only.

    from ferry_client import Client
    c = Client("/tmp/ferry-decode.sock")          # connects and says hello
    c.prepare(room=7, prefill_peers=["127.0.0.1:7401"], dst_pages=[5, 6, 7], state_slot=2, aux_row=2)
    c.subscribe(7); ev = c.wait_terminal(7, timeout=30)   # Event(room, status, reason)
    c.pool("kv")[off:off + n]                      # memoryview of the mapped pool

Calls are synchronous, one request at a time, and each reply is matched to its request by seq (a
reply with another seq is a protocol error, FerryError 310); a daemon error raises
FerryError(code, message). The Mamba state slot and
the aux row are single integers (None = absent): there is no way to pass a list of slots.
"""

import mmap
import os
import socket
import struct
import time
from collections import namedtuple

PROTOCOL_VERSION = 3
NO_INDEX = 0xFFFFFFFF
STATUS = {0: "Failed", 1: "Bootstrapping", 2: "WaitingForInput", 3: "Transferring", 4: "Success"}
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = range(5)
POOLS = ("kv", "state", "aux")

HELLO, PREPARE, SEND, POLL, CANCEL, SUBSCRIBE, INFO = range(1, 8)
OK, ERROR, HELLO_REPLY, POLL_REPLY, INFO_REPLY, EVENT = range(100, 106)

Event = namedtuple("Event", "room status reason")
Buffer = namedtuple("Buffer", "offset item_bytes items layer_id tensor kind")
Pool = namedtuple("Pool", "present shm_name total_bytes buffers")


class FerryError(Exception):
    """An error reply from ferryd (code as in docs/protocol.md) or a local I/O failure."""

    def __init__(self, code, message):
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


def _index(value):
    return NO_INDEX if value is None else int(value)


def _u32_list(values):
    values = list(values)
    return struct.pack(f"<I{len(values)}I", len(values), *values)


def _str(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


class _Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        vals = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def str(self):
        n = self.take("I")
        s = bytes(self.data[self.pos:self.pos + n]).decode()
        self.pos += n
        return s


def _error(body):
    """The FerryError an error frame's body carries."""
    r = _Reader(body)
    code = r.take("H")
    return FerryError(code, r.str())


class Client:
    def __init__(self, socket_path, name="ferry-python", timeout=30.0, cancel_on_disconnect=True):
        """Connect and say hello. With cancel_on_disconnect (the default) the rooms this
        connection creates are cancelled by ferryd when it closes."""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(socket_path)
        self.timeout = timeout
        self.seq = 0
        self.buf = bytearray()
        self.events = []
        self.maps = {}
        r = self._request(HELLO, struct.pack("<H", PROTOCOL_VERSION) + _str(name) +
                          struct.pack("<B", 1 if cancel_on_disconnect else 0), HELLO_REPLY)
        self.version = r.take("H")
        self.node, self.instance, self.role, self.control = r.str(), r.str(), r.str(), r.str()
        self.tp_size, self.tp_rank, self.page_tokens = r.take("III")
        self.config_yaml = r.str()  # the daemon's effective config (pools, TP/PP geometry)
        self.pools = {}
        for kind in POOLS:
            present = r.take("B") == 1
            shm_name = r.str()
            total, n = r.take("QI")
            bufs = [Buffer(*r.take("QQQIIB")) for _ in range(n)]
            self.pools[kind] = Pool(present, shm_name, total, bufs)

    def close(self):
        """Close the socket and unmap the pools (a pool still viewed is unmapped with its view)."""
        for m in self.maps.values():
            try:
                m.close()
            except BufferError:
                pass
        self.maps.clear()
        self.sock.close()

    # --- framing ---
    def _frame(self, deadline):
        while True:
            if len(self.buf) >= 4:
                (length,) = struct.unpack_from("<I", self.buf)
                if len(self.buf) >= 4 + length:
                    mtype, _flags, seq = struct.unpack_from("<HHI", self.buf, 4)
                    body = bytes(self.buf[12:4 + length])
                    del self.buf[:4 + length]
                    return mtype, seq, body
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                raise FerryError(405, "timed out waiting for ferryd") from None
            if not chunk:
                raise FerryError(302, "ferryd closed the connection")
            self.buf += chunk

    def _request(self, mtype, body, expect):
        self.seq = self.seq % 0xFFFFFFFF + 1  # 1..2^32-1: seq 0 is for events
        payload = struct.pack("<HHI", mtype, 0, self.seq) + body
        try:
            self.sock.sendall(struct.pack("<I", len(payload)) + payload)
        except (BrokenPipeError, ConnectionResetError) as e:
            # ferryd may have refused this connection before reading anything: its reason
            # (an error with seq 0) is waiting to be read and says more than the broken pipe.
            try:
                rtype, seq, rbody = self._frame(time.monotonic() + 0.1)
            except (FerryError, OSError):
                rtype = None
            if rtype == ERROR and seq == 0:
                raise _error(rbody) from None
            raise FerryError(302, f"writing to ferryd failed: {e}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            rtype, seq, rbody = self._frame(deadline)
            if rtype == EVENT:
                self.events.append(self._event(rbody))
                continue
            if rtype == ERROR and seq == 0:  # about the connection itself; ferryd closes it
                raise _error(rbody)
            if seq != self.seq:
                # One request is outstanding at a time; taking another seq's reply as this one's
                # would shift every later reply.
                raise FerryError(310, f"protocol error: ferryd sent a reply of type {rtype} with "
                                      f"seq {seq}, which matches no outstanding request "
                                      f"(waiting for seq {self.seq})")
            if rtype == ERROR:
                raise _error(rbody)
            if rtype != expect:
                raise FerryError(310, f"unexpected reply type {rtype} (expected {expect})")
            return _Reader(rbody)

    @staticmethod
    def _event(body):
        r = _Reader(body)
        room, status = r.take("QB")
        return Event(room, status, r.str())

    # --- operations ---
    def prepare(self, room, prefill_peers, dst_pages, state_slot=None, aux_row=None):
        """Decode side: where room's bytes land. Exactly one state slot (an int), one aux row.

        prefill_peers: the prefill ferryd control address "host:port", or a list of them (every
        rank of the prefill instance; ferryd picks the ranks this decode rank needs)."""
        if isinstance(prefill_peers, str):
            prefill_peers = [prefill_peers]
        body = struct.pack("<Q", room) + struct.pack("<I", len(prefill_peers))
        body += b"".join(_str(p) for p in prefill_peers) + _u32_list(dst_pages)
        self._request(PREPARE, body + struct.pack("<II", _index(state_slot), _index(aux_row)), OK)

    def send(self, room, src_pages, last=False, state_slot=None, aux_row=None):
        """Prefill side: one chunk; the last chunk carries the one state slot and the aux row."""
        body = struct.pack("<Q", room) + _u32_list(src_pages)
        body += struct.pack("<BII", 1 if last else 0, _index(state_slot), _index(aux_row))
        self._request(SEND, body, OK)

    def poll(self, room):
        r = self._request(POLL, struct.pack("<Q", room), POLL_REPLY)
        room, status = r.take("QB")
        return Event(room, status, r.str())

    def cancel(self, room):
        self._request(CANCEL, struct.pack("<Q", room), OK)

    def subscribe(self, room):
        self._request(SUBSCRIBE, struct.pack("<Q", room), OK)

    def info(self, topic="status"):
        r = self._request(INFO, struct.pack("<B", {"status": 0, "rooms": 1, "peers": 2}[topic]), INFO_REPLY)
        return r.str()

    def wait_terminal(self, room, timeout=60.0):
        """Wait for Success or Failed of a subscribed room; returns the Event."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev.room == room and ev.status in (FAILED, SUCCESS):
                    return self.events.pop(i)
            rtype, seq, body = self._frame(deadline)
            if rtype == ERROR and seq == 0:  # about the connection itself; ferryd closes it
                raise _error(body)
            if rtype != EVENT:  # no request is outstanding while waiting for events
                raise FerryError(310, f"protocol error: ferryd sent a reply of type {rtype} with "
                                      f"seq {seq}, which matches no outstanding request")
            self.events.append(self._event(body))

    # --- memory ---
    def pool(self, kind):
        """The daemon's pool `kind` ("kv", "state", "aux") mapped read-write, as a memoryview."""
        if kind not in self.maps:
            p = self.pools[kind]
            if not p.present:
                raise FerryError(400, f"the daemon has no {kind} pool")
            fd = os.open("/dev/shm" + p.shm_name, os.O_RDWR)
            try:
                self.maps[kind] = mmap.mmap(fd, p.total_bytes)
            finally:
                os.close(fd)
        return memoryview(self.maps[kind])

    def item(self, kind, buffer, index):
        """(offset, length) of item `index` of buffer `buffer` in pool `kind`, bounds-checked."""
        b = self.pools[kind].buffers[buffer]
        if not 0 <= index < b.items:
            raise FerryError(400, f"{kind} item {index} is outside the pool of {b.items}")
        return b.offset + index * b.item_bytes, b.item_bytes
