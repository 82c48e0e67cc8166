#!/usr/bin/env python3
"""Where a room's time goes inside the daemons, from FERRY_TRACE_DIR traces.

Every Sender and Receiver of a daemon started with FERRY_TRACE_DIR=<dir> writes one JSON line per
event it feeds its room's state machine, stamped with the host's monotonic clock ("t_us"; see
actors/room_trace.hpp). Run a prefill and a decode daemon with the same directory, move some
rooms, then:

    scripts/trace-timeline.py <dir>

prints, for every event (side:event, first occurrence per room; side:Success is the event whose
effects report Success), how many rooms had it and the p50 / p90 of its time after the room's
Receiver was created (the decode's prepare reaching its Scheduler), in microseconds, in order.
Tracing writes and flushes a line per event, so the absolute figures include that cost; the
order and the gaps between steps are what it is for.
"""

import argparse
import json
import os
import sys


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def read_trace(path):
    """(kind, room id, [(name, t_us)]) of one trace file; None if it is not a trace."""
    kind = os.path.basename(path).split("-", 1)[0]
    if kind not in ("sender", "receiver"):
        return None
    steps, room = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break  # a daemon killed mid-line: keep what came before
            if "t_us" not in rec:
                raise SystemExit(f"{path}: line {n + 1} has no t_us (a ferryd older than the stamp?)")
            if n == 0:
                room = rec.get("id")
                steps.append(("new", rec["t_us"]))
                continue
            steps.append((rec["event"]["e"], rec["t_us"]))
            for fx in rec.get("effects", []):
                if fx.get("e") == "life" and fx["effects"].get("report") == "Success":
                    steps.append(("Success", rec["t_us"]))
    return kind, room, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the FERRY_TRACE_DIR both daemons wrote to")
    ap.add_argument("--skip", type=int, default=2,
                    help="ignore the rooms with the lowest ids (warm-up; default 2)")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        ap.error(f"{args.dir}: not a directory")
    rooms = {}  # id -> {"receiver": steps, "sender": [steps, ...]}
    for name in sorted(os.listdir(args.dir)):
        got = read_trace(os.path.join(args.dir, name))
        if not got or got[1] is None:
            continue
        kind, room, steps = got
        rooms.setdefault(room, {"receiver": [], "sender": []})[kind].append(steps)
    ids = sorted(r for r, v in rooms.items() if len(v["receiver"]) == 1)[args.skip:]
    if not ids:
        raise SystemExit(f"{args.dir}: no room with its receiver's trace")
    offsets = {}  # "side:event" -> [us after the receiver's creation]
    for r in ids:
        t0 = rooms[r]["receiver"][0][0][1]
        for kind, side in (("receiver", "decode"), ("sender", "prefill")):
            for steps in rooms[r][kind]:
                seen = set()
                for name, t in steps:
                    if name in seen:
                        continue
                    seen.add(name)
                    offsets.setdefault(f"{side}:{name}", []).append(t - t0)
    rows = sorted(offsets.items(), key=lambda kv: percentile(kv[1], 0.5))
    print(f"{len(ids)} rooms; microseconds after the decode's Receiver was created")
    print(f"{'step':32} {'rooms':>6} {'p50':>8} {'p90':>8}")
    for step, vals in rows:
        print(f"{step:32} {len(vals):6} {percentile(vals, 0.5):8} {percentile(vals, 0.9):8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
