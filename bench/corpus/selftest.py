#!/usr/bin/env python3
"""selftest.py: checks of the corpus harness that run anywhere (no GPU, no
torch), from the repository root:

    python3 bench/corpus/selftest.py

- shorten_sites rewrites the call sites of a trace to name no directory of
  the recording machine and leaves every other line as it was;
- summary.py splits replay lines by the manifest, and fails on a trace
  without a split;
- record_all.sh end to end, with build/gpumem (skipped, saying so, without
  it) and a stand-in for the GPU half of record.py that leaves the shipped
  fixture snapshot (testdata/fixtures/resnet18_snapshot.pickle) as a
  program's recording: one program recorded, one failing, one timing out,
  one past the budget; the traces come back in a tar, every program has a
  summary line, the failure's traceback is in the log.
"""
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import record  # noqa: E402  (record.py imports torch only to record)

GPUMEM = os.path.join(ROOT, "build", "gpumem")
FIXTURE = os.path.join(ROOT, "testdata", "fixtures", "resnet18_snapshot.pickle")


class RunPath(unittest.TestCase):
    def test_run_path(self):
        import run  # run.py imports torch only inside main
        self.assertEqual(run.run_path("out/lstm.trace.gz", 1), "out/lstm.run2.trace.gz")
        self.assertEqual(run.run_path("out/lstm.trace", 2), "out/lstm.run3.trace")
        self.assertEqual(run.run_path("lstm", 1), "lstm.run2")


class ShortenSites(unittest.TestCase):
    def test_rewrites_sites_only(self):
        root = "/home/u/gpumem"
        lines = [
            "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n",
            "s 1 forward /usr/lib/python3/dist-packages/torch/nn/modules/linear.py:125 < "
            "llama_train_varlen /home/u/gpumem/bench/corpus/programs.py:301 < "
            "_run /usr/lib/python3.12/threading.py:9 < f /opt/venv/lib/python3.12/site-packages/x.py:3\n",
            "s 2 <module> <frozen runpy>:88\n",
            "a 0 1024 0 0 1\n",
            "a 1 2048 94000000001 5 2\n",
            "f 0 7\n",
        ]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.trace.gz")
            with gzip.open(path, "wt") as f:
                f.writelines(lines)
            self.assertEqual(record.shorten_sites(path, root=root), 1)
            with gzip.open(path, "rt") as f:
                got = f.readlines()
        self.assertEqual(got[1], "s 1 forward site-packages/torch/nn/modules/linear.py:125 < "
                                 "llama_train_varlen bench/corpus/programs.py:301 < "
                                 "_run python/threading.py:9 < f site-packages/x.py:3\n")
        self.assertEqual(got[:1] + got[2:], lines[:1] + lines[2:])


class Summary(unittest.TestCase):
    def run_summary(self, lines):
        proc = subprocess.run([sys.executable, os.path.join(HERE, "summary.py")], input="".join(lines),
                              capture_output=True, text=True)
        return proc.returncode, proc.stdout, proc.stderr

    def line(self, trace, ratio, **kw):
        d = {"trace": trace, "events": 10, "peak_live_bytes": 2e9, "ratio": ratio, "ooms": 0, "ns_per_op": 100}
        d.update(kw)
        return json.dumps(d) + "\n"

    def test_by_split(self):
        rc, out, err = self.run_summary(["gpumem: no NVIDIA driver; using the simulated device\n",
                                         self.line("llama_train_varlen", 1.03),
                                         self.line("t5_beam_search", 1.01),
                                         self.line("vit_train", 1.05)])
        self.assertEqual(rc, 0, err)
        tune, holdout = out.split("### holdout")
        self.assertIn("| llama_train_varlen | 10 | 2.000 | 1.0300 |", tune)
        self.assertIn("1.0200 / 1.0300", tune)
        self.assertNotIn("vit_train |", tune)
        self.assertIn("| vit_train | 10 | 2.000 | 1.0500 |", holdout)
        self.assertIn("Not replayed: moe_top2_train", holdout)

    def test_passes_column(self):
        rc, out, _ = self.run_summary([self.line("vit_train", 1.05, passes={"n": 10, "ratio": 1.07})])
        self.assertEqual(rc, 0)
        self.assertIn("| vit_train | 10 | 2.000 | 1.0500 | 1.0700 |", out)

    def test_unknown_trace_fails(self):
        rc, _, err = self.run_summary([self.line("not_in_the_manifest", 1.0)])
        self.assertEqual(rc, 1)
        self.assertIn("not_in_the_manifest", err)

    def test_bad_line_fails(self):
        rc, _, err = self.run_summary(['{"trace": "vit_train"}\n'])
        self.assertEqual(rc, 1)
        self.assertIn("not a replay line", err)


