#!/usr/bin/env python3
"""Reads the results of bench/torchtests/run.sh and prints, per selection,
how many tests passed, failed, errored, were skipped (xfailed: expected
failures that failed), crashed or did not run under each allocator, then
every test whose outcome differs between the two allocators, with the first
line of its failure message, and the tests that failed under both.

    python3 bench/torchtests/compare.py [--base native] [--subject gpumem] OUT
    python3 bench/torchtests/compare.py --differing SELECTION OUT

OUT holds, per allocator A and selection S (run.sh's names):
  A-S.xml, A-S.rN.xml  junit XML (pytest --junitxml), one per pytest process
  A-S.jsonl            the run's record (torchtests_plugin.py), optional
  isolated/A-S/*.xml   ISOLATE=1 reruns of single tests, optional
The junit files give the outcomes. The record adds what junit cannot hold:
the tests of a pytest process that died (its junit file is never written),
the test it died in ("crashed"), and the selected tests that never ran.

--differing prints the keys ("Class::name") of the tests whose outcome
differs in SELECTION, one a line, for run.sh's ISOLATE=1. Uses only the
standard library.
"""

import argparse
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

import torchtests_plugin  # beside this file: the record's reader

OUTCOMES = ["passed", "failed", "error", "skipped", "xfailed", "crashed", "not run"]
# When one test has several results (pytest 9's subtests report each failing
# subtest; a teardown error follows a failure), the one shown is the first
# of these that occurs.
SEVERITY = ["crashed", "error", "failed", "passed", "xfailed", "skipped", "not run"]
BAD = {"failed", "error", "crashed"}

FILE_RE = re.compile(r"^(?P<alloc>[A-Za-z0-9]+)-(?P<sel>[A-Za-z0-9_]+?)(?:\.r(?P<n>\d+))?\.xml$")


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def key_of(classname, name):
    """'Class::name' from a junit testcase's classname ('test_cuda.TestCuda'
    or 'build.third_party.test_cuda.TestCuda') and name."""
    last = (classname or "").rsplit(".", 1)[-1]
    cls = last if last[:1].isupper() else ""
    return f"{cls}::{name}"


def worse(a, b):
    """The result to keep of two results (outcome, message) of one test."""
    if a is None:
        return b
    return a if SEVERITY.index(a[0]) <= SEVERITY.index(b[0]) else b


def read_junit(path):
    """{key: (outcome, message)} of one junit file."""
    res = {}
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        print(f"compare.py: {path}: unreadable junit XML ({e}); ignored", file=sys.stderr)
        return res
    for tc in root.iter("testcase"):
        key = key_of(tc.get("classname", ""), tc.get("name", ""))
        outcome, msg = "passed", ""
        fail = tc.find("failure")
        err = tc.find("error")
        skip = tc.find("skipped")
        if fail is not None:
            outcome, msg = "failed", fail.get("message") or fail.text
        elif err is not None:
            outcome, msg = "error", err.get("message") or err.text
        elif skip is not None:
            outcome = "xfailed" if skip.get("type") == "pytest.xfail" else "skipped"
            msg = skip.get("message") or skip.text
        res[key] = worse(res.get(key), (outcome, first_line(msg)))
    return res


def read_record(path):
    """What the run's JSON-lines record says: (selected keys or None,
    {key: (outcome, message)} from its reports and crashes)."""
    selected, res = None, {}
    if not os.path.exists(path):
        return selected, res
    events = torchtests_plugin.read_record(path)
    rc_of = {e.get("attempt"): e.get("rc") for e in events if e.get("event") == "process_end"}
    started, finished = {}, set()
    for e in events:
        ev, key = e.get("event"), e.get("key")
        if ev == "selected" and selected is None:
            selected = list(e.get("keys", []))
        elif ev == "start":
            started[key] = e.get("attempt")
        elif ev in ("finish", "crashed"):
            finished.add(key)
            if ev == "crashed":
                rc = e.get("rc")
                res[key] = worse(res.get(key), ("crashed", f"no result: its pytest process ended during it{describe_rc(rc)}"))
        elif ev == "report":
            when, out = e.get("when"), e.get("outcome")
            if out == "failed":
                o = "failed" if when == "call" else "error"
            elif out == "skipped":
                o = "xfailed" if e.get("xfail") else "skipped"
            else:
                o = "passed"
            res[key] = worse(res.get(key), (o, e.get("message", "")))
    for key, attempt in started.items():
        if key not in finished:  # the last process died in it and no later one noted it
            res[key] = worse(res.get(key), ("crashed", f"no result: its pytest process ended during it{describe_rc(rc_of.get(attempt))}"))
    return selected, res


SIGNALS = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 7: "SIGBUS", 8: "SIGFPE", 15: "SIGTERM"}


def describe_rc(rc):
    if rc is None:
        return ""
    if rc == 124:
        return " (exit status 124: run.sh's timeout ended it)"
    if rc > 128 and rc - 128 in SIGNALS:
        return f" (exit status {rc}: {SIGNALS[rc - 128]})"
    if rc == 1:
        return " (exit status 1: the per-test watchdog, or a fatal error; see the log)"
    return f" (exit status {rc})"


def load_run(out, alloc, sel):
    """{key: (outcome, message)} of one allocator's run of one selection, or
    None when there is no trace of that run."""
    files = []
    for p in glob.glob(os.path.join(out, f"{alloc}-{sel}*.xml")):
        m = FILE_RE.match(os.path.basename(p))
        if m and m.group("alloc") == alloc and m.group("sel") == sel:
            files.append((int(m.group("n") or 1), p))
    rec = os.path.join(out, f"{alloc}-{sel}.jsonl")
    if not files and not os.path.exists(rec):
        return None
    res = {}
    for _, p in sorted(files):
        for k, v in read_junit(p).items():
            res[k] = worse(res.get(k), v)
    selected, from_rec = read_record(rec)
    for k, v in from_rec.items():
        if k not in res or v[0] == "crashed":
            res[k] = worse(res.get(k), v)
    for k in selected or []:
        if k not in res:
            res[k] = ("not run", "selected, never started (the run gave up first)")
    return res


