#!/usr/bin/env python3
"""The shipped Prometheus rules and the Grafana dashboard, as Prometheus reads them (ctest
prometheus_rules): every alert of docs/prometheus/ferry-rules.yml is in docs/operations.md's
table and the table names no other; each has a unit test where it stays quiet and one where it
fires; `promtool check rules` loads the file and `promtool test rules` passes; each query of
docs/grafana/ferry.json parses (as a generated recording rule). Exits 77, a skip ctest reports,
when promtool is missing (Debian's `prometheus` package; scripts/install-deps.sh installs it).
Standard library only."""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
RULES = ROOT / "docs/prometheus/ferry-rules.yml"
TESTS = ROOT / "tests/prometheus/ferry-rules.test.yml"
DOC = ROOT / "docs/operations.md"
DASHBOARD = ROOT / "docs/grafana/ferry.json"

failures = []


def fail(why: str) -> None:
    failures.append(why)
    print("FAIL:", why)


def alerts_of_rules() -> list:
    return re.findall(r"^\s*- alert:\s*(\w+)\s*$", RULES.read_text(), re.M)


def alerts_of_doc() -> set:
    """The first column of the table under "### Alerts worth setting"."""
    text = DOC.read_text()
    start = text.find("### Alerts worth setting")
    if start < 0:
        fail(f"{DOC}: no 'Alerts worth setting' section")
        return set()
    section = text[start:].split("\n#", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


def tested() -> dict:
    """alertname -> the kinds of its test cases: 'quiet' (exp_alerts: []) and 'fires'."""
    out: dict = {}
    name = None
    for line in TESTS.read_text().splitlines():
        if m := re.match(r"^\s*alertname:\s*(\w+)\s*$", line):
            name = m.group(1)
        elif name and (m := re.match(r"^\s*exp_alerts:\s*(\[\])?\s*$", line)):
            out.setdefault(name, set()).add("quiet" if m.group(1) else "fires")
            name = None
    return out


def dashboard_exprs() -> list:
    doc = json.loads(DASHBOARD.read_text())
    return [
        (p.get("title", "?"), t["expr"]) for p in doc["panels"] for t in p.get("targets", [])
    ]


def promtool(*args) -> bool:
    r = subprocess.run(["promtool", *args], capture_output=True, text=True)
    print(r.stdout, r.stderr, sep="", end="")
    return r.returncode == 0


def main() -> int:
    alerts = alerts_of_rules()
    if len(alerts) < 8:
        fail(f"{RULES}: {len(alerts)} alerts, expected the 8 of docs/operations.md at least")
    documented = alerts_of_doc()
    for a in sorted(set(alerts) - documented):
        fail(f"{a} is in {RULES.name} but not in docs/operations.md's table of alerts")
    for a in sorted(documented - set(alerts)):
        fail(f"docs/operations.md names {a}, which {RULES.name} does not define")
    cases = tested()
    for a in alerts:
        for kind in ("quiet", "fires"):
            if kind not in cases.get(a, set()):
                fail(f"{TESTS.name} has no test case where {a} {kind}")
    exprs = dashboard_exprs()
    if len(exprs) < 10:
        fail(f"{DASHBOARD}: {len(exprs)} queries, expected the dashboard's 10 panels' at least")

    if shutil.which("promtool") is None:
        print("SKIP: promtool not found: install Debian's prometheus package "
              "(scripts/install-deps.sh does) to load the rules and the dashboard's queries")
        return 1 if failures else 77
    if not promtool("check", "rules", str(RULES)):
        fail(f"promtool check rules {RULES}")
    if not promtool("test", "rules", str(TESTS)):
        fail(f"promtool test rules {TESTS}")
    with tempfile.TemporaryDirectory() as tmp:
        generated = Path(tmp) / "dashboard-queries.yml"
        lines = ["groups:", "  - name: ferry-dashboard", "    rules:"]
        for i, (title, expr) in enumerate(exprs):
            lines += [f"      - record: ferry_dashboard:query_{i}", f"        expr: {json.dumps(expr)}"]
        generated.write_text("\n".join(lines) + "\n")
        if not promtool("check", "rules", str(generated)):
            fail("a query of docs/grafana/ferry.json does not parse: "
                 + "; ".join(f"{t}: {e}" for t, e in exprs))
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print(f"ok: {len(alerts)} alerts loaded and tested, {len(exprs)} dashboard queries parsed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
