"""The engine's tensors are the layout: ferryd pools whose config says only ``memory: client``
are described by what the SGLang adapter registers from SGLang's own ``KVArgs`` (buffers at any
byte offset, Mamba components as ``[layers, size + 1, ...]`` tensors, MetadataBuffers with their
own row sizes and ``bootstrap_room`` not last, an EAGLE draft layer after the target's), against
real ferryd processes, byte for byte; and what ferryd refuses, by name."""

from __future__ import annotations

import shutil
import tempfile
from typing import Iterator

import pytest

from conftest import IO_TIMEOUT, start_daemon, start_pair
from ferry import Client, Errc, FerryError
from ferry.protocol import BufferKind, MemoryBuffer
from ferry.sglang import FerryBootstrap, FerryKVManager, FerryKVReceiver, FerryKVSender, KVPoll

from engine_ranks import BOOT, T, stop_all, wait_all
from sglang_engine_memory import (BOOTSTRAP_ROOM, METADATA_ROWS, REGISTERED_POOLS, Model,
                                  SGLangRank, conv_share)

ROOM = 0x5D3A_0000_0000_0000


class Rank:
    def __init__(self, daemon, mode: str, boot: FerryBootstrap, m: Model, seed: int,
                 aux: str = "memfd") -> None:
        self.mem = SGLangRank(m, name=mode, aux_memory="ordinary" if aux == "hook" else aux,
                              hook=aux == "hook")
        self.mem.fill(seed)
        self.mgr = FerryKVManager(self.mem.kv_args(), mode, socket_path=daemon.sock,
                                  bootstrap=boot, timeout=IO_TIMEOUT * 3, register_timeout=T)

    def close(self) -> None:
        self.mgr.close()
        self.mem.close()


@pytest.fixture(scope="module", params=["memfd", "ordinary", "hook"])
def ranks(request: pytest.FixtureRequest) -> Iterator[tuple[Rank, Rank, object, object]]:
    """MetadataBuffers in the rank's memfd (lent), or in ordinary memory as SGLang allocates
    them (rows copied through the manager's own memfd); "hook": that, with the KV and state
    tensors from ferry.sglang.host_buffer and KVArgs that name no memory regions, as SGLang's."""
    tmp = tempfile.mkdtemp(prefix="ferry-layout-")
    p, d = start_pair(tmp, "prefill-lay", "decode-lay", REGISTERED_POOLS)
    made: list[Rank] = []
    try:
        boot = FerryBootstrap({BOOT: [p.control]})
        made.append(Rank(p, "prefill", boot, Model(), seed=1, aux=request.param))
        made.append(Rank(d, "decode", boot, Model(), seed=2, aux=request.param))
        yield made[0], made[1], p, d
    finally:
        for r in reversed(made):
            r.close()
        stop_all([p, d])
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_registration_describes_the_pools(ranks) -> None:
    p, d, pd, _ = ranks
    with Client(pd.sock, name="observer", timeout=IO_TIMEOUT) as c:
        kv, state, aux = c.pools["kv"], c.pools["state"], c.pools["aux"]
    m = p.mem.m
    # K of the target's layers and the draft's (its own layer set: moved past the target's),
    # then V the same way
    draft = max(m.kv_layers) + 1
    assert [(b.kind, b.layer_id) for b in kv.buffers] == \
        [(BufferKind.K, 3), (BufferKind.K, 7), (BufferKind.K, draft),
         (BufferKind.V, 3), (BufferKind.V, 7), (BufferKind.V, draft)]
    assert {b.items for b in kv.buffers} == {p.mem.kv_pages}
    assert [(b.tensor, b.layer_id, b.items) for b in state.buffers] == \
        [(0, 0, m.slots + 1), (0, 1, m.slots + 1), (1, 0, m.slots + 1), (1, 1, m.slots + 1)]
    assert [b.item_bytes for b in aux.buffers] == METADATA_ROWS
    # The buffers keep the engine's byte offsets within each page (nothing was moved to fit)
    assert {b.offset % 4096 for b in kv.buffers} == \
        {(p.mem.places[k]) % 4096 for k in p.mem.kv_keys()}