FAKE_PYTHON = """#!/bin/bash
# Stands in for the GPU half of record.py; everything else is the real thing.
if [ "$1" = bench/corpus/record.py ] && [ "$2" = --no-import ]; then
  name=$3; dir=$4
  case $name in
    vit_train) echo "Traceback (most recent call last): RuntimeError: made to fail" >&2
               echo '{"name": "vit_train", "error": "RuntimeError: made to fail"}' >"$dir/$name.json"; exit 1 ;;
    infer_server) exec sleep 60 ;;
  esac
  cp %(fixture)s "$dir/$name.snapshot.pickle"
  echo '{"name": "'$name'", "streams": 1}' >"$dir/$name.json"
  exit 0
fi
if [ "$1" = -c ]; then exit 0; fi  # the versions line
exec %(python)s "$@"
"""


@unittest.skipUnless(os.access(GPUMEM, os.X_OK), "build/gpumem is not built (CGO_ENABLED=0 go build -o build/gpumem ./cmd/gpumem)")
@unittest.skipUnless(shutil.which("timeout"), "no timeout(1) on this machine")
class RecordAll(unittest.TestCase):
    def test_end_to_end(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "python")
            with open(fake, "w") as f:
                f.write(FAKE_PYTHON % {"fixture": FIXTURE, "python": sys.executable})
            os.chmod(fake, 0o755)
            out = os.path.join(d, "out")
            env = dict(os.environ, PYTHON=fake, TMPDIR=d)
            # infer_server starts within the budget (4 s) and times out at 5 s,
            # after it: t5_beam_search does not start.
            proc = subprocess.run(["bash", os.path.join(HERE, "record_all.sh"), "--timeout", "5", "--budget", "4",
                                   "--deadline", "30", "--out", out,
                                   "llama_train_varlen", "vit_train", "moe_top2_train", "infer_server",
                                   "t5_beam_search"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(sorted(os.listdir(out)), ["corpus-1.tar", "record.log", "summary.jsonl"])
            with open(os.path.join(out, "summary.jsonl")) as f:
                rows = {r["name"]: r for r in map(json.loads, f)}
            self.assertEqual(list(rows), ["llama_train_varlen", "vit_train", "moe_top2_train", "infer_server",
                                          "t5_beam_search"])
            for n in ("llama_train_varlen", "moe_top2_train"):
                self.assertNotIn("error", rows[n])
                self.assertIn("657 requests", rows[n]["import"])
                self.assertNotIn(d, rows[n]["import"])
            self.assertIn("made to fail", rows["vit_train"]["error"])
            self.assertIn("timed out", rows["infer_server"]["error"])
            self.assertIn("not started", rows["t5_beam_search"]["error"])
            with tarfile.open(os.path.join(out, "corpus-1.tar")) as t:
                self.assertEqual(sorted(t.getnames()), ["llama_train_varlen.trace.gz", "moe_top2_train.trace.gz"])
                data = t.extractfile("moe_top2_train.trace.gz").read()
            with gzip.open(io.BytesIO(data), "rt") as f:
                self.assertTrue(f.readline().startswith("# gpumem-trace v2"))
            with open(os.path.join(out, "record.log")) as f:
                log = f.read()
            self.assertIn("Traceback (most recent call last): RuntimeError: made to fail", log)
            self.assertEqual([p for p in os.listdir(d) if p.startswith("corpus.")], [], "work directory left behind")


if __name__ == "__main__":
    unittest.main()
