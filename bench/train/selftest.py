#!/usr/bin/env python3
"""selftest.py: checks of bench/train's offline parts, run anywhere (no GPU,
no torch), from the repository root:

    python3 bench/train/selftest.py

- replay_check.py replays each recorded trace (build/gpumem, skipped,
  saying so, without it; on the simulated device) and compares its peak
  reserved bytes with the run's: within 1% agrees, more disagrees (exit
  1), a trace without its stats is skipped, nothing to check is exit 2.
- history_probe.py compare: two hand-made PyTorch memory histories, equal
  up to one request that the replay places elsewhere and maps a page for:
  the first differing placement and reserved figure, both peaks; and
  fixture: a history's requests as a trace and each allocation's offset in
  its pool.
- ddp_table.py's steady-step line of gpumem's slow path: the medians of a
  hand-made record's steady steps, and none for a record made before the
  event calls were counted.
- programs.py, parsed (not imported: it needs torch): every PROGRAMS
  entry names a function (steps, log, seed=0) of the module, with more
  steps than run.py's warm-up, listed in the module's docstring.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GPUMEM = os.path.join(ROOT, "build", "gpumem")
TRACE = os.path.join(ROOT, "testdata", "traces", "resnet50_train.trace.gz")
CHECK = os.path.join(HERE, "replay_check.py")


@unittest.skipUnless(os.path.exists(GPUMEM), "build/gpumem missing: CGO_ENABLED=0 go build -o build/gpumem ./cmd/gpumem")
class ReplayCheck(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        out = subprocess.run([GPUMEM, "replay", "--json", TRACE], capture_output=True, text=True, check=True)
        self.peak = int(json.loads(out.stdout.splitlines()[0])["peak_reserved_bytes"])

    def run_check(self):
        return subprocess.run([sys.executable, CHECK, self.dir, GPUMEM], capture_output=True, text=True)

    def write(self, prog, peak, stats=True):
        shutil.copy(TRACE, os.path.join(self.dir, prog + ".gpumem.trace.gz"))
        if stats:
            with open(os.path.join(self.dir, prog + ".gpumem.stats.json"), "w") as f:
                json.dump({"peak_reserved": peak}, f)

    def test_agreement_and_disagreement(self):
        self.write("close", int(self.peak * 1.005))
        self.write("orphan", 0, stats=False)
        p = self.run_check()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"close\s+\d+\s+%d\s+0\.99\d\d  yes" % self.peak)
        self.assertIn("orphan: no orphan.gpumem.stats.json: skipped", p.stderr)
        self.write("far", int(self.peak * 1.05))
        p = self.run_check()
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertRegex(p.stdout, r"far\s+\d+\s+%d\s+0\.95\d\d  NO" % self.peak)

    def test_nothing_to_check(self):
        self.assertEqual(self.run_check().returncode, 2)


class PressureTable(unittest.TestCase):
    """pressure_table.py: a row per program; the recording run left out;
    a failed run at the limit counted as an out-of-memory when it says
    so; device calls compared with the unlimited runs'; the splits of
    each run at the limit."""

    def test_rows(self):
        sys.path.insert(0, HERE)
        import pressure_table

        def run(prog, tag, creates, peak, step, loss, splits=0):
            st = {"Creates": creates, "Maps": 5, "Unmaps": 5, "Releases": 1, "PeakReserved": peak, "Splits": splits}
            return {"program": prog, "allocator": "gpumem", "tag": tag, "gpumem_stats": st,
                    "median_step_ms": step, "losses": [9.0, loss]}
        rows = [run("a", "record", 99, 3 << 30, 50.0, 1.0),
                run("a", "unlimited", 10, 2 << 30, 40.0, 1.5),
                run("a", "limit=2GiB", 10, 2 << 30, 41.0, 1.5),
                run("b", "unlimited", 10, 1 << 30, 10.0, 2.0),
                {"program": "b", "allocator": "gpumem", "tag": "limit=1GiB",
                 "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB"},
                run("b", "limit=1GiB", 12, 1 << 30, 11.0, 2.0, splits=3)]
        lines = pressure_table.table(rows).splitlines()
        self.assertEqual(len(lines), 4, lines)
        self.assertEqual(lines[2], "| a | 2GiB | 0 of 1 | 2.000 (2.000) | 41.0 (40.0) | 1.50000 (1.50000) | yes | 0 |")
        self.assertEqual(lines[3], "| b | 1GiB | 1 of 2 | 1.000 (1.000) | 11.0 (10.0) | 2.00000 (2.00000) | no | 3 |")


class HistoryCompare(unittest.TestCase):
    """history_probe.py compare on two small histories (pickled dicts as
    torch.cuda.memory._snapshot() gives): the replay puts the third
    allocation after the second instead of where the first was freed, and
    maps a second page for it."""

    def test_first_difference(self):
        import pickle
        M = 1 << 20

        def ev(action, addr, size):
            return {"action": action, "addr": addr, "size": size, "stream": 0}
        real = [ev("segment_map", 1000, 2 * M), ev("alloc", 1000, M), ev("alloc", 1000 + M, 512),
                ev("free_requested", 1000, M), ev("free_completed", 1000, M), ev("alloc", 1000, M)]
        replay = real[:5] + [ev("segment_map", 1000 + 2 * M, 2 * M), ev("alloc", 1000 + M + 512, M)]
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        paths = []
        for name, evs in (("real", real), ("replay", replay)):
            paths.append(os.path.join(d, name + ".pickle"))
            with open(paths[-1], "wb") as f:
                pickle.dump({"device_traces": [evs], "segments": []}, f)
        out = subprocess.run([sys.executable, os.path.join(HERE, "history_probe.py"), "compare"] + paths,
                             capture_output=True, text=True, check=True)
        got = json.loads(out.stdout)
        self.assertEqual(got["real"]["peak_reserved"], 2 * M)
        self.assertEqual(got["replay"]["peak_reserved"], 4 * M)
        self.assertEqual(got["replay"]["peak_at_request"], 3)
        self.assertIsNone(got["first_request_differs"])
        self.assertEqual(got["first_placement_differs"]["index"], 3)
        self.assertEqual(got["first_reserved_differs"]["index"], 3)
        self.assertEqual(got["first_placement_differs"]["real"][-1], ["alloc", M, 0, 2 * M])
        self.assertEqual(got["first_placement_differs"]["replay"][-1], ["alloc", M, M + 512, 4 * M])

    def test_fixture(self):
        """fixture: the requests as a trace with IDs in allocation order, and
        each allocation's offset from the lowest address of its pool."""
        import gzip
        import pickle
        M = 1 << 20

        def ev(action, addr, size):
            return {"action": action, "addr": addr, "size": size, "stream": 0}
        hist = [ev("segment_map", 10 * M, 20 * M), ev("alloc", 10 * M, 2 * M), ev("alloc", 90 * M, 512),
                ev("alloc", 12 * M, 3 * M), ev("free_requested", 10 * M, 2 * M), ev("free_completed", 10 * M, 2 * M),
                ev("alloc", 90 * M + 512, 1024), ev("alloc", 10 * M, M + 512)]
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        src = os.path.join(d, "h.pickle")
        with open(src, "wb") as f:
            pickle.dump({"device_traces": [hist], "segments": []}, f)
        subprocess.run([sys.executable, os.path.join(HERE, "history_probe.py"), "fixture", src, os.path.join(d, "x")],
                       capture_output=True, text=True, check=True)
        with gzip.open(os.path.join(d, "x.trace.gz"), "rt") as f:
            lines = [x.strip() for x in f if not x.startswith("#")]
        self.assertEqual(lines, ["a 0 %d 0 0" % (2 * M), "a 1 512 0 0", "a 2 %d 0 0" % (3 * M), "f 0 0",
                                 "a 3 1024 0 0", "a 4 %d 0 0" % (M + 512)])
        with gzip.open(os.path.join(d, "x.offsets.gz"), "rt") as f:
            offs = [int(x) for x in f if not x.startswith("#")]
        self.assertEqual(offs, [0, 0, 2 * M, 512, 0])