def test_a_room_moves_every_buffer_byte_exact(ranks) -> None:
    p, d, _, _ = ranks
    room = ROOM + 1
    src_pages, dst_pages, src_slot, dst_slot, src_row, dst_row = [1, 2, 3], [10, 11, 12], 2, 4, 3, 5
    room_at = p.mem.meta_at(BOOTSTRAP_ROOM, src_row)  # SGLang's set_buf on the last chunk
    p.mem.meta_view[room_at:room_at + 8] = room.to_bytes(8, "little")
    before = bytes(d.mem.view[d.mem.kv_at("K3", 13):d.mem.kv_at("K3", 14)])
    r = FerryKVReceiver(d.mgr, BOOT, room)
    s = FerryKVSender(p.mgr, BOOT, room, [0], 0)
    r.init(0)
    r.send_metadata(dst_pages, aux_index=dst_row, state_indices=[[dst_slot]])
    assert wait_all([s], KVPoll.WaitingForInput) == [KVPoll.WaitingForInput]
    s.init(len(src_pages), src_row)
    s.send(src_pages, [[src_slot]])
    assert wait_all([s, r]) == [KVPoll.Success, KVPoll.Success], (s.failure, r.failure)
    bad = []
    for key in p.mem.kv_keys():
        for sp, dp in zip(src_pages, dst_pages):
            a = p.mem.view[p.mem.kv_at(key, sp):p.mem.kv_at(key, sp) + p.mem.kv_item]
            b = d.mem.view[d.mem.kv_at(key, dp):d.mem.kv_at(key, dp) + d.mem.kv_item]
            if a != b:
                bad.append(f"{key} page {sp} -> {dp}")
    for t, item in (("conv", p.mem.conv_item), ("ssm", p.mem.ssm_item)):
        for li in range(len(p.mem.m.mamba_layers)):
            a0, b0 = p.mem.state_at(t, li, src_slot), d.mem.state_at(t, li, dst_slot)
            if p.mem.view[a0:a0 + item] != d.mem.view[b0:b0 + item]:
                bad.append(f"{t} layer {li} slot {src_slot} -> {dst_slot}")
    for i, rb in enumerate(METADATA_ROWS):
        a0, b0 = p.mem.meta_at(i, src_row), d.mem.meta_at(i, dst_row)
        if p.mem.meta_view[a0:a0 + rb] != d.mem.meta_view[b0:b0 + rb]:
            bad.append(f"metadata {i} row {src_row} -> {dst_row}")
    assert not bad, bad
    assert bytes(d.mem.view[d.mem.kv_at("K3", 13):d.mem.kv_at("K3", 14)]) == before
    got = d.mem.meta_view[d.mem.meta_at(BOOTSTRAP_ROOM, dst_row):][:8]
    assert int.from_bytes(got, "little") == room  # SGLang's metadata gate sees its room


def test_the_room_id_check_reads_the_bootstrap_room_buffer(ranks) -> None:
    p, _, _, _ = ranks
    room = ROOM + 2
    p.mem.meta_view[p.mem.meta_at(BOOTSTRAP_ROOM, 1):][:8] = (room + 1).to_bytes(8, "little")
    p.mem.meta_view[p.mem.meta_at(0, 1):][:8] = room.to_bytes(8, "little")  # buffer 0 is not it
    if p.mgr.aux_shadow is not None:  # what the sender's last chunk does first
        p.mgr.aux_shadow.stage(1)
    with pytest.raises(FerryError) as e:
        p.mgr.client.send(room, [], True, state_slot=0, aux_row=1)
    assert e.value.code == Errc.INVALID_REQUEST
    assert f"src aux row 1 carries room id {room + 1}, expected {room}" in e.value.message


