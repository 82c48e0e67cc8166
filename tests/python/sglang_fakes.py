"""The model daemons and engines of the SGLang adapter's tests (test_sglang_*.py): a prefill
and a decode fake ferryd sharing one model of the rooms (:class:`World`), each serving every
connection in its own thread and logging every request it receives, and an engine rank of each
side (memfd pools, KVArgs and a manager) wired to them by :class:`Setup`.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Optional

import pytest

from conftest import IO_TIMEOUT, FakeConn
from ferry import Errc
from ferry.memory import F_SEAL_SHRINK, MemfdPool, seals
from ferry.protocol import (Buffer, BufferKind, Cancel, Discover, DiscoveredRank, DiscoverReply,
                            Error, Hello, HelloReply, Message, Ok, Poll, PollMany, PollManyReply,
                            PollReply, PollResult, Pool, Prepare, RegisterMemory, Send, Status)
from ferry.sglang import (FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver,
                          FerryKVSender, FerryKVTransferError)

PAGE_TOKENS = 16
BOOT = "10.0.0.10:8998"  # the prefill instance's bootstrap address, as SGLang's requests carry
PREFILL_RANKS = ["127.0.0.1:7401", "127.0.0.1:7402"]


def layout(client_memory: bool = True) -> tuple[Pool, Pool, Pool]:
    name = (lambda k: "") if client_memory else (lambda k: f"/ferry.fake.{k}")
    kv = Pool(True, name("kv"), 4 * 4096, (Buffer(0, 256, 16, 3, 0, BufferKind.K),
                                           Buffer(4096, 256, 16, 7, 0, BufferKind.K),
                                           Buffer(8192, 256, 16, 3, 0, BufferKind.V),
                                           Buffer(12288, 256, 16, 7, 0, BufferKind.V)))
    state = Pool(True, name("state"), 2 * 4096, (Buffer(0, 128, 4, 0, 0, BufferKind.STATE),
                                                 Buffer(4096, 512, 4, 0, 1, BufferKind.STATE)))
    aux = Pool(True, name("aux"), 4096, (Buffer(0, 64, 8, 0, 0, BufferKind.AUX),))
    return kv, state, aux


class World:
    """What the two fake daemons know about rooms, and every request they received."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, Message]] = []  # (role, request)
        self.prepares: dict[int, Prepare] = {}
        self.sends: dict[int, list[Send]] = {}
        self.failed: dict[int, tuple[int, str]] = {}
        self.refuse: dict[tuple[str, int], Error] = {}  # (role, room) -> the error reply
        self.registered: list[tuple[str, int, int, int, list[tuple[int, int]]]] = []
        self.state_types: list[tuple[str, int]] = []  # (role, state_type) of state pools
        self.instances: dict[str, list[DiscoveredRank]] = {}  # discover's answers

    def requests(self, role: str, *types: type) -> list[Message]:
        with self.lock:
            return [m for r, m in self.log if r == role and (not types or isinstance(m, types))]

    def status(self, role: str, room: int) -> Optional[PollResult]:
        """None: unknown to that side."""
        if room in self.failed:
            code, why = self.failed[room]
            return PollResult(room, Status.Failed, code, why)
        sends = self.sends.get(room, [])
        if any(s.last for s in sends) and room in self.prepares:
            return PollResult(room, Status.Success, Errc.OK, "")
        if role == "decode":
            if room not in self.prepares:
                return None
            return PollResult(room, Status.Transferring if sends else Status.WaitingForInput,
                              Errc.OK, "")
        if room not in self.prepares:
            return PollResult(room, Status.Bootstrapping, Errc.OK, "")
        # a prefill answers the decode's prefix once the prepare arrived, as ferryd does
        return PollResult(room, Status.Transferring if sends else Status.WaitingForInput,
                          Errc.OK, "", self.prepares[room].prefix_tokens)


