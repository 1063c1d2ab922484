"""table.py FILE...: the table of the training suite's JSON lines.

Per program: the process's peak device memory (NVML) under each allocator,
gpumem's against the lower of PyTorch's two, the median step time after
warm-up under each and gpumem's difference from the mean of two native
runs beside the spread between those two (the run-to-run noise), how closely the losses
match (the largest relative difference from the first native run, for
gpumem and for the second native run), and how long after del + gc +
empty_cache the NVML figure took to come back within 64 MiB."""

import json
import sys

GIB = 1 << 30


def load(*paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    r = json.loads(line)
                    rows[(r["program"], r["allocator"], r.get("tag", ""))] = r  # the last run wins
    return rows


def _loss_diff(a, b):
    if not a or not b or len(a) != len(b):
        return None
    return max(abs(x - y) / max(abs(x), 1e-9) for x, y in zip(a, b))


def _fmt(v, f="%.2f"):
    return "-" if v is None else f % v


def render(rows):
    progs = []
    for (p, _, _) in rows:
        if p not in progs:
            progs.append(p)
    out = ["| program | NVML peak GiB: native / expandable / gpumem | gpumem / best | peak reserved GiB: native / exp / gpumem "
           "| median step ms: native / native2 / exp / gpumem | gpumem vs native mean (native spread) | loss diff: gpumem (native2) | release ms: native / gpumem |",
           "| --- | --- | ---: | --- | --- | ---: | ---: | --- |"]
    for p in progs:
        n, n2 = rows.get((p, "native", "")), rows.get((p, "native", "repeat"))
        e, g = rows.get((p, "expandable", "")), rows.get((p, "gpumem", ""))

        def get(r, k):
            return None if r is None or "error" in r else r.get(k)

        peaks = [get(r, "nvml_peak_bytes") for r in (n, e, g)]
        best = min([x for x in peaks[:2] if x] or [0]) or None
        ratio = peaks[2] / best if peaks[2] and best else None
        res = [get(r, "peak_reserved_bytes") for r in (n, e, g)]
        steps = [get(r, "median_step_ms") for r in (n, n2, e, g)]
        natives = [x for x in steps[:2] if x]
        mean = sum(natives) / len(natives) if natives else None
        diff = (steps[3] / mean - 1) * 100 if steps[3] and mean else None
        noise = abs(steps[1] - steps[0]) / mean * 100 if len(natives) == 2 else None
        lg = _loss_diff(get(n, "losses"), get(g, "losses"))
        ln = _loss_diff(get(n, "losses"), get(n2, "losses"))
        rel = [get(r, "release_ms") for r in (n, g)]
        errs = [r["allocator"] + (":" + r["tag"] if r.get("tag") else "") for r in (n, n2, e, g) if r and "error" in r]
        out.append("| %s%s | %s | %s | %s | %s | %s%% (%s%%) | %s (%s) | %s |" % (
            p, " (failed: " + ", ".join(errs) + ")" if errs else "",
            " / ".join(_fmt(x / GIB if x else None) for x in peaks),
            _fmt(ratio, "%.3f"),
            " / ".join(_fmt(x / GIB if x else None) for x in res),
            " / ".join(_fmt(x, "%.1f") for x in steps),
            _fmt(diff, "%+.1f"), _fmt(noise, "%.1f"),
            _fmt(lg, "%.1e"), _fmt(ln, "%.1e"),
            " / ".join(_fmt(x, "%.1f") for x in rel)))
    return "\n".join(out)


if __name__ == "__main__":
    print(render(load(*sys.argv[1:])))