def test_a_mis_shaped_registration_is_refused_by_name(tmp_path) -> None:
    p, d = start_pair(str(tmp_path), "prefill-bad", "decode-bad", REGISTERED_POOLS)
    try:
        rank = SGLangRank(Model(draft_layer=None), name="bad")
        try:
            with Client(p.sock, name="bad", timeout=IO_TIMEOUT) as c:
                k = [MemoryBuffer(0, rank.places["K3"], rank.kv_item, 8, 3, 0, BufferKind.K, 2, 2),
                     MemoryBuffer(0, rank.places["K7"], rank.kv_item * 2, 4, 7, 0, BufferKind.K,
                                  2, 2),
                     MemoryBuffer(0, rank.places["V3"], rank.kv_item, 8, 3, 0, BufferKind.V, 2, 2),
                     MemoryBuffer(0, rank.places["V7"], rank.kv_item, 8, 7, 0, BufferKind.V, 2, 2)]
                with pytest.raises(FerryError) as e:
                    c.register_memory("kv", k, [rank.fd], page_tokens=1)
                assert e.value.message == (
                    f"pool kv: buffer 1 (K of layer 7) has page size {rank.kv_item * 2}, buffer 0 "
                    f"(K of layer 3) {rank.kv_item}: they must be the same")
                swapped = [k[0], k[2]._replace(fd_offset=rank.places["K7"])]
                with pytest.raises(FerryError) as e:
                    c.register_memory("kv", [swapped[1], swapped[0]], [rank.fd], page_tokens=1)
                assert "buffer 0 is V of layer 3, expected K" in e.value.message
                overlap = [k[0], k[0]._replace(layer_id=7, fd_offset=rank.places["K3"] + 8)]
                overlap += [k[2], k[2]._replace(layer_id=7, fd_offset=rank.places["V7"])]
                with pytest.raises(FerryError) as e:
                    c.register_memory("kv", overlap, [rank.fd], page_tokens=1)
                assert e.value.message == "pool kv: buffers 0 and 1 overlap in fd 0"
                import fcntl
                import os
                from ferry.memory import F_ADD_SEALS, F_SEAL_SHRINK
                sealed = os.memfd_create("ferry-sealed", os.MFD_ALLOW_SEALING)
                try:
                    os.ftruncate(sealed, rank.size)
                    fcntl.fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK | 0x0008)  # F_SEAL_WRITE
                    with pytest.raises(FerryError) as e:
                        c.register_memory("kv", [k[0], k[0]._replace(fd_offset=rank.places["K7"],
                                                                     layer_id=7), k[2], k[3]],
                                          [sealed], page_tokens=1)
                    assert e.value.message == ("pool kv: fd 0 is sealed against writing: "
                                               "ferryd's fabric writes land in it")
                finally:
                    os.close(sealed)
        finally:
            rank.close()
    finally:
        stop_all([p, d])


