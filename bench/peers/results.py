#!/usr/bin/env python3
"""Reading and appending the JSON-lines result files (standard library only).

    results.py record OUT.jsonl PEER TRACE RC WALL_S STDOUT_FILE STDERR_FILE
        Append what one replay_peer.py process left: its JSON line when it printed
        one, otherwise an error line naming the exit status (124/137: timeout) and
        the end of its stderr. Prints a one-line summary.
    results.py skip OUT.jsonl PEER TRACE REASON
        Append {"peer", "trace", "error": "skipped: REASON", "skipped": true}.

run_all.sh calls these so that every process leaves exactly one line, success or
not; table.py reads the files with read_jsonl().
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import tracefile  # noqa: E402


def read_jsonl(path):
    """All JSON objects in the file, in order; blank and unparsable lines skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    return rows


def last_json_line(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def make_record(peer, trace_path, rc, wall_s, stdout_text, stderr_text, timeout_s=None):
    name = tracefile.trace_name(trace_path)
    obj = last_json_line(stdout_text)
    if obj is not None and rc == 0 and "error" not in obj:
        obj.setdefault("peer", peer)
        obj.setdefault("trace", name)
        obj["process_wall_s"] = wall_s
        return obj
    rec = {"peer": peer, "trace": name, "rc": rc, "process_wall_s": wall_s}
    if obj is not None and "error" in obj:
        rec.update({k: v for k, v in obj.items() if k not in rec})
        return rec
    tail = [l for l in stderr_text.strip().splitlines() if l.strip()][-3:]
    if rc in (124, 137):
        why = "timeout" + (" after %ss" % timeout_s if timeout_s else "") + " (rc %d)" % rc
    elif rc < 0 or rc > 128:
        why = "killed by signal %d" % (-rc if rc < 0 else rc - 128)
    else:
        why = "exit status %d, no JSON line" % rc
    rec["error"] = why + (": " + " | ".join(tail) if tail else "")
    rec["error"] = rec["error"][:800]
    return rec


def append(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")


def summary(obj):
    if "error" in obj:
        return "%-22s %-22s ERROR %s" % (obj.get("peer"), obj.get("trace"), obj["error"][:160])
    extra = []
    if obj.get("truncated"):
        extra.append("truncated to %s events" % obj.get("events"))
    if obj.get("ooms"):
        extra.append("%s OOMs" % obj["ooms"])
    ratio = obj.get("ratio")
    return "%-22s %-22s ratio %s  %8.1f ns/op%s" % (
        obj.get("peer"), obj.get("trace"),
        "%.3f" % ratio if isinstance(ratio, (int, float)) else ratio,
        obj.get("ns_per_op") or float("nan"), ("  (" + ", ".join(extra) + ")") if extra else "")


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def main(argv):
    if len(argv) >= 8 and argv[1] == "record":
        out, peer, trace, rc, wall, so, se = argv[2:9]
        timeout_s = argv[9] if len(argv) > 9 else None
        rec = make_record(peer, trace, int(rc), float(wall), _read(so), _read(se), timeout_s)
        append(out, rec)
        print(summary(rec), flush=True)
        return 0
    if len(argv) == 6 and argv[1] == "skip":
        out, peer, trace, reason = argv[2:6]
        rec = {"peer": peer, "trace": tracefile.trace_name(trace),
               "error": "skipped: " + reason, "skipped": True}
        append(out, rec)
        print(summary(rec), flush=True)
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
