"""The documents as a reader meets them: every relative link resolves to a file of the
repository (and, with an anchor, to a heading of it); the error reference is what
scripts/gen_error_reference.py writes from src/core/errors.hpp; every code is in protocol.md's
table and in the Python client's Errc."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from conftest import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def documents() -> list:
    docs = [REPO / "README.md", REPO / "clients/python/README.md"]
    docs += sorted((REPO / "docs").rglob("*.md"))
    return [d for d in docs if d.is_file()]


def prose_lines(path) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path):
        if m := HEADING.match(line):
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_every_relative_link_resolves_to_a_file_and_heading_of_the_repository() -> None:
    broken = []
    for doc in documents():
        for line in prose_lines(doc):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                where = f"{doc.relative_to(REPO)}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no file {dest}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where}: no heading with anchor #{anchor}")
                elif dest.exists() and REPO not in dest.parents and dest != REPO:
                    broken.append(f"{where}: outside the repository")
    assert broken == [], "\n".join(broken)


def test_the_error_reference_is_generated_from_errors_hpp() -> None:
    r = subprocess.run([sys.executable, str(REPO / "scripts/gen_error_reference.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_error_code_is_in_protocol_md_and_the_python_client() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    from gen_error_reference import HEADER, codes

    from ferry.errors import Errc

    entries = codes(HEADER.read_text())
    assert len(entries) >= 20
    table = (REPO / "docs/protocol.md").read_text()
    for value, name, _, _ in entries:
        if value == 0:
            continue
        assert re.search(rf"^\| {value} \| {name} \|", table, re.M), f"{value} {name} in protocol.md"
    assert {(e.value, e.wire_name) for e in Errc} == {(v, n) for v, n, _, _ in entries}


def test_the_docs_state_the_protocol_ranges_and_the_version_the_binaries_have() -> None:
    """Every range the docs and the Python package state is the constants': the client
    protocol (src/core/wire.yaml) and the peer protocol (src/core/peer_messages.hpp); the version in
    the docs' examples is the file VERSION."""
    schema = yaml.safe_load((REPO / "src/core/wire.yaml").read_text())["client"]
    lo, hi = str(schema["min_version"]), str(schema["max_version"])
    messages = (REPO / "src/core/peer_messages.hpp").read_text()
    peer_lo = re.search(r"\bpeer_protocol_min_version = (\d+);", messages).group(1)
    peer_hi = re.search(r"\bpeer_protocol_version = (\d+);", messages).group(1)
    version = (REPO / "VERSION").read_text().strip()
    text = {d: " ".join(d.read_text().split()) for d in documents()}
    pyproject = REPO / "clients/python/pyproject.toml"
    text[pyproject] = pyproject.read_text()
    client = [(f"(versions {lo} to {hi})", r"\(versions (\d+) to (\d+)\)"),
              (f"client protocol {lo}–{hi}", r"client protocol (\d+)–(\d+)"),
              (f"(protocol versions {lo}-{hi}", r"\(protocol versions (\d+)-(\d+)"),
              (f"protocol versions {lo} to {hi}", r"protocol versions (\d+) to (\d+)")]
    peer = [(f"peer protocol {peer_lo}–{peer_hi}", r"peer protocol (\d+)–(\d+)"),
            (f"peer protocol versions {peer_lo}-{peer_hi}",
             r"peer protocol versions (\d+)-(\d+)")]
    stated = []
    for doc, t in text.items():
        for want, pattern in client + peer:
            for m in re.finditer(pattern, t):
                stated.append(want)
                assert m.group(0) in want, f"{doc.relative_to(REPO)}: '{m.group(0)}', not '{want}'"
    for want in ("(versions", "client protocol", "peer protocol "):
        assert any(s.startswith(want) for s in stated), f"no doc states '{want} ...'"
    assert "# Ferry client protocol (versions" in (REPO / "docs/protocol.md").read_text()
    for tool in ("ferryctl", "ferryd"):
        shown = re.findall(rf"\b{tool} (\d+\.\d+\.\d+) \(protocol", text[REPO / "docs/cli.md"])
        assert shown and set(shown) == {version}, (tool, shown, version)


def test_the_python_package_has_ferrys_one_version() -> None:
    """ferry.__version__ and the pyproject read the file VERSION, as CMake does (the tools'
    --version: test_cli.py)."""
    import ferry
    assert ferry.__version__ == (REPO / "VERSION").read_text().strip()
    pyproject = (REPO / "clients/python/pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M), pyproject
    assert 'version = {attr = "ferry.__version__"}' in pyproject
    assert not re.search(r'^version = "', pyproject, re.M)  # no literal of its own
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "project(ferry VERSION ${FERRY_VERSION}" in cmake and "/VERSION" in cmake