class ModelDaemon:
    """A fake ferryd of one role: a unix socket server, one thread per connection."""

    def __init__(self, directory: str, role: str, world: World, client_memory: bool = True,
                 version: int = 4, state_type: str = "mamba") -> None:
        self.role, self.world, self.version = role, world, version
        # the effective config names a state pool's type unless it is mamba, as ferryd's does
        self.config_yaml = "" if state_type == "mamba" else \
            f"pools:\n  mamba:\n    type: {state_type}\n"
        self.pools = layout(client_memory)
        self.path = os.path.join(directory, role + ".sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(8)
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def vanish(self) -> None:
        """The daemon goes away and does not come back: its connections close, nothing
        listens at its socket (a client's reconnect attempts fail)."""
        self.stop = True
        self.srv.close()
        os.unlink(self.path)
        for sock in self.socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self.stop:
            try:
                sock, _ = self.srv.accept()
            except OSError:
                return
            self.socks.append(sock)
            t = threading.Thread(target=self._serve, args=(FakeConn(sock),), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, c: FakeConn) -> None:
        try:
            while True:
                seq, msg = c.recv()
                with self.world.lock:
                    self.world.log.append((self.role, msg))
                    reply = self._answer(c, msg)
                c.send(reply, seq)
        except EOFError:
            pass
        except BaseException as e:  # reported by close()
            self.errors.append(e)
        finally:
            c.close_fds()
            c.sock.close()

    def _answer(self, c: FakeConn, msg: Message) -> Message:
        w = self.world
        if isinstance(msg, Hello):
            c.version = min(msg.version, self.version)  # the requests that follow
            return HelloReply(version=c.version, node=f"fake-{self.role}", instance="0",
                              role=self.role, control="127.0.0.1:7401", page_tokens=PAGE_TOKENS,
                              config_yaml=self.config_yaml, pools=self.pools, min_version=3,
                              max_version=self.version)
        if isinstance(msg, RegisterMemory):
            fds = list(c.fds)
            assert len(fds) == msg.fd_count
            sizes = [os.fstat(fd).st_size for fd in fds]
            assert all(seals(fd) & F_SEAL_SHRINK for fd in fds)
            for b in msg.buffers:
                assert b.fd_offset % 4096 == 0
                assert b.fd_offset + b.item_bytes * b.items <= sizes[b.fd_index]
            want = self.pools[msg.pool].buffers
            assert [(b.item_bytes, b.items, b.layer_id, b.tensor, b.kind) for b in msg.buffers] \
                == [(b.item_bytes, b.items, b.layer_id, b.tensor, b.kind) for b in want]
            w.registered.append((self.role, msg.pool, msg.fd_count, len(msg.buffers),
                                 [(b.fd_index, b.fd_offset) for b in msg.buffers]))
            if msg.pool == 1:
                w.state_types.append((self.role, int(msg.state_type)))
            c.close_fds()
            return Ok()
        room = getattr(msg, "room", None)
        if room is not None and (self.role, room) in w.refuse:
            return w.refuse[(self.role, room)]
        if isinstance(msg, Prepare):
            w.prepares[msg.room] = msg
            return Ok()
        if isinstance(msg, Send):
            w.sends.setdefault(msg.room, []).append(msg)
            return Ok()
        if isinstance(msg, Cancel):
            st = w.status(self.role, msg.room)
            unseen = msg.room not in w.prepares and msg.room not in w.sends  # as ferryd
            if st is None or unseen:
                return Error(Errc.UNKNOWN_ROOM, f"room {msg.room} is unknown")
            if st.terminal:
                return Error(Errc.ROOM_FINISHED, f"room {msg.room} already finished")
            w.failed[msg.room] = (Errc.CANCELLED, "cancelled by client")
            return Ok()
        if isinstance(msg, Poll):
            st = w.status(self.role, msg.room)
            if st is None:
                return Error(Errc.UNKNOWN_ROOM, f"room {msg.room} is unknown")
            return PollReply(st.room, st.status, st.code, st.reason, st.prefix_tokens)
        if isinstance(msg, Discover):
            if msg.address not in w.instances:
                return Error(Errc.INVALID_REQUEST, f"discover: '{msg.address}' is not host:port")
            return DiscoverReply(w.instances[msg.address])
        if isinstance(msg, PollMany):
            out = []
            for r in msg.rooms:
                st = w.status(self.role, r)
                out.append(st if st is not None else
                           PollResult(r, Status.Failed, Errc.UNKNOWN_ROOM, f"room {r} is unknown"))
            return PollManyReply(out)
        raise AssertionError(f"the fake {self.role} ferryd does not serve {msg!r}")

    def close(self) -> None:
        self.stop = True
        self.srv.close()
        for t in self.threads:
            t.join(IO_TIMEOUT)
        if self.errors:
            raise self.errors[0]


class Engine:
    """One engine rank: its memfd pools, KVArgs and manager."""

    def __init__(self, daemon: ModelDaemon, mode: str, bootstrap: FerryBootstrap,
                 per_buffer: bool = False, state_type: str = "mamba", mla: bool = False
                 ) -> None:
        kv, state, aux = daemon.pools
        self.kv = MemfdPool("kv", kv, per_buffer=per_buffer)
        self.state = MemfdPool("state", state, per_buffer=per_buffer)
        self.aux = MemfdPool("aux", aux)
        self.args = FerryKVArgs.from_memfd_pools(kv=self.kv, state=self.state, aux=self.aux,
                                                 page_size=PAGE_TOKENS, state_type=state_type)
        try:
            self.mgr = FerryKVManager(self.args, mode, is_mla_backend=mla,
                                      socket_path=daemon.path, bootstrap=bootstrap,
                                      timeout=IO_TIMEOUT, drain_timeout=2.0)
        except BaseException:
            for p in (self.kv, self.state, self.aux):
                p.close()
            raise

    def close(self) -> None:
        self.mgr.close()
        for p in (self.kv, self.state, self.aux):
            p.close()


class Setup:
    def __init__(self, tmp: str, version: int = 4) -> None:
        self.world = World()
        self.bootstrap = FerryBootstrap({BOOT: PREFILL_RANKS})
        self.pd = ModelDaemon(tmp, "prefill", self.world, version=version)
        self.dd = ModelDaemon(tmp, "decode", self.world, version=version)
        self.prefill = Engine(self.pd, "prefill", self.bootstrap)
        self.decode = Engine(self.dd, "decode", self.bootstrap, per_buffer=True)

    def receiver(self, room: int) -> FerryKVReceiver:
        r = FerryKVReceiver(self.decode.mgr, BOOT, room)
        r.init(0)
        return r

    def sender(self, room: int) -> FerryKVSender:
        return FerryKVSender(self.prefill.mgr, BOOT, room, [0], 0)

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()
        self.pd.close()
        self.dd.close()


def failure(obj: Any) -> FerryKVTransferError:
    with pytest.raises(FerryKVTransferError) as info:
        obj.failure_exception()
    return info.value
