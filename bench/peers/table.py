#!/usr/bin/env python3
"""One markdown table of peers (and gpumem) per trace, from JSON-lines results.

    python3 bench/peers/table.py PEERS.jsonl [GPUMEM.jsonl] [--warm] [--peers a,b,...]

PEERS.jsonl is what run_all.sh writes (one line per peer and trace; when a peer
and trace appear more than once, the last line wins, so re-runs can be appended).
GPUMEM.jsonl, if given, holds gpumem's own replays in the same shape (keys trace,
events, peak_live_bytes, peak_reserved_bytes, ratio, ooms, ns_per_op; a "peer" key
is ignored: every line of that file is gpumem).

Rows are traces; for each peer two columns, ratio (peak held / peak live) and
ns/op (time per alloc or free). "best peer ratio" is the lowest ratio among the
peers' complete, OOM-free rows. With gpumem's file, three more columns: gpumem's
ratio and ns/op, "beats all on ratio" (gpumem's ratio below the best peer's, with
no OOM, on the same number of events), and "<= 1/2 torch C++ time" (gpumem's ns/op
at most half of torch-native-cxx's, the stated time target).

Cell marks: "†" replayed a prefix only (truncated; not counted as best), "(N OOM)"
the peer refused N requests (not counted as best), "err"/"skip" no figure; the
notes under the table say why.

--warm uses ns_per_op_warm (second pass, pool kept) where a row has it.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from results import read_jsonl  # noqa: E402

# Column order: the peers of ANCHORS.md first, then the C++ baselines.
PEER_ORDER = ["torch-native", "torch-expandable", "torch-async", "cupy", "jax-bfc",
              "torch-native-cxx", "torch-expandable-cxx", "torch-async-cxx"]
# Rows that are not allocators: shown if present, never "best".
NOT_PEERS = {"empty-loop"}
# Row order: testdata/traces/README.md's table, then anything else as it comes.
TRACE_ORDER = ["gpt2_train_varlen", "bert_mlm_varlen", "t5_train_varlen",
               "resnet50_train", "gpt2_generate", "sweep_create_dispose"]
TIME_BASELINE = "torch-native-cxx"


def latest(rows, key):
    """The last row for each key(row), in first-appearance order."""
    out = {}
    for r in rows:
        k = key(r)
        out.pop(k, None)
        out[k] = r
    return out


def usable(r):
    """A row whose ratio can stand for the peer: complete, no error, no OOM."""
    return (r is not None and "error" not in r and not r.get("truncated")
            and not r.get("ooms") and isinstance(r.get("ratio"), (int, float)))


def fmt_ratio(r):
    if r is None:
        return ""
    if "error" in r:
        return "skip" if r.get("skipped") else "err"
    v = r.get("ratio")
    if not isinstance(v, (int, float)):
        return "?"
    s = "%.3f" % v
    if r.get("truncated"):
        s += "†"
    if r.get("ooms"):
        s += " (%d OOM)" % r["ooms"]
    return s


def ns_of(r, warm):
    if r is None or "error" in r:
        return None
    v = r.get("ns_per_op_warm") if warm and "ns_per_op_warm" in r else r.get("ns_per_op")
    return v if isinstance(v, (int, float)) else None


def fmt_ns(r, warm):
    if r is None:
        return ""
    if "error" in r:
        return "skip" if r.get("skipped") else "err"
    v = ns_of(r, warm)
    if v is None:
        return "?"
    s = "{:,.0f}".format(v) if v >= 100 else "%.1f" % v
    if r.get("truncated"):
        s += "†"
    return s


def build(peer_rows, gpumem_rows=None, warm=False, peers=None):
    """The markdown text (table and notes) for the given rows."""
    by = latest([r for r in peer_rows if r.get("peer") and r.get("trace")],
                lambda r: (r["trace"], r["peer"]))
    gm = latest([r for r in (gpumem_rows or []) if r.get("trace")], lambda r: r["trace"])
    seen_peers = []
    for (_, p) in by:
        if p not in seen_peers:
            seen_peers.append(p)
    if peers:
        cols = [p for p in peers if p in seen_peers]
    else:
        cols = [p for p in PEER_ORDER if p in seen_peers] + \
               [p for p in seen_peers if p not in PEER_ORDER]
    traces = []
    for t in TRACE_ORDER + [t for (t, _) in by] + list(gm):
        if t not in traces and (any(k[0] == t for k in by) or t in gm):
            traces.append(t)

    head = ["trace"]
    for p in cols:
        head += ["%s ratio" % p, "%s ns/op" % p]
    head.append("best peer ratio")
    if gpumem_rows is not None:
        head += ["gpumem ratio", "gpumem ns/op", "beats all on ratio",
                 "<= 1/2 %s time" % TIME_BASELINE]
    lines = ["| " + " | ".join(head) + " |",
             "| --- |" + " ---: |" * (len(head) - 1)]
    notes = []
    for t in traces:
        cells = [t]
        best = None
        for p in cols:
            r = by.get((t, p))
            cells += [fmt_ratio(r), fmt_ns(r, warm)]
            if r is not None and "error" in r:
                notes.append("%s on %s: %s" % (p, t, r["error"]))
            elif r is not None and r.get("truncated"):
                notes.append("%s on %s: † first %s of %s events only" % (
                    p, t, r.get("events"), r.get("trace_events", "?")))
            elif r is not None and r.get("ooms"):
                notes.append("%s on %s: %d requests refused (OOM)" % (p, t, r["ooms"]))
            if p not in NOT_PEERS and usable(r) and (best is None or r["ratio"] < best[0]):
                best = (r["ratio"], p, r)
        cells.append("%.3f (%s)" % (best[0], best[1]) if best else "—")
        if gpumem_rows is not None:
            g = gm.get(t)
            cells += [fmt_ratio(g), fmt_ns(g, warm)]
            if g is not None and "error" in g:
                notes.append("gpumem on %s: %s" % (t, g["error"]))
            if g is None or not usable(g) or best is None:
                beats = "—"
            elif g.get("events") is not None and best[2].get("events") is not None \
                    and g["events"] != best[2]["events"]:
                beats = "— (events differ)"
                notes.append("gpumem on %s replayed %s events, %s replayed %s" % (
                    t, g["events"], best[1], best[2]["events"]))
            else:
                # Peers' ratios are rounded to 4 decimals: compare the bytes
                # held where both sides give them, so that a tie is a tie.
                gb, pb = g.get("peak_reserved_bytes"), best[2].get("peak_reserved_bytes")
                if gb is not None and pb is not None and g.get("peak_live_bytes") == best[2].get("peak_live_bytes"):
                    beats = "yes" if gb < pb else ("tie" if gb == pb else "NO")
                else:
                    beats = "yes" if g["ratio"] < best[0] else "NO"
            cells.append(beats)
            base = by.get((t, TIME_BASELINE))
            gns, bns = ns_of(g, warm), ns_of(base, warm)
            if gns is None or bns is None or (base is not None and base.get("truncated")):
                cells.append("—")
            else:
                cells.append("yes" if gns <= bns / 2 else "NO (%.2fx)" % (gns / bns))
        lines.append("| " + " | ".join(cells) + " |")

    text = "\n".join(lines) + "\n"
    text += ("\nratio = peak device memory held from the driver / peak live bytes of the "
             "trace; ns/op = %s, per alloc or free.\n" %
             ("second pass with the pool kept (ns_per_op_warm) where measured"
              if warm else "first pass from an empty pool"))
    runs = sorted({len(r.get("ns_per_op_runs") or []) for r in list(by.values()) + list(gm.values()) if r})
    if runs and runs[-1] > 1:
        text += ("Rows with ns_per_op_runs (gpumem, the C++ peers) give the median of "
                 "that many runs (%s); the others, one run.\n" % ", ".join(str(n) for n in runs if n > 1))
    if notes:
        text += "\n" + "\n".join("- " + n for n in notes) + "\n"
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peers_file")
    ap.add_argument("gpumem_file", nargs="?")
    ap.add_argument("--warm", action="store_true",
                    help="time columns from ns_per_op_warm where present")
    ap.add_argument("--peers", help="comma-separated peer columns, in this order")
    a = ap.parse_args(argv)
    rows = read_jsonl(a.peers_file)
    g = read_jsonl(a.gpumem_file) if a.gpumem_file else None
    sys.stdout.write(build(rows, g, warm=a.warm,
                           peers=a.peers.split(",") if a.peers else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