class Programs(unittest.TestCase):
    """programs.py, read without importing it (it needs torch): PROGRAMS is
    a literal dict of name -> (function, steps) that run.py, suite.py and
    scripts/gpu.sh take as they find it, so every entry must name a
    function of the module taking (steps, log, seed=0), give more steps
    than run.py's warm-up (2 at least), and be listed in the module's
    docstring."""

    def test_entries(self):
        import ast
        with open(os.path.join(HERE, "programs.py")) as f:
            mod = ast.parse(f.read())
        doc = ast.get_docstring(mod)
        funcs = {n.name: n for n in mod.body if isinstance(n, ast.FunctionDef)}
        table = [n.value for n in mod.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "PROGRAMS" for t in n.targets)]
        self.assertEqual(len(table), 1)
        names = []
        for key, val in zip(table[0].keys, table[0].values):
            name = ast.literal_eval(key)
            names.append(name)
            fn, steps = val.elts
            self.assertEqual(fn.id, name)
            self.assertIn(name, funcs)
            args = funcs[name].args
            self.assertEqual([a.arg for a in args.args], ["steps", "log", "seed"], name)
            self.assertEqual(ast.literal_eval(args.defaults[0]), 0, name)
            self.assertGreater(ast.literal_eval(steps), 2, name)  # run.py's warm-up is 2 steps at least
            self.assertRegex(doc, r"\n    %s " % name)
        for name in ("gpt2_generate", "beam_search_decode", "infer_server"):
            self.assertIn(name, names)


class DDPTableMisses(unittest.TestCase):
    def test_misses(self):
        sys.path.insert(0, HERE)
        import ddp_table
        # Ten steps, the longest first at step 4: steady steps 5..9.
        lengths = [64, 128, 256, 512, 1024, 256, 1024, 64, 128, 512]
        per = {"Misses": [9, 9, 9, 9, 10, 20, 30, 40, 50, 60],
               "MissNanos": [0] * 4 + [1e6, 2e6, 3e6, 4e6, 5e6, 6e6],
               "EventCalls": [0] * 4 + [1, 2, 3, 4, 5, 6],
               "EventNanos": [0] * 4 + [1e5, 2e5, 3e5, 4e5, 5e5, 6e5],
               "DriverNanos": [0] * 10, "WaitNanos": [0] * 4 + [0, 0, 0, 1e6, 1e6, 1e6]}
        rec = {"lengths": lengths, "gpumem_per_step": per}
        self.assertEqual(ddp_table.steady(rec), [5, 6, 7, 8, 9])
        line = ddp_table.misses(rec)
        self.assertEqual(line, "40 misses in 4.00 ms; 4 event calls in 0.40 ms; driver calls 0.00 ms, fences 1.00 ms")
        del per["EventNanos"]
        self.assertIsNone(ddp_table.misses(rec))


if __name__ == "__main__":
    unittest.main()
