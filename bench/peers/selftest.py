#!/usr/bin/env python3
"""Checks of the harness that need no GPU and no third-party package.

    python3 bench/peers/selftest.py

Covers the trace parser (tracefile.py), the result records (results.py), the table
(table.py), replay_peer.py's device-free peer, and run_all.sh end to end with that
peer plus a peer that fails. Prints "selftest: ok" and exits 0 when all pass.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import results  # noqa: E402
import table  # noqa: E402
import tracefile  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)


def test_parser(tmp):
    # live: 100 -> 300 -> 200 -> 700 (peak) -> 200 -> 250; request 3 never freed.
    ev = [("a", 0, 100), ("a", 1, 200), ("f", 0), ("a", 2, 500), ("f", 2),
          ("a", 3, 50), ("f", 1), ("a", 4, 0), ("f", 4)]
    p = os.path.join(tmp, "tiny.trace.gz")
    tracefile.write(p, ev)
    tr = tracefile.load(p)
    check(tr.name == "tiny", "name without extensions: %r" % tr.name)
    check(len(tr) == 9 and tr.allocations == 5, "event counts")
    check(tr.kinds == [1, 1, 0, 1, 0, 1, 0, 1, 0], "kinds %r" % tr.kinds)
    check(tr.ids == [0, 1, 0, 2, 2, 3, 1, 4, 4], "ids")
    check(tr.sizes == [100, 200, 0, 500, 0, 50, 0, 0, 0], "sizes")
    check(tr.n_ids == 5, "n_ids")
    check(tr.peak_live_bytes == 700, "peak %d" % tr.peak_live_bytes)
    t3 = tr.truncated(3)
    check(len(t3) == 3 and t3.peak_live_bytes == 300, "truncated peak")
    check(tr.truncated(0) is tr and tr.truncated(99) is tr, "no-op truncation")
    # Plain text works too, and the same bytes give the same trace.
    q = os.path.join(tmp, "tiny2.trace")
    tracefile.write(q, ev)
    t2 = tracefile.load(q)
    check(t2.name == "tiny2" and t2.kinds == tr.kinds and t2.peak_live_bytes == 700,
          "plain-text trace")
    # "t" lines (the program's empty_cache) are not events: where they lie.
    w = os.path.join(tmp, "trims.trace")
    with open(w, "w") as f:
        f.writelines([tracefile.HEADER + "\n", "t 0\n", "a 0 10 0 1\n", "f 0 2\n", "t 3\n",
                      "a 1 20 0 4\n", "t 5\n"])
    tw = tracefile.load(w)
    check(len(tw) == 3 and tw.trims == [0, 2, 3], "trims %r" % tw.trims)
    check(tw.truncated(2).trims == [0], "truncated trims %r" % tw.truncated(2).trims)
    check(tr.trims == [], "no trims")
    # v2 (the corpus's packed form): the same events as their v1 form.
    v = os.path.join(tmp, "v2.trace")
    with open(v, "w") as f:
        f.writelines([tracefile.HEADER_V2 + ": a SIZE STREAM DT_US | f BACK DT_US | t DT_US\n",
                       "s 3 f x.py:1\n", "a 100 0 5\n", "a 200 7 2 3\n", "f 1 0\n", "t 4\n",
                       "a 500 0 1\n", "f 0 1\n", "f 1 0\n"])
    tv = tracefile.load(v)
    check(tv.kinds == [1, 1, 0, 1, 0, 0] and tv.ids == [0, 1, 0, 2, 2, 1], "v2 ids %r" % tv.ids)
    check(tv.sizes == [100, 200, 0, 500, 0, 0] and tv.peak_live_bytes == 700, "v2 sizes %r" % tv.sizes)
    check(tv.trims == [3] and tv.sites == {3: "f x.py:1"} and tv.streams == {"0", "7"}, "v2 trims, sites, streams")
    hdr2 = tracefile.HEADER_V2 + "\n"
    for bad, why in [
        ([hdr2, "a 10 0 0\n", "f 1 1\n"], "v2 BACK before the first request"),
        ([hdr2, "a 10 0 0\n", "a 10 0 0\n", "f 0 1\n", "f 0 2\n"], "v2 double free"),
        ([hdr2, "a 0 10 0 0\n"], "v2 alloc with an ID"),
        ([hdr2, "f 0\n"], "v2 free without time"),
        (["# gpumem-trace v10\n"], "unknown version"),
        (["# not a trace\n"], "header"),
        ([tracefile.HEADER + "\n", "t\n"], "trim without time"),
        ([tracefile.HEADER + "\n", "a 0 10 0 0\n", "a 0 10 0 1\n"], "duplicate ID"),
        ([tracefile.HEADER + "\n", "f 3 0\n"], "free of unknown ID"),
        ([tracefile.HEADER + "\n", "a 0 10 0 0\n", "f 0 1\n", "f 0 2\n"], "double free"),
        ([tracefile.HEADER + "\n", "x 0\n"], "unknown event"),
        ([tracefile.HEADER + "\n", "a 0 ten 0 0\n"], "bad number"),
        ([tracefile.HEADER + "\n", "a 0 10 0 0\n", "f 0 1"], "no final newline (cut short)"),
        ([tracefile.HEADER], "header without a newline"),
    ]:
        b = os.path.join(tmp, "bad.trace")
        with open(b, "w") as f:
            f.writelines(bad)
        try:
            tracefile.load(b)
            check(False, "malformed trace accepted: " + why)
        except tracefile.TraceError as e:
            check("bad.trace" in str(e), "error names the file: %s" % e)
    check(tracefile.trace_name("a/b/gpt2_generate.trace.gz") == "gpt2_generate", "trace_name")
    # Passes keep what the trace never frees (request 3 of tiny, 50 bytes,
    # allocated after the 700-byte peak): the next pass peaks at 750.
    check(tr.peak_live_passes(1) == 700 and tr.peak_live_passes(3) == 750,
          "peak_live_passes %d, %d" % (tr.peak_live_passes(1), tr.peak_live_passes(3)))
    check(t2.peak_live_passes(2) == 750, "peak_live_passes, plain")


def test_shipped_traces():
    # The peak of every shipped trace must match testdata/traces/README.md's table.
    want = {"gpt2_train_varlen": 13064770840, "bert_mlm_varlen": 12174453316,
            "t5_train_varlen": 5051313220, "resnet50_train": 3124435472,
            "gpt2_generate": 951473616, "sweep_create_dispose": 10772283396}
    d = os.path.join(REPO, "testdata", "traces")
    for name, peak in want.items():
        p = os.path.join(d, name + ".trace.gz")
        if not os.path.exists(p):
            continue
        if name == "gpt2_generate" and os.environ.get("SELFTEST_QUICK"):
            continue
        tr = tracefile.load(p)
        check(tr.peak_live_bytes == peak, "%s peak %d != README %d" % (name, tr.peak_live_bytes, peak))


def test_records():
    ok = json.dumps({"peer": "cupy", "trace": "x", "events": 4, "peak_live_bytes": 10,
                     "peak_reserved_bytes": 15, "ratio": 1.5, "ns_per_op": 900.0, "ooms": 0})
    r = results.make_record("cupy", "d/x.trace.gz", 0, 1.5, "noise\n" + ok + "\n", "")
    check(r["ratio"] == 1.5 and r["process_wall_s"] == 1.5 and "error" not in r, "record ok")
    r = results.make_record("jax-bfc", "d/x.trace.gz", 124, 150.0, "", "a\nb\nlast words\n", "150")
    check(r["trace"] == "x" and "timeout after 150s" in r["error"] and "last words" in r["error"],
          "record timeout: %r" % r)
    r = results.make_record("cupy", "x.trace.gz", 1, 2.0,
                            json.dumps({"peer": "cupy", "trace": "x", "error": "boom"}), "")
    check(r["error"] == "boom" and r["rc"] == 1, "record peer error")
    r = results.make_record("cupy", "x.trace.gz", -9, 2.0, "", "")
    check("signal 9" in r["error"], "record signal")


def test_table(tmp):
    rows = [
        {"peer": "torch-native", "trace": "resnet50_train", "events": 100, "ratio": 1.193, "ns_per_op": 4000.0, "ooms": 0},
        {"peer": "torch-expandable", "trace": "resnet50_train", "events": 100, "ratio": 1.019, "ns_per_op": 4100.0, "ooms": 0},
        {"peer": "cupy", "trace": "resnet50_train", "events": 100, "ratio": 1.0, "ns_per_op": 900.0, "ooms": 3},
        {"peer": "torch-native-cxx", "trace": "resnet50_train", "events": 100, "ratio": 1.193, "ns_per_op": 200.0, "ns_per_op_warm": 80.0, "ooms": 0},
        {"peer": "jax-bfc", "trace": "resnet50_train", "error": "timeout after 150s (rc 124)"},
        {"peer": "torch-native", "trace": "gpt2_generate", "events": 50, "ratio": 1.5, "ns_per_op": 3000.0, "ooms": 0},
        {"peer": "torch-native", "trace": "gpt2_generate", "events": 50, "ratio": 1.323, "ns_per_op": 3100.0, "ooms": 0},
        {"peer": "jax-bfc", "trace": "gpt2_generate", "events": 20, "trace_events": 50, "truncated": True, "ratio": 1.01, "ns_per_op": 30000.0, "ooms": 0},
        {"peer": "torch-async", "trace": "gpt2_generate", "error": "skipped: budget", "skipped": True},
        {"peer": "empty-loop", "trace": "gpt2_generate", "events": 50, "ratio": 1.0, "ns_per_op": 90.0, "ooms": 0},
    ]
    gm = [{"trace": "resnet50_train", "events": 100, "peak_live_bytes": 1, "peak_reserved_bytes": 1,
           "ratio": 1.01, "ooms": 0, "ns_per_op": 90.0},
          {"trace": "gpt2_generate", "events": 50, "ratio": 1.4, "ooms": 0, "ns_per_op": 50.0}]
    text = table.build(rows, gm)
    lines = [l for l in text.splitlines() if l.startswith("|")]
    check(len(lines) == 4, "header, rule, two trace rows:\n" + text)
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    check(head[0] == "trace" and head[1] == "torch-native ratio" and head[2] == "torch-native ns/op",
          "peer columns first, canonical order: %r" % head[:3])
    check(head.index("cupy ratio") < head.index("jax-bfc ratio") < head.index("torch-native-cxx ratio")
          < head.index("empty-loop ratio"), "column order %r" % head)
    check(head[-4:] == ["gpumem ratio", "gpumem ns/op", "beats all on ratio",
                        "<= 1/2 torch-native-cxx time"], "gpumem columns %r" % head[-4:])
    check("best peer ratio" in head, "best column")
    cells = {}
    for l in lines[2:]:
        c = [x.strip() for x in l.strip("|").split("|")]
        cells[c[0]] = dict(zip(head, c))
    check(lines[2].startswith("| gpt2_generate") or lines[2].startswith("| resnet50_train"), "row order")
    check(list(cells) == ["resnet50_train", "gpt2_generate"], "README row order: %r" % list(cells))
    r = cells["resnet50_train"]
    check(r["best peer ratio"] == "1.019 (torch-expandable)", "best skips OOM rows: %r" % r["best peer ratio"])
    check(r["cupy ratio"] == "1.000 (3 OOM)", "OOM mark: %r" % r["cupy ratio"])
    check(r["jax-bfc ratio"] == "err" and r["jax-bfc ns/op"] == "err", "error cell")
    check(r["torch-native ns/op"] == "4,000", "ns format: %r" % r["torch-native ns/op"])
    check(r["beats all on ratio"] == "yes", "gpumem beats: %r" % r["beats all on ratio"])
    check(r["<= 1/2 torch-native-cxx time"] == "yes", "time target 90 <= 100")
    g = cells["gpt2_generate"]
    check(g["torch-native ratio"] == "1.323", "last line wins: %r" % g["torch-native ratio"])
    check(g["jax-bfc ratio"] == "1.010†", "truncated mark: %r" % g["jax-bfc ratio"])
    check(g["torch-async ratio"] == "skip", "skip cell")
    check(g["best peer ratio"] == "1.323 (torch-native)",
          "best skips truncated and non-peers: %r" % g["best peer ratio"])
    check(g["beats all on ratio"] == "NO", "gpumem loses: %r" % g["beats all on ratio"])
    check(g["<= 1/2 torch-native-cxx time"] == "—", "no baseline")
    check("timeout after 150s" in text and "first 20 of 50 events" in text, "notes:\n" + text)
    # Equal bytes held is a tie, though the peer's ratio is rounded.
    tie_rows = [{"peer": "torch-expandable", "trace": "kv4", "events": 10, "ratio": 1.1335,
                 "peak_live_bytes": 327481344, "peak_reserved_bytes": 371195904, "ns_per_op": 1.0, "ooms": 0}]
    tie_gm = [{"trace": "kv4", "events": 10, "peak_live_bytes": 327481344, "peak_reserved_bytes": 371195904,
               "ratio": 371195904 / 327481344, "ooms": 0, "ns_per_op": 1.0}]
    tie = [l for l in table.build(tie_rows, tie_gm).splitlines() if l.startswith("| kv4")]
    check(len(tie) == 1 and "| tie |" in tie[0], "equal bytes held is a tie: %r" % tie)
    warm = table.build(rows, gm, warm=True)
    check("| 80.0 |" in warm, "--warm uses ns_per_op_warm")
    check("NO (1.12x)" in warm, "time target vs warm baseline: 90 > 40")
    # Without gpumem: no gpumem columns; CLI on files.
    p1, p2 = os.path.join(tmp, "p.jsonl"), os.path.join(tmp, "g.jsonl")
    with open(p1, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    with open(p2, "w") as f:
        f.write("\n".join(json.dumps(r) for r in gm) + "\n")
    out = subprocess.run([sys.executable, os.path.join(HERE, "table.py"), p1],
                         capture_output=True, text=True)
    check(out.returncode == 0 and "gpumem" not in out.stdout.split("\n")[0], "CLI without gpumem")
    out = subprocess.run([sys.executable, os.path.join(HERE, "table.py"), p1, p2],
                         capture_output=True, text=True)
    check(out.returncode == 0 and "beats all on ratio" in out.stdout, "CLI with gpumem")


def test_run_all(tmp):
    if not shutil.which("bash") or not shutil.which("timeout"):
        print("skip run_all.sh check: no bash/timeout")
        return
    ev = [("a", 0, 1000), ("a", 1, 3000), ("f", 0), ("a", 2, 5000), ("f", 1), ("f", 2)]
    t1 = os.path.join(tmp, "one.trace.gz")
    t2 = os.path.join(tmp, "two.trace.gz")
    tracefile.write(t1, ev)
    tracefile.write(t2, ev[:3])
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    env = dict(os.environ, OUT=out, PYTHON=sys.executable)
    p = subprocess.run(["bash", os.path.join(HERE, "run_all.sh"), "--peers", "empty-loop,no-such-peer",
                        "--timeout", "60", "--cap", "empty-loop=4", "--skip", "empty-loop:two", t1, t2],
                       capture_output=True, text=True, env=env)
    check(p.returncode == 0, "run_all.sh rc %d: %s" % (p.returncode, p.stderr[-500:]))
    rows = results.read_jsonl(os.path.join(out, "peers.jsonl"))
    check(len(rows) == 4, "one line per peer and trace: %d\n%s" % (len(rows), p.stdout))
    by = {(r["peer"], r["trace"]): r for r in rows}
    e = by.get(("empty-loop", "one"), {})
    check(e.get("events") == 4 and e.get("truncated") is True and e.get("trace_events") == 6
          and e.get("peak_live_bytes") == 8000 and e.get("ratio") == 1.0, "capped row %r" % e)
    check(by.get(("empty-loop", "two"), {}).get("skipped") is True, "skipped row")
    check("unknown peer" in by.get(("no-such-peer", "one"), {}).get("error", ""), "failure recorded")
    check(os.path.exists(os.path.join(out, "peers_table.md")), "table saved")
    check("| one |" in p.stdout, "table printed")


def main():
    tmp = tempfile.mkdtemp(prefix="gpumem-bench-selftest-")
    try:
        test_parser(tmp)
        test_shipped_traces()
        test_records()
        test_table(tmp)
        test_run_all(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("selftest: %d FAILED" % len(FAILS))
        return 1
    print("selftest: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