def load_isolated(out, alloc, sel):
    """{key: outcome} of the ISOLATE=1 reruns."""
    res = {}
    d = os.path.join(out, "isolated", f"{alloc}-{sel}")
    for p in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
        _, r = read_record(p)
        x = p[:-len(".jsonl")] + ".xml"
        if os.path.exists(x):
            r.update(read_junit(x))
        for k, v in r.items():
            res[k] = v
    return res


def discover(out):
    """Allocators and selections present in OUT, in a stable order."""
    allocs, sels = set(), set()
    for p in glob.glob(os.path.join(out, "*.xml")) + glob.glob(os.path.join(out, "*.jsonl")):
        b = os.path.basename(p)
        m = FILE_RE.match(b) or re.match(r"^(?P<alloc>[A-Za-z0-9]+)-(?P<sel>[A-Za-z0-9_]+)\.jsonl$", b)
        if m:
            allocs.add(m.group("alloc"))
            sels.add(m.group("sel"))
    order = {"graphs": 0, "memory": 1}
    return allocs, sorted(sels, key=lambda s: (order.get(s, 9), s))


def counts(res):
    c = {o: 0 for o in OUTCOMES}
    for o, _ in res.values():
        c[o] += 1
    return c


def differing(base, subj):
    keys = sorted(set(base) | set(subj))
    out = []
    for k in keys:
        b = base.get(k, ("absent", ""))
        s = subj.get(k, ("absent", ""))
        if b[0] != s[0]:
            out.append((k, b, s))
    return out


def short(msg, n=160):
    msg = msg or ""
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def report(out, base_name, subj_name, w=sys.stdout):
    allocs, sels = discover(out)
    if not sels:
        print(f"compare.py: no results in {out}", file=w)
        return 1
    print(f"PyTorch test_cuda.py: {base_name} (PyTorch's allocator) against {subj_name}; results from {out}", file=w)
    print("", file=w)
    hdr = f"{'selection':<10} {'allocator':<10} {'tests':>6} " + " ".join(f"{o:>8}" for o in OUTCOMES)
    print(hdr, file=w)
    print("-" * len(hdr), file=w)
    runs = {}
    for sel in sels:
        for alloc in (base_name, subj_name):
            r = load_run(out, alloc, sel)
            runs[(alloc, sel)] = r
            if r is None:
                print(f"{sel:<10} {alloc:<10} {'(no run)':>6}", file=w)
                continue
            c = counts(r)
            print(f"{sel:<10} {alloc:<10} {len(r):>6} " + " ".join(f"{c[o]:>8}" for o in OUTCOMES), file=w)
    for sel in sels:
        b, s = runs[(base_name, sel)], runs[(subj_name, sel)]
        print("", file=w)
        if b is None or s is None:
            print(f"== {sel}: no comparison (a run is missing)", file=w)
            continue
        diffs = differing(b, s)
        iso_b = load_isolated(out, base_name, sel)
        iso_s = load_isolated(out, subj_name, sel)
        print(f"== {sel}: {len(diffs)} test(s) whose outcome differs ({base_name} -> {subj_name})", file=w)
        for k, bo, so in diffs:
            line = f"  {bo[0]:>8} -> {so[0]:<8} {k}"
            if k in iso_b or k in iso_s:
                ib = iso_b.get(k, ("-", ""))[0]
                isub = iso_s.get(k, ("-", ""))[0]
                line += f"   [alone: {base_name} {ib}, {subj_name} {isub}]"
            print(line, file=w)
            if so[0] in BAD or so[0] in ("skipped", "xfailed", "not run"):
                if so[1]:
                    print(f"           {subj_name}: {short(so[1])}", file=w)
            if bo[0] in BAD or bo[0] in ("skipped", "xfailed", "not run"):
                if bo[1]:
                    print(f"           {base_name}: {short(bo[1])}", file=w)
            if k in iso_s and iso_s[k][0] in BAD and iso_s[k][1] and iso_s[k][1] != so[1]:
                print(f"           {subj_name} alone: {short(iso_s[k][1])}", file=w)
        both = sorted(k for k in set(b) & set(s) if b[k][0] in BAD and s[k][0] in BAD)
        print(f"== {sel}: {len(both)} test(s) that fail under both (not gpumem's doing; message under {base_name})", file=w)
        for k in both:
            print(f"  {b[k][0]:>8} /  {s[k][0]:<8} {k}", file=w)
            if b[k][1]:
                print(f"           {short(b[k][1])}", file=w)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="run.sh's results folder")
    ap.add_argument("--base", default="native", help="the reference allocator's name [native]")
    ap.add_argument("--subject", default="gpumem", help="the allocator under test [gpumem]")
    ap.add_argument("--differing", metavar="SELECTION", help="print only the keys of the differing tests of SELECTION")
    a = ap.parse_args(argv)
    if a.differing:
        b = load_run(a.out, a.base, a.differing)
        s = load_run(a.out, a.subject, a.differing)
        if b is None or s is None:
            print(f"compare.py: {a.out}: no {a.base} or no {a.subject} run of {a.differing}", file=sys.stderr)
            return 1
        for k, _, _ in differing(b, s):
            print(k)
        return 0
    return report(a.out, a.base, a.subject)


if __name__ == "__main__":
    sys.exit(main())