def test_tp2_to_tp1_reslices_registered_pools_byte_exact(tmp_path) -> None:
    """Two prefill ranks at TP 2 (each holds one KV head, half of every conv group and half the
    temporal heads) to one decode rank at TP 1, every pool described by its registration. The
    expected bytes are gathered from the slicing rules, not from the planner."""
    extra = "tp: {{size: 2, rank: {}}}\n"
    p0 = start_daemon(str(tmp_path), "prefill-t0", "prefill", REGISTERED_POOLS, extra.format(0))
    p1 = start_daemon(str(tmp_path), "prefill-t1", "prefill", REGISTERED_POOLS, extra.format(1))
    d = start_daemon(str(tmp_path), "decode-t", "decode", REGISTERED_POOLS)
    daemons, made = [p0, p1, d], []
    try:
        boot = FerryBootstrap({BOOT: [p0.control, p1.control]})
        m = Model()
        src = []
        for rank, daemon in enumerate((p0, p1)):
            mem = SGLangRank(m, tp_size=2, tp_rank=rank, name=f"p{rank}")
            mem.fill(10 + rank)
            made.append(mem)
            src.append((mem, FerryKVManager(mem.kv_args(), "prefill", socket_path=daemon.sock,
                                            bootstrap=boot, timeout=IO_TIMEOUT * 3)))
        dst = SGLangRank(m, name="d")
        dst.fill(20)
        made.append(dst)
        dmgr = FerryKVManager(dst.kv_args(), "decode", socket_path=d.sock, bootstrap=boot,
                              timeout=IO_TIMEOUT * 3)
        room, pages_s, pages_d, slot_s, slot_d, row_s, row_d = ROOM + 9, [4, 5], [20, 21], 1, 3, 2, 6
        for mem, _ in src:
            mem.meta_view[mem.meta_at(BOOTSTRAP_ROOM, row_s):][:8] = room.to_bytes(8, "little")
        r = FerryKVReceiver(dmgr, BOOT, room)
        senders = [FerryKVSender(mgr, BOOT, room, [0], 0) for _, mgr in src]
        r.init(0)
        r.send_metadata(pages_d, aux_index=row_d, state_indices=[[slot_d]])
        assert wait_all(senders, KVPoll.WaitingForInput) == [KVPoll.WaitingForInput] * 2
        for s in senders:
            s.init(len(pages_s), row_s)
            s.send(pages_s, [[slot_s]])
        assert wait_all(senders + [r]) == [KVPoll.Success] * 3, [x.failure for x in senders + [r]]
        want = bytearray()
        got = bytearray()
        head = m.head_dim * 2
        for key in dst.kv_keys():
            for sp, dp in zip(pages_s, pages_d):
                for rank, (mem, _) in enumerate(src):  # decode head h <- rank h (one head each)
                    at = mem.kv_at(key, sp)
                    want += mem.view[at:at + head]
                at = dst.kv_at(key, dp)
                got += dst.view[at:at + 2 * head]
        row = (m.conv_k - 1) * 2  # one conv channel of one slot, bf16
        for li in range(len(m.mamba_layers)):
            for g, size in enumerate(m.conv_groups):  # each group halved over the ranks
                for rank, (mem, _) in enumerate(src):
                    at = mem.state_at("conv", li, slot_s) + sum(m.conv_groups[:g]) // 2 * row
                    want += mem.view[at:at + size // 2 * row]
            at = dst.state_at("conv", li, slot_d)
            got += dst.view[at:at + dst.conv_item]
            for rank, (mem, _) in enumerate(src):  # temporal heads halved
                at = mem.state_at("ssm", li, slot_s)
                want += mem.view[at:at + mem.ssm_item]
            at = dst.state_at("ssm", li, slot_d)
            got += dst.view[at:at + dst.ssm_item]
        for i, rb in enumerate(METADATA_ROWS):  # the rows come from TP rank 0
            at = src[0][0].meta_at(i, row_s)
            want += src[0][0].meta_view[at:at + rb]
            at = dst.meta_at(i, row_d)
            got += dst.meta_view[at:at + rb]
        assert got == want
        dmgr.close()
        for _, mgr in src:
            mgr.close()
    finally:
        for mem in made:
            mem.close()
        stop_all(daemons)


def test_tp1_to_tp2_mamba2_with_n_groups_1_gives_each_decode_rank_the_whole_b_and_c(
        tmp_path) -> None:
    """A Mamba2-shaped conv [x | B | C] = [256 | 64 | 64] whose units are [4 heads, 1, 1]
    (n_groups 1, Ferry's ``state_conv_shard_units``), registered through the adapter: one prefill
    rank at TP 1 to two decode ranks at TP 2. Each decode rank must get its half of x and the
    whole B and C, gathered here from the rules, byte for byte."""
    extra = "tp: {{size: 2, rank: {}}}\n"
    p = start_daemon(str(tmp_path), "prefill-m2", "prefill", REGISTERED_POOLS)
    d0 = start_daemon(str(tmp_path), "decode-m0", "decode", REGISTERED_POOLS, extra.format(0))
    d1 = start_daemon(str(tmp_path), "decode-m1", "decode", REGISTERED_POOLS, extra.format(1))
    daemons, made, mgrs = [p, d0, d1], [], []
    try:
        boot = FerryBootstrap({BOOT: [p.control]})
        m = Model(conv_groups=[256, 64, 64], conv_units=[4, 1, 1])
        src = SGLangRank(m, name="p")
        src.fill(30)
        made.append(src)
        smgr = FerryKVManager(src.kv_args(), "prefill", socket_path=p.sock, bootstrap=boot,
                              timeout=IO_TIMEOUT * 3)
        mgrs.append(smgr)
        dst = []
        for rank, daemon in enumerate((d0, d1)):
            mem = SGLangRank(m, tp_size=2, tp_rank=rank, name=f"d{rank}")
            mem.fill(40 + rank)
            made.append(mem)
            assert mem.conv_dim == 128 + 64 + 64
            mgr = FerryKVManager(mem.kv_args(), "decode", socket_path=daemon.sock,
                                 bootstrap=boot, timeout=IO_TIMEOUT * 3)
            mgrs.append(mgr)
            dst.append((mem, mgr))
        room, slot_s, slot_d, row_s, row_d = ROOM + 21, 1, 2, 3, 4
        src.meta_view[src.meta_at(BOOTSTRAP_ROOM, row_s):][:8] = room.to_bytes(8, "little")
        receivers = [FerryKVReceiver(mgr, BOOT, room) for _, mgr in dst]
        sender = FerryKVSender(smgr, BOOT, room, [0], 0)
        for r in receivers:
            r.init(0)
            r.send_metadata([10, 11], aux_index=row_d, state_indices=[[slot_d]])
        assert wait_all([sender], KVPoll.WaitingForInput) == [KVPoll.WaitingForInput]
        sender.init(2, row_s)
        sender.send([5, 6], [[slot_s]])
        assert wait_all([sender] + receivers) == [KVPoll.Success] * 3, \
            [x.failure for x in [sender] + receivers]
        row = (m.conv_k - 1) * 2  # one conv channel of one slot, bf16
        for rank, (mem, _) in enumerate(dst):
            for li in range(len(m.mamba_layers)):
                want = bytearray()
                for g in range(len(m.conv_groups)):
                    first, count = conv_share(m, g, 2, rank)
                    at = src.state_at("conv", li, slot_s) + (sum(m.conv_groups[:g]) + first) * row
                    want += src.view[at:at + count * row]
                at = mem.state_at("conv", li, slot_d)
                assert mem.view[at:at + mem.conv_item] == want, (rank, li)
                assert len(want) == (128 + 64 + 64) * row
    finally:
        for mgr in reversed(mgrs):
            mgr.close()
        for mem in made:
            mem.close()
        stop_all(daemons)


def test_a_prefill_whose_pools_wait_for_their_registration_refuses_handshakes_by_name(
        tmp_path) -> None:
    """Until its engine registered, a prefill ferryd cannot tell a peer its layout: a decode's
    prepare naming it fails at once, saying which pool waits for what."""
    p, d = start_pair(str(tmp_path), "prefill-wait", "decode-wait", REGISTERED_POOLS)
    made: list[Rank] = []
    try:
        boot = FerryBootstrap({BOOT: [p.control]})
        made.append(Rank(d, "decode", boot, Model(), seed=3))
        r = FerryKVReceiver(made[0].mgr, BOOT, ROOM + 30)
        r.init(0)
        r.send_metadata([1], aux_index=0, state_indices=[[0]])
        assert wait_all([r]) == [KVPoll.Failed]
        assert r.failure is not None
        code, reason = r.failure
        assert code == Errc.PEER_INCOMPATIBLE, r.failure
        assert ("pool kv of prefill-wait is described by its engine's register_memory, which has "
                "not come yet") in reason, reason
        # once the prefill's engine registered, the next room goes through
        made.append(Rank(p, "prefill", boot, Model(), seed=4))
        room = ROOM + 31
        made[1].mem.meta_view[made[1].mem.meta_at(BOOTSTRAP_ROOM, 0):][:8] = \
            room.to_bytes(8, "little")
        r = FerryKVReceiver(made[0].mgr, BOOT, room)
        s = FerryKVSender(made[1].mgr, BOOT, room, [0], 0)
        r.init(0)
        r.send_metadata([1], aux_index=0, state_indices=[[0]])
        assert wait_all([s], KVPoll.WaitingForInput) == [KVPoll.WaitingForInput]
        s.init(1, 0)
        s.send([2], [[1]])
        assert wait_all([s, r]) == [KVPoll.Success, KVPoll.Success], (s.failure, r.failure)
    finally:
        for x in reversed(made):
            x.close()
        stop_all([p, d])


def test_a_later_registration_must_describe_the_first_ones_pools(tmp_path) -> None:
    """The first registration fixes a pool's layout for ferryd's life (peers planned with it):
    an engine that comes back with the same tensors registers again; one with other tensors is
    refused, naming the first difference."""
    p, d = start_pair(str(tmp_path), "prefill-again", "decode-again", REGISTERED_POOLS)
    try:
        boot = FerryBootstrap({BOOT: [p.control]})
        Rank(d, "decode", boot, Model(), seed=5).close()
        Rank(d, "decode", boot, Model(), seed=6).close()  # the same tensors: registered again
        bigger = SGLangRank(Model(tokens=128), name="bigger")
        try:
            with pytest.raises(FerryError) as e:
                FerryKVManager(bigger.kv_args(), "decode", socket_path=d.sock, bootstrap=boot,
                               timeout=IO_TIMEOUT * 3, register_timeout=T)
            assert e.value.code == Errc.INVALID_REQUEST
            assert e.value.message.startswith("pool kv: this registration differs from the first "
                                              "one: buffer 0 is K of layer 3"), e.value.message
            assert e.value.message.endswith(
                "a pool's layout is fixed by its first registration for the life of ferryd "
                "(peers planned with it): restart ferryd to change it")
        finally:
            bigger.close()
    finally:
        stop_all([p, d])


def test_the_cpp_clients_engine_memory_refuses_a_pool_its_registration_describes(
        tmp_path) -> None:
    """ferry-bench lends memory laid out as a config says; a pool whose layout is an engine's
    own tensors is refused by name, not lent as something else."""
    import subprocess
    from conftest import BIN_DIR
    p, d = start_pair(str(tmp_path), "prefill-cpp", "decode-cpp", REGISTERED_POOLS)
    try:
        r = subprocess.run([str(BIN_DIR / "ferry-bench"), "--prefill-socket", p.sock,
                            "--decode-socket", d.sock, "--requests", "1", "--no-baseline"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert ("pool kv of ferryd is described by its engine's registration (memory: client and "
                "nothing else in its config): engine_memory lays out only pools a config "
                "describes; register the engine's own tensors with register_memory (protocol "
                "v7)") in r.stderr + r.stdout, r.stderr + r.stdout
    finally:
        stop_all([p, d])


# A small Nemotron-H: Mamba2 layers 0 and 1 (4 heads of 64, n_groups 1, state 64, kernel 4),
# attention layers 3 and 7 (2 KV heads of 64): the layout of Model(conv_groups=[256, 64, 64],
# conv_units=[4, 1, 1], conv_k=4, ssm=(64, 64)) without a draft layer.
SMALL_NEMOTRON_H = """{"architectures": ["NemotronHForCausalLM"], "torch_dtype": "bfloat16",
 "hybrid_override_pattern": "MM-*---*", "num_attention_heads": 2, "num_key_value_heads": 2,
 "head_dim": 64, "mamba_num_heads": 4, "mamba_head_dim": 64, "n_groups": 1,
 "ssm_state_size": 64, "conv_kernel": 4}"""


def test_a_registration_unlike_the_model_catalogues_layout_is_refused_by_name(tmp_path) -> None:
    """With model.config_json, the engine's registration stays the source of truth, and the
    catalogue checks it: the model's own tensors register; tensors of another shape are refused,
    naming the field and both values."""
    config_json = tmp_path / "config.json"
    config_json.write_text(SMALL_NEMOTRON_H)
    model = f"model:\n  config_json: {config_json}\n  state_covers: n\n"
    p = start_daemon(str(tmp_path), "prefill-cat", "prefill", REGISTERED_POOLS, model)
    try:
        boot = FerryBootstrap({BOOT: [p.control]})
        shaped = dict(conv_groups=[256, 64, 64], conv_units=[4, 1, 1], conv_k=4, ssm=(64, 64),
                      draft_layer=None)
        wrong = SGLangRank(Model(kv_heads=4, **shaped), name="wrong")
        try:
            with pytest.raises(FerryError) as e:
                FerryKVManager(wrong.kv_args(), "prefill", socket_path=p.sock, bootstrap=boot,
                               timeout=IO_TIMEOUT * 3, register_timeout=T)
            assert e.value.code == Errc.INVALID_REQUEST
            assert e.value.message == (
                "pool kv: the registration does not match the model: kv_heads 4, but "
                "model.config_json's NemotronHForCausalLM (sglang) at TP 1 rank 0 gives 2")
        finally:
            wrong.close()
        Rank(p, "prefill", boot, Model(**shaped), seed=7).close()  # the model's own: registered
    finally:
        stop_all([p])
