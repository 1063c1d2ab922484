"""Ten-pass fit figures before and after, against the bar max(1.02, ideal +
0.005): python3 fit_table.py IDEAL BEFORE AFTER (IDEAL: the ideal model's
table, bench/results/sim-fitbars-d09611a/ideal.txt; BEFORE, AFTER: lines of
`gpumem fit --passes 10` prefixed with the trace's path)."""
import sys


def load(path):
    d = {}
    for line in open(path):
        w = line.split()
        if len(w) >= 6:
            d[w[0].split("/")[-1].replace(".trace.gz", "")] = (float(w[4]), w[2] + " " + w[3])
    return d


ideal = {}
for line in open(sys.argv[1]):
    w = line.split()
    try:
        ideal[w[0]] = float(w[3])
    except (IndexError, ValueError):
        pass
before, after = load(sys.argv[2]), load(sys.argv[3])
miss = [0, 0]
print("| program | ideal | bar | before | after | change |")
print("|---|---:|---:|---|---|---:|")
for k in sorted(after):
    bar = max(1.02, ideal.get(k, 0) + 0.005)
    cells = []
    for i, d in enumerate((before, after)):
        over = d[k][0] > bar
        miss[i] += over
        cells.append(f"{'✗ ' if over else ''}{d[k][0]:.3f} ({d[k][1]})")
    print(f"| {k} | {ideal.get(k, 0):.4f} | {bar:.4f} | {cells[0]} | {cells[1]} | {after[k][0] - before[k][0]:+.3f} |")
print()
print(f"over the bar: {miss[0]} before, {miss[1]} after, of {len(after)}")
