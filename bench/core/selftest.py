#!/usr/bin/env python3
"""selftest.py: checks of bench/core's tables, run anywhere (no GPU), from
the repository root:

    python3 bench/core/selftest.py

- tight_table.py (issue 30's time bar at the fit): over rounds, the ratio
  of the two medians, each side's range, the calls and splits of the first
  round, the OOMs of all rounds, and the count within twice.
- sim_vs_gpu.py: runs replayed the same way here agree (exit 0), and a run
  whose recorded calls differ is named (exit 1). Needs build/gpumem
  (skipped, saying so, without it).
- limits_ab.py: fit figures read from `gpumem fit`'s lines; a peak higher
  under the new build, one above its unlimited peak, and OOMs that differ
  are each named; the later passes' calls summed.
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GPUMEM = os.path.join(ROOT, "build", "gpumem")
TRACE = os.path.join(ROOT, "testdata", "traces", "resnet50_train.trace.gz")
sys.path.insert(0, HERE)

import limits_ab  # noqa: E402
import tight_table  # noqa: E402 (bench/core, beside this file)


def replay(ns_first, ns_later, events=1000, creates=10, splits=0, ooms=0):
    """A `gpumem replay --json --passes 10` object with the keys the table reads."""
    return {"events": events, "ns_per_op": ns_first, "ooms": ooms, "splits": splits,
            "creates": creates, "maps": creates, "unmaps": 0, "releases": 0,
            "passes": {"n": 10, "ns_per_op_later": ns_later, "ooms_later": 0, "splits_later": 2 * splits,
                       "creates_later": 0, "maps_later": 0, "releases_later": 0}}


class TightTable(unittest.TestCase):
    def table(self, lines):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                tight_table.main(f.name)
        finally:
            os.unlink(f.name)
        return out.getvalue().splitlines()

    def test_rounds(self):
        # Program a: unlimited 1 + 9 = 10 ms a round (1000 events, 1000 ns
        # a pass); at the limit 15, 30 and 12 ms: median 15, ratio 1.50.
        # Program b: 10 ms against 25, 25 and 25: ratio 2.50, over the bar.
        lines = []
        for rnd, lim in ((1, 1500), (2, 3000), (3, 1200)):
            lines.append({"path": "x/a.trace.gz", "round": rnd, "cap_mib": 100,
                          "unlimited": replay(1000, 1000), "gather": replay(lim, lim, creates=20, splits=3)})
            lines.append({"path": "x/b.trace.gz", "round": rnd, "cap_mib": 50,
                          "unlimited": replay(1000, 1000), "gather": replay(2500, 2500, ooms=1 if rnd == 2 else 0)})
        rows = self.table(lines)
        self.assertEqual(rows[2], "| a | 100 | 10.0 (10.0-10.0) | 15.0 (12.0-30.0) | 1.50 | 20 / 40 | 9 | 0 |")
        self.assertEqual(rows[3], "| b | 50 | 10.0 (10.0-10.0) | 25.0 (25.0-25.0) | 2.50 | 20 / 20 | 0 | 1 |")
        self.assertEqual(rows[-1], "2 programs, 3 round(s) each: median ratio 2.00, at most 2.50; within twice on 1 of 2")

    def test_one_round(self):
        rows = self.table([{"path": "a.trace.gz", "cap_mib": 100,
                            "unlimited": replay(1000, 1000), "gather": replay(1000, 3000)}])
        self.assertEqual(rows[2], "| a | 100 | 10.0 | 28.0 | 2.80 | 20 / 20 | 0 | 0 |")


@unittest.skipUnless(os.path.exists(GPUMEM), "build/gpumem missing: CGO_ENABLED=0 go build -o build/gpumem ./cmd/gpumem")
class SimVsGPU(unittest.TestCase):
    def replay(self, *extra):
        out = subprocess.run([GPUMEM, "replay", "--device", "sim", "--json", "--passes", "10", *extra, TRACE],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def check(self, line):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write(json.dumps(line) + "\n")
        try:
            return subprocess.run([sys.executable, os.path.join(HERE, "sim_vs_gpu.py"), f.name, GPUMEM],
                                  capture_output=True, text=True)
        finally:
            os.unlink(f.name)

    def test_same_and_different(self):
        line = {"path": TRACE, "round": 1, "cap_mib": 3100,
                "unlimited": self.replay(), "gather": self.replay("--gather", "--limit", "3100MiB")}
        r = self.check(line)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("2 runs decided the same", r.stdout)
        line["gather"]["maps"] += 1
        r = self.check(line)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("resnet50_train.trace.gz gather: simulated", r.stdout)



class LimitsAB(unittest.TestCase):
    def test_parse_fits(self):
        fits = limits_ab.parse_fits(["resnet50_train 2.92 GiB 1.003\n", "gpt2_generate 910.00 MiB 1.003\n",
                                     "garbage line\n", "x notanumber GiB\n"])
        self.assertEqual(fits, {"resnet50_train": int(2.92 * (1 << 30)), "gpt2_generate": 910 << 20})

    def test_compare(self):
        M = 1 << 20
        rows = {
            "same": {"base": (100 * M, 0, 10), "new": (100 * M, 0, 12), "unl_base": (100 * M, 0, 0), "unl_new": (100 * M, 0, 0)},
            "up": {"base": (100 * M, 0, 0), "new": (104 * M, 1, 5), "unl_base": (102 * M, 0, 0), "unl_new": (102 * M, 0, 0)},
            "down": {"base": (200 * M, 0, 0), "new": (190 * M, 0, 0), "unl_base": (195 * M, 0, 0), "unl_new": (195 * M, 0, 0)},
        }
        out = "\n".join(limits_ab.compare(rows, 1.3))
        self.assertIn("x1.3: 3 traces", out)
        self.assertIn("peak higher under NEW (MiB): [('up', 4)]", out)
        self.assertIn("peak lower under NEW (MiB): [('down', -10)]", out)
        self.assertIn("above their unlimited peak, BASE: [('down', 5)]", out)
        self.assertIn("above their unlimited peak, NEW: [('up', 2)]", out)
        self.assertIn("OOMs that differ (BASE, NEW): [('up', 0, 1)]", out)
        self.assertIn("later passes' VMM calls: BASE 10, NEW 17", out)


if __name__ == "__main__":
    unittest.main()
