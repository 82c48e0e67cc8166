#!/usr/bin/python3
"""The plots of docs/performance.md: runs the benches they need (scripts/bench.sh, which starts
each prefill/decode ferryd pair, and ucx_perftest), keeps every figure in one JSON file, and
draws PNGs into docs/img/. Or draws them again from that JSON file (--from-json) without
running anything.

  scripts/perf-plots.py --install          the Debian packages it needs (python3-matplotlib,
                                           ucx-utils), those missing only, then exits
  scripts/perf-plots.py --quick            every bench briefly (under ~3 minutes): checks the
                                           script, not figures to publish
  scripts/perf-plots.py                    the full runs (about 15 minutes on 2 cores)
  scripts/perf-plots.py --from-json docs/img/perf-results.json    redraw only

Plots (docs/img/perf-*.png):
  perf-bulk.png         bulk 4096-token Qwen3-Next rooms: Ferry GB/s against the raw
                        fi_writedata baseline of the same run, per provider
  perf-small-rooms.png  16-token rooms at concurrency 64: rooms/s against the raw baseline
  perf-latency.png      one small room at a time, prepare to Success: Ferry against the raw
                        latency reference (one TCP message + the room's writes, Ferry's wait
                        policy) and its single-write variant, back to back and after an idle gap
  perf-open-loop.png    Poisson arrivals of 16/4096/32768-token rooms: per-class p50 and p99
  perf-write-sizes.png  GB/s by write size: Ferry, the raw baseline and ucx_perftest put_bw
                        (UCX_TLS=tcp and UCX_TLS=sm), the same sizes

Needs a built tree (scripts/build.sh; FERRY_BUILD_DIR as bench.sh takes it), /usr/bin/python3
with python3-matplotlib, and ucx-utils for the UCX series (skipped, and said so, without it).
Every run is bounded: bench.sh's ferry-bench runs by their counts, ucx_perftest by a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("python3-matplotlib", "ucx-utils")  # beyond scripts/install-deps.sh
PROVIDERS = ("tcp", "shm")
# ucx_perftest transports beside each Ferry provider: loopback TCP, and UCX's shared-memory
# transports (posix, sysv, cma) for shm.
UCX_TLS = {"tcp": "tcp", "shm": "sm"}
# The write sizes of the size sweep: MODEL=kv rooms of TOKENS tokens are 24 writes (12 layers x
# K and V) of TOKENS KiB each (Qwen3-Next: 1 KiB per token and layer buffer): 4 KiB (shm's
# inject size), 16 KiB (a 16-token room's KV writes), 64 KiB and 1 MiB (the piece size). Each
# (tokens, concurrency, rooms quick, rooms full).
SWEEP = ((4, 64, 256, 4096), (16, 64, 256, 4096), (64, 32, 128, 2048), (1024, 8, 16, 256))
OPEN_LOOP_MIX = "16:0.90,4096:0.09,32768:0.01"


class PlotError(Exception):
    """A bench or a document that cannot give the figures asked for."""


# --------------------------------------------------------------------------------------------
# What the runs are (full and quick)


def plan(quick: bool) -> dict:
    """Every bench run: bench.sh environments and, for BENCH_RUNS, one line per ferry-bench run."""
    q = quick
    return {
        "bulk": {"env": {"MODEL": "qwen3-next", "PAGES": "16", "TOKENS": "4096",
                         "REQUESTS": "4" if q else "16", "CONCURRENCY": "4",
                         "REPEAT": "1" if q else "3"}},
        # One pair per provider for the small-room runs: kv pools of 160k tokens (3.75 GiB per
        # daemon), five 32k-token rooms: with three, the open loop's 32k rooms met full pools.
        "small": {"env": {"MODEL": "small", "PAGES": "1", "KV_TOKENS": "163840"},
                  "runs": [
                      f"--prompt-tokens 16 --concurrency 64 --requests {512 if q else 4096} "
                      f"--repeat {1 if q else 3}",
                      f"--latency --prompt-tokens 16 --requests {20 if q else 200} --gap-ms 0,50",
                      f"--open-loop 100 --mix {OPEN_LOOP_MIX} "
                      f"--duration-s {3 if q else 20} --no-baseline",
                  ]},
        "sizes": {"env": {"MODEL": "kv", "PAGES": "1", "KV_TOKENS": "20480"},
                  "runs": [f"--prompt-tokens {t} --concurrency {c} --requests {nq if q else n} "
                           f"--repeat {1 if q else 3}" for t, c, nq, n in SWEEP]},
        # ucx_perftest iterations per write size: about 8 MiB (quick) or 512 MiB of puts.
        "ucx_iterations": {t * 1024: max(50, (8 if q else 512) * 1024 // t) for t, *_ in SWEEP},
    }


# --------------------------------------------------------------------------------------------
# Running


def install() -> int:
    missing = [p for p in PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                 text=True).stdout.find("install ok installed") < 0]
    if not missing:
        print("perf-plots: all packages present")
        return 0
    print(f"perf-plots: installing {' '.join(missing)}")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-q", *missing], check=True, env=env)
    return 0


def bench(provider: str, env: dict, runs: list[str] | None, work: Path, name: str) -> list[dict]:
    """scripts/bench.sh for one provider; the JSON documents it kept (one per run)."""
    out = work / f"{name}-{provider}.json"
    e = dict(os.environ, PROVIDERS=provider, BENCH_JSON=str(out), **env)
    if runs:
        rf = work / f"{name}-runs.txt"
        rf.write_text("\n".join(runs) + "\n")
        e["BENCH_RUNS"] = str(rf)
    print(f"perf-plots: {name} on {provider}: {' '.join(f'{k}={v}' for k, v in env.items())}",
          flush=True)
    r = subprocess.run([str(REPO / "scripts/bench.sh")], env=e, text=True, timeout=1800)
    if r.returncode != 0 or not out.exists():
        raise PlotError(f"scripts/bench.sh ({name}, {provider}) failed with exit {r.returncode}")
    return json.loads(out.read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


UCX_FINAL = re.compile(r"^Final:\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",
                       re.M)


def parse_ucx_output(text: str) -> float:
    """GB/s (10^9 bytes/s) from ucx_perftest's `Final:` line, whose bandwidth columns are MB/s
    of 2^20 bytes (UCX's UCS_MBYTE); the overall one is taken."""
    m = UCX_FINAL.search(text)
    if not m:
        raise PlotError("ucx_perftest printed no 'Final:' line: " + text.strip()[-300:])
    return float(m.group(6)) * 1048576 / 1e9


def ucx_put_bw(tls: str, size: int, iterations: int) -> float:
    """One ucx_perftest ucp_put_bw run, server and client on 127.0.0.1, bounded in time."""
    port = str(free_port())
    env = dict(os.environ, UCX_TLS=tls)
    if tls == "tcp":
        env["UCX_NET_DEVICES"] = "lo"
    server = subprocess.Popen(["ucx_perftest", "-p", port], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for attempt in range(50):  # the server listens within a moment; bounded retries
            r = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port, "-t", "ucp_put_bw",
                                "-s", str(size), "-n", str(iterations), "-w",
                                str(max(10, iterations // 20))],
                               env=env, capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                return parse_ucx_output(r.stdout)
            if "Connection refused" not in r.stdout + r.stderr:
                raise PlotError(f"ucx_perftest (UCX_TLS={tls}, {size} B) failed: "
                                f"{(r.stdout + r.stderr).strip()[-300:]}")
            time.sleep(0.1)
        raise PlotError(f"ucx_perftest server on port {port} never accepted")
    finally:
        server.kill()
        server.wait(timeout=10)


def run_all(quick: bool, providers: list[str], ucx: bool, work: Path) -> dict:
    p = plan(quick)
    results: dict = {"quick": quick, "date": time.strftime("%Y-%m-%d %H:%M"), "bulk": [],
                     "small": [], "sizes": [], "ucx": [], "ucx_note": None}
    for provider in providers:
        results["bulk"] += bench(provider, p["bulk"]["env"], None, work, "bulk")
        results["small"] += bench(provider, p["small"]["env"], p["small"]["runs"], work, "small")
        results["sizes"] += bench(provider, p["sizes"]["env"], p["sizes"]["runs"], work, "sizes")
    if not ucx:
        results["ucx_note"] = "skipped (--no-ucx)"
    elif not shutil.which("ucx_perftest"):
        results["ucx_note"] = "skipped: ucx_perftest is missing (scripts/perf-plots.py --install)"
        print(f"perf-plots: {results['ucx_note']}", file=sys.stderr)
    else:
        for provider in providers:
            for size, n in p["ucx_iterations"].items():
                gbps = ucx_put_bw(UCX_TLS[provider], size, n)
                print(f"perf-plots: ucx_perftest put_bw UCX_TLS={UCX_TLS[provider]} {size} B: "
                      f"{gbps:.2f} GB/s", flush=True)
                results["ucx"].append({"provider": provider, "tls": UCX_TLS[provider],
                                       "size": size, "iterations": n, "gbps": gbps})
    return results


# --------------------------------------------------------------------------------------------
# The figures, from the documents (ferry-bench --json, as bench.sh keeps them: each with a
# "bench" object naming the provider and the run's arguments)


def provider_of(doc: dict) -> str:
    return doc.get("bench", {}).get("provider") or doc["provider"]


def throughput_docs(docs: list[dict]) -> list[dict]:
    return [d for d in docs if "ferry" in d and "gbps_median" in d["ferry"]]


def bulk_series(docs: list[dict]) -> dict:
    """provider -> {ferry: (median, min, max) GB/s, raw: (...) or None, ratio}."""
    out = {}
    for d in throughput_docs(docs):
        f, r = d["ferry"], d["raw"]
        out[provider_of(d)] = {
            "ferry": (f["gbps_median"], f["gbps_min"], f["gbps_max"]),
            "raw": (r["gbps_median"], r["gbps_min"], r["gbps_max"]) if r else None,
            "ratio": d["ratio"]}
    return out


def small_series(docs: list[dict]) -> dict:
    """provider -> {ferry: rooms/s, raw: rooms/s of the same writes, ratio, bytes}."""
    out = {}
    for d in throughput_docs(docs):
        per_room = d["per_request"]["bytes"]
        raw = d["raw"]["gbps_median"] * 1e9 / per_room if d["raw"] else None
        out[provider_of(d)] = {"ferry": d["ferry"]["rooms_per_s_median"], "raw": raw,
                               "ratio": d["ratio"], "bytes": per_room,
                               "writes": d["per_request"]["writes"]}
    return out


def latency_series(docs: list[dict]) -> dict:
    """provider -> [{gap_ms, ferry: (p50, p99), raw: (p50, p99) | None, single: ..., ratio}]."""
    out = {}
    for d in docs:
        if "latency" not in d:
            continue
        rows = []
        for g in d["latency"]["gaps"]:
            pair = lambda s: (s["p50"], s["p99"]) if s and s.get("p50") is not None else None
            rows.append({"gap_ms": g["gap_ms"], "ferry": pair(g["ferry_ms"]),
                         "raw": pair(g["raw_ms"]), "single": pair(g["raw_single_write_ms"]),
                         "ratio": g["ratio_p50"]})
        out[provider_of(d)] = rows
    return out


def open_loop_series(docs: list[dict]) -> dict:
    """provider -> {rate, achieved, sustained, refused, classes: [{tokens, p50, p99, committed}]}."""
    out = {}
    for d in docs:
        if "open_loop" not in d:
            continue
        ol = d["open_loop"]
        out[provider_of(d)] = {
            "rate": ol["rate"], "achieved": ol["achieved_rooms_per_s"], "gbps": ol["gbps"],
            "sustained": ol["sustained"],
            "refused": ol["refused"]["no_pages"] + ol["refused"]["no_slot"],
            "classes": [{"tokens": c["tokens"], "p50": c["latency_ms"]["p50"],
                         "p99": c["latency_ms"]["p99"], "committed": c["committed"]}
                        for c in ol["classes"]]}
    return out


def size_series(docs: list[dict], ucx: list[dict]) -> dict:
    """series name -> sorted [(write bytes, GB/s)]: Ferry and raw per provider from MODEL=kv
    rooms (every write one layer buffer's run: tokens x KV bytes per token and buffer), and
    ucx_perftest put_bw per transport."""
    out: dict = {}
    for d in throughput_docs(docs):
        w = d["per_request"]["bytes"] // d["per_request"]["writes"]
        p = provider_of(d)
        out.setdefault(f"Ferry {p}", []).append((w, d["ferry"]["gbps_median"]))
        if d["raw"]:
            out.setdefault(f"raw fi_writedata {p}", []).append((w, d["raw"]["gbps_median"]))
    for u in ucx:
        out.setdefault(f"UCX put_bw {u['tls']}", []).append((u["size"], u["gbps"]))
    return {k: sorted(v) for k, v in out.items()}


# --------------------------------------------------------------------------------------------
# Drawing


def ordered(providers) -> list[str]:
    """tcp, then shm, then anything else by name."""
    return sorted(providers, key=lambda p: (PROVIDERS.index(p) if p in PROVIDERS else 9, p))


def draw(results: dict, outdir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    note = f"ferry-bench, 2 vCPU VM, {results.get('date', '')}" + \
        (" (quick run: indicative only)" if results.get("quick") else "")
    written = []
    colors = {"Ferry": "#1f77b4", "raw": "#ff7f0e", "single": "#2ca02c", "UCX": "#9467bd"}

    def save(fig, name: str, bottom: float = 0.03) -> None:
        fig.text(0.99, 0.01, note, ha="right", va="bottom", fontsize=7, color="gray")
        fig.tight_layout(rect=(0, bottom, 1, 1))
        path = outdir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    def plain_log_ticks(ax) -> None:
        """A log y axis labelled 1-2-5 in plain numbers (matplotlib labels decades only)."""
        lo, hi = ax.get_ylim()
        ticks = [m * 10.0 ** e for e in range(-3, 5) for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()

    def label_bars(ax, bars, fmt: str, inside: bool = False) -> None:
        """Each bar's value: above it, or (`inside`, clear of error bars) in its lower part."""
        for b in bars:
            h = b.get_height()
            if h > 0:
                x = b.get_x() + b.get_width() / 2
                if inside:
                    ax.annotate(format(h, fmt), (x, h * 0.08), ha="center", va="bottom",
                                fontsize=9, color="white", fontweight="bold")
                else:
                    ax.annotate(format(h, fmt), (x, h), ha="center", va="bottom", fontsize=8,
                                xytext=(0, 2), textcoords="offset points")

    bulk = bulk_series(results["bulk"])
    if bulk:
        fig, ax = plt.subplots(figsize=(6, 4))
        provs = ordered(bulk)
        x = range(len(provs))
        for i, (key, name) in enumerate((("ferry", "Ferry"), ("raw", "raw fi_writedata"))):
            vals = [bulk[p][key][0] if bulk[p][key] else 0 for p in provs]
            err = [[v - (bulk[p][key][1] if bulk[p][key] else 0) for p, v in zip(provs, vals)],
                   [(bulk[p][key][2] if bulk[p][key] else 0) - v for p, v in zip(provs, vals)]]
            bars = ax.bar([j + (i - 0.5) * 0.38 for j in x], vals, 0.38, yerr=err, capsize=3,
                          label=name, color=colors["Ferry" if key == "ferry" else "raw"])
            label_bars(ax, bars, ".2f", inside=True)
        ax.set_xticks(list(x), [f"{p}\nFerry/raw {bulk[p]['ratio']:.2f}" if bulk[p]["ratio"]
                                else p for p in provs])
        ax.set_ylabel("GB/s (median, min-max)")
        ax.set_title("Bulk: 4096-token Qwen3-Next rooms (170 MiB, 205 writes)")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
        ax.legend(loc="upper right", ncol=2, fontsize=8)
        save(fig, "perf-bulk.png")

    small = small_series([d for d in results["small"] if "latency" not in d
                          and "open_loop" not in d])
    if small:
        fig, ax = plt.subplots(figsize=(6, 4))
        provs = ordered(small)
        x = range(len(provs))
        for i, (key, name) in enumerate((("ferry", "Ferry"), ("raw", "raw, same writes"))):
            vals = [small[p][key] or 0 for p in provs]
            bars = ax.bar([j + (i - 0.5) * 0.38 for j in x], vals, 0.38, label=name,
                          color=colors["Ferry" if key == "ferry" else "raw"])
            label_bars(ax, bars, ".0f", inside=True)
        ax.set_xticks(list(x), [f"{p}\nFerry/raw {small[p]['ratio']:.2f}" if small[p]["ratio"]
                                else p for p in provs])
        ax.set_ylabel("rooms/s")
        some = small[provs[0]]
        ax.set_title(f"Small rooms: 16 tokens ({some['bytes'] / 1024:.0f} KiB in "
                     f"{some['writes']} writes), concurrency 64", fontsize=11)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
        ax.legend(loc="upper right", ncol=2, fontsize=8)
        save(fig, "perf-small-rooms.png")

    lat = latency_series(results["small"])
    if lat:
        provs = ordered(lat)
        fig, axes = plt.subplots(1, len(provs), figsize=(5.5 * len(provs), 4.6), squeeze=False)
        for ax, p in zip(axes[0], provs):
            rows = lat[p]
            x = range(len(rows))
            series = (("ferry", "Ferry (prepare to Success)", "Ferry"),
                      ("raw", "raw: TCP message + room writes", "raw"),
                      ("single", "raw: TCP message + one write", "single"))
            for i, (key, name, c) in enumerate(series):
                p50 = [r[key][0] if r[key] else 0 for r in rows]
                p99 = [r[key][1] if r[key] else 0 for r in rows]
                pos = [j + (i - 1) * 0.27 for j in x]
                ax.bar(pos, p50, 0.27, label=name, color=colors[c])
                ax.scatter(pos, p99, marker="_", s=150, color="black",
                           label="p99" if i == 0 else None, zorder=3)
                for px, a, b in zip(pos, p50, p99):  # the p50, above the p99 mark
                    if a > 0:
                        ax.annotate(f"{a:.2f}", (px, max(a, b)), ha="center", va="bottom",
                                    fontsize=8, xytext=(0, 3), textcoords="offset points")
            ax.set_xticks(list(x), [f"gap {r['gap_ms']:g} ms" +
                                    (f"\nFerry/raw {r['ratio']:.1f}" if r["ratio"] else "")
                                    for r in rows])
            ax.set_ylabel("ms (bars: p50, black marks: p99)")
            ax.set_title(f"One 16-token room at a time, {p}")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8,
                   bbox_to_anchor=(0.5, 0.03))
        fig.subplots_adjust(bottom=0.2)
        save(fig, "perf-latency.png", bottom=0.1)

    ol = open_loop_series(results["small"])
    if ol:
        provs = ordered(ol)
        fig, axes = plt.subplots(1, len(provs), figsize=(5 * len(provs), 4), squeeze=False)
        for ax, p in zip(axes[0], provs):
            s = ol[p]
            cls = s["classes"]
            x = range(len(cls))
            for i, (key, name) in enumerate((("p50", "p50"), ("p99", "p99"))):
                vals = [c[key] or 0 for c in cls]
                bars = ax.bar([j + (i - 0.5) * 0.38 for j in x], vals, 0.38, label=name,
                              color=colors["Ferry" if key == "p50" else "raw"])
                label_bars(ax, bars, ".1f")
            ax.set_xticks(list(x), [f"{c['tokens']} tokens\n({c['committed']} rooms)"
                                    for c in cls])
            ax.set_yscale("log")
            plain_log_ticks(ax)
            ax.set_ylabel("ms, arrival to Success (log scale)")
            ax.set_title(f"Open loop {s['rate']:g} rooms/s offered, {p}\nachieved "
                         f"{s['achieved']:.0f} rooms/s, {s['gbps']:.2f} GB/s, "
                         f"{'sustained' if s['sustained'] else 'NOT sustained'}", fontsize=10)
            ax.legend(fontsize=8, loc="upper left")
        save(fig, "perf-open-loop.png")

    sizes = size_series(results["sizes"], results["ucx"])
    if sizes:
        families = [p for p in ordered(PROVIDERS)
                    if any(k.endswith(" " + p) or k.endswith(" " + UCX_TLS[p]) for k in sizes)]
        fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4.4),
                                 squeeze=False)
        ticks = sorted({s for pts in sizes.values() for s, _ in pts})
        for ax, p in zip(axes[0], families):
            for name, pts in sizes.items():
                if not (name.endswith(" " + p) or name == f"UCX put_bw {UCX_TLS[p]}"):
                    continue
                kind = name.split()[0]
                style = {"Ferry": "-", "raw": "--", "UCX": ":"}[kind]
                ax.plot([s for s, _ in pts], [g for _, g in pts], style, marker="o",
                        label=name, color=colors[kind if kind != "raw" else "raw"])
                for x, y in pts:
                    ax.annotate(f"{y:.0f}" if y >= 10 else f"{y:.2g}", (x, y), fontsize=7,
                                xytext=(4, 3), textcoords="offset points")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            plain_log_ticks(ax)
            ax.set_xticks(ticks, [f"{t // 1024} KiB" if t < 1048576 else f"{t // 1048576} MiB"
                                  for t in ticks])
            ax.set_xlabel("bytes per write")
            ax.set_ylabel("GB/s (log scale)")
            ax.set_title(f"{p}: Ferry and raw fi_writedata vs UCX put_bw "
                         f"(UCX_TLS={UCX_TLS[p]})", fontsize=10)
            ax.legend(fontsize=8, loc="best")
        caveat = ("Ferry and raw: rooms of 24 equal writes (MODEL=kv) into the kv pools, "
                  "concurrency 64/64/32/8. UCX: ucx_perftest puts to one destination buffer "
                  "again and again (cache-resident on sm).")
        if results.get("ucx_note"):
            caveat += " UCX " + results["ucx_note"] + "."
        fig.text(0.01, 0.045, caveat, ha="left", va="bottom", fontsize=7, color="gray")
        save(fig, "perf-write-sizes.png", bottom=0.08)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", action="store_true", help="install the packages it needs")
    ap.add_argument("--quick", action="store_true", help="brief runs (under ~3 minutes)")
    ap.add_argument("--from-json", metavar="FILE", help="draw from this results file only")
    ap.add_argument("--json", metavar="FILE", default=str(REPO / "docs/img/perf-results.json"),
                    help="where the runs' results are kept (default: %(default)s)")
    ap.add_argument("--out", metavar="DIR", default=str(REPO / "docs/img"),
                    help="where the PNGs go (default: %(default)s)")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help="default: %(default)s")
    ap.add_argument("--no-ucx", action="store_true", help="skip ucx_perftest")
    args = ap.parse_args(argv)
    if args.install:
        return install()
    try:
        if args.from_json:
            results = json.loads(Path(args.from_json).read_text())
        else:
            providers = [p for p in args.providers.split(",") if p]
            bad = [p for p in providers if p not in PROVIDERS]
            if bad:
                raise PlotError(f"--providers: unknown {', '.join(bad)} (expected tcp, shm)")
            if (pids := subprocess.run(["pgrep", "-x", "ferry-bench"], capture_output=True,
                                       text=True).stdout.split()):
                raise PlotError(f"another ferry-bench is running (pid {', '.join(pids)}): "
                                "bench.sh uses fixed sockets and ports")
            with tempfile.TemporaryDirectory(prefix="ferry-plots-") as work:
                results = run_all(args.quick, providers, not args.no_ucx, Path(work))
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
            print(f"perf-plots: results in {args.json}")
        for path in draw(results, Path(args.out)):
            print(f"perf-plots: wrote {path}")
    except PlotError as e:
        print(f"perf-plots: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        print(f"perf-plots: {e.name} is missing: scripts/perf-plots.py --install "
              "(python3-matplotlib), and run it with /usr/bin/python3", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
