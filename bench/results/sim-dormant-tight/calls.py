import json, subprocess, sys, glob, os
bins = sys.argv[1:3]
rows = []
for f in sorted(glob.glob('build/fitB/*.txt')):
    n = os.path.basename(f)[:-4]
    line = [l for l in open(f) if l.startswith('gpumem ')]
    if not line: continue
    parts = line[0].split()
    cap = float(parts[1]); unit = parts[2]
    tr = f'bench/corpus/traces/{n}.trace.gz'
    if not os.path.exists(tr): tr = f'testdata/traces/{n}.trace.gz'
    out = [n]
    for fac in (1.0, 1.3):
        lim = "%.3f%s" % (cap * fac + 0.001, unit)
        for b in bins:
            r = json.loads(subprocess.run([b, 'replay', '--json', '--limit', lim, tr], capture_output=True, text=True).stdout.splitlines()[0])
            out.append((fac, b[-1], r['peak_reserved_bytes'] >> 20, r['maps'] + r['unmaps'] + r['creates'] + r['releases'], r['fences'], r['ooms']))
    rows.append(out)
    print(out, flush=True)
