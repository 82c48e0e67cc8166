#!/usr/bin/env python3
"""Count and classify ThreadSanitizer reports in log_path files (used by scripts/tsan.sh).

Usage: tsan_reports.py [-v] LOG...   (LOG: files written by TSAN_OPTIONS=log_path=...)

Each report is put in one area, by the frames of its two access stacks and its location:
  caf        a libcaf frame or a caf:: function is involved (a message, a mailbox, an actor's
             state reached through CAF's scheduler). With Debian's uninstrumented libcaf these
             are expected false positives (docs/reliability.md, "Sanitizers"); with the
             instrumented CAF that scripts/tsan.sh builds there should be none.
  ferry      otherwise, a frame in Ferry's own sources (transport/, actors/, src/, clients/).
  tests      otherwise, a frame in tests/.
  libfabric, spdlog, other: by the library the accesses are in.
The process a report came from (ferryd, a test binary) is taken from its frames' module names.
Prints one line per (process, area, kind), the suppressions' hit counts (print_suppressions=1;
hits, not reports: one suppressed race can hit many times), and with -v one example per
distinct report.
"""
import collections
import re
import sys

FERRY_SRC = re.compile(r'/(transport|actors|src|clients)/[^ :]+\.(cpp|hpp|h)')
TEST_SRC = re.compile(r'/tests/[^ :]+\.(cpp|hpp|h)')
FRAME = re.compile(r'^\s+#\d+ ')


def reports(path):
    with open(path, errors='replace') as f:
        text = f.read()
    for block in text.split('==================\n'):
        if 'WARNING: ThreadSanitizer:' in block:
            yield block


def sections(block):
    """(header line, frames) per stack section of one report."""
    out = []
    for line in block.splitlines():
        if re.match(r'^  \S', line):
            out.append((line.strip(), []))
        elif FRAME.match(line) and out:
            out[-1][1].append(line.strip())
    return out


def classify(block):
    kind = re.search(r'WARNING: ThreadSanitizer: ([^(]+)', block).group(1).strip()
    secs = sections(block)
    access = [s for s in secs if not s[0].startswith(('Location', 'Mutex', 'Thread'))][:2]
    location = [s for s in secs if s[0].startswith('Location')]
    frames = [f for _, frs in access + location for f in frs if 'libtsan' not in f]
    mods = set(re.findall(r'\((lib[a-z_+]+?)[.\d]*\.so', ' '.join(frames)))
    if mods & {'libcaf_core', 'libcaf_io'} or any(' caf::' in f or '/caf/' in f for f in frames):
        area = 'caf'
    elif any(FERRY_SRC.search(f) for f in frames):
        area = 'ferry'
    elif any(TEST_SRC.search(f) for f in frames):
        area = 'tests'
    elif 'libfabric' in mods:
        area = 'libfabric'
    elif 'libspdlog' in mods:
        area = 'spdlog'
    else:
        area = 'other'
    binaries = re.findall(r'\((ferryd|ferryctl|ferry_\w+_tests)\+0x', block)
    process = binaries[0] if binaries else '?'
    # A signature for de-duplication: the first non-runtime frame of each access.
    sig = []
    for header, frs in access:
        top = [f for f in frs if not re.search(r'libtsan|/usr/include/c\+\+|libstdc\+\+', f)][:1]
        sig.append(re.sub(r' at 0x\w+| by .*', '', header) + ' @ ' +
                   (re.sub(r'^#\d+ | \(\S+\+0x\w+\)$', '', top[0]) if top else '?'))
    return process, area, kind, tuple(sig)


def suppression_hits(path):
    """(template, hits) from the 'Matched N suppressions' table TSan prints at exit."""
    with open(path, errors='replace') as f:
        text = f.read()
    for table in re.findall(r'ThreadSanitizer: Matched \d+ suppressions[^\n]*\n((?:\s*\d+ \S+\n)+)', text):
        for hits, template in re.findall(r'(\d+) (\S+)', table):
            yield template, int(hits)


def main(argv):
    verbose = '-v' in argv
    paths = [a for a in argv if a != '-v']
    counts = collections.Counter()
    suppressed = collections.Counter()
    examples = {}
    for path in paths:
        for template, hits in suppression_hits(path):
            suppressed[template] += hits
        for block in reports(path):
            process, area, kind, sig = classify(block)
            counts[(process, area, kind)] += 1
            examples.setdefault((area, kind, sig), [0, path])[0] += 1
    total = sum(counts.values())
    for (process, area, kind), n in sorted(counts.items()):
        print(f'  {process:18s} {area:10s} {kind:40s} {n}')
    print(f'  total {total} reports, {len(examples)} distinct')
    for template, hits in sorted(suppressed.items()):
        print(f'  suppressed by {template}: {hits} hits')
    if verbose:
        for (area, kind, sig), (n, path) in sorted(examples.items(), key=lambda x: -x[1][0]):
            print(f'\n  [{area}] {kind} x{n} (e.g. {path})')
            for line in sig:
                print('     ', line[:220])
    return total


if __name__ == '__main__':
    main(sys.argv[1:])
