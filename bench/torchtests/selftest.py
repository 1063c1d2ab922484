#!/usr/bin/env python3
"""Checks of bench/torchtests that need no GPU and no PyTorch.

    python3 bench/torchtests/selftest.py

- compare.py on the junit/record fixtures of testdata/ (basic: the four junit
  files; crash: a run whose processes died, with ISOLATE=1 reruns);
- the expecttest and psutil stand-ins;
- run.sh end to end, when this interpreter has pytest: with stand-in torch and
  gpumem.torch modules (written to a temporary folder and put first on
  PYTHONPATH) and a small unittest file whose tests pass, fail, crash the
  process (os.abort) or hang only under "gpumem", so that the selection by
  name, the record, the new process after each death, the watchdog, ISOLATE=1
  and the table are all exercised.

Prints "selftest: ok" and exits 0 when all pass.
"""

import io
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import compare  # noqa: E402
import torchtests_plugin  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)


def report_text(out):
    buf = io.StringIO()
    compare.report(out, "native", "gpumem", w=buf)
    return buf.getvalue()


def test_compare_basic():
    out = os.path.join(HERE, "testdata", "basic")
    t = report_text(out)
    check("graphs     native          8        4        1        0        2        1        0        0" in t, "basic: graphs native row")
    check("graphs     gpumem          8        2        2        1        2        1        0        0" in t, "basic: graphs gpumem row")
    check("memory     gpumem          7        3        2        0        2        0        0        0" in t, "basic: memory gpumem row")
    check("== graphs: 2 test(s) whose outcome differs" in t, "basic: graphs difference count")
    check("passed -> error    TestCuda::test_graph_concurrent_replay" in t, "basic: teardown error is a difference")
    check("gpumem: KeyError: 'active_bytes.all.freed'" in t, "basic: first line of the gpumem failure")
    check("gpumem: AssertionError: RuntimeError not raised" in t, "basic: message from the failure text when its attribute is empty")
    check("absent -> passed   TestCuda::test_only_under_gpumem" in t, "basic: a test under one allocator only")
    check("1 test(s) that fail under both" in t and "test_accelerator_graph_simple" in t, "basic: failing under both listed apart")
    check("test_cuda_graph_raw_graph" not in t, "basic: equal skips are no difference")
    d = compare.differing(compare.load_run(out, "native", "graphs"), compare.load_run(out, "gpumem", "graphs"))
    check([k for k, _, _ in d] == ["TestCuda::test_graph_concurrent_replay", "TestCuda::test_graph_two_successive"], f"basic: differing keys {d}")


def test_compare_crash():
    out = os.path.join(HERE, "testdata", "crash")
    r = compare.load_run(out, "gpumem", "memory")
    check(r["TestCuda::test_memory_allocation"][0] == "passed", "crash: result of a process that died kept from the record")
    check(r["TestCuda::test_record_stream"][0] == "crashed" and "SIGSEGV" in r["TestCuda::test_record_stream"][1], "crash: SIGSEGV test")
    check(r["TestCuda::test_streams"][0] == "crashed" and "timeout" in r["TestCuda::test_streams"][1], "crash: timed-out test")
    check(r["TestCuda::test_stream_context_manager"][0] == "not run", "crash: selected test never started")
    check(r["TestCuda::test_caching_allocator_record_stream_oom"][0] == "failed", "crash: failure from the record")
    t = report_text(out)
    check("[alone: native passed, gpumem passed]" in t, "crash: isolated outcomes shown")
    check("memory     gpumem          5        1        1        0        0        0        2        1" in t, "crash: gpumem row")


def test_selection():
    inc = torchtests_plugin.words("memory,oom,alloc,stream,cache,fraction,record,snapshot,pool")
    exc = ["graph"]
    sel = lambda c, n, m=False: torchtests_plugin.name_selected(c, n, inc, exc, m)  # noqa: E731
    check(sel("TestCuda", "test_record_stream"), "selection: record_stream in memory")
    check(not sel("TestCuda", "test_graph_record_stream"), "selection: graph tests leave memory")
    check(not sel("TestCudaMallocAsync", "test_temperature"), "selection: class name not matched by default")
    check(sel("TestCudaMallocAsync", "test_temperature", True), "selection: class name matched with --tt-match-class")
    check(torchtests_plugin.name_selected("X", "test_cuda_Graph_x", ["graph"], []), "selection: case-insensitive")


def test_stubs():
    sys.path.insert(0, os.path.join(HERE, "stubs"))
    sys.path.insert(0, os.path.join(HERE, "stubs_psutil"))
    try:
        import expecttest
        import psutil
    finally:
        sys.path.pop(0)
        sys.path.pop(0)
    check(getattr(expecttest, "STAND_IN", False), "stubs: expecttest stand-in imported")
    check(getattr(psutil, "STAND_IN", False), "stubs: psutil stand-in imported")
    check(isinstance(psutil.disk_partitions(), list), "stubs: psutil.disk_partitions")
    try:
        psutil.cpu_count
        check(False, "stubs: psutil stand-in must not invent attributes")
    except AttributeError:
        pass

    class T(expecttest.TestCase):
        def test_equal(self):
            self.assertExpectedInline("a\nb", """\
a
b""")

        def test_cpp_stack(self):
            self.assertExpectedInline("boom\nException raised from f at x.cpp:1", "boom")

        def test_differs(self):
            self.assertExpectedInline("a", "b")

    r = unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(T))
    check(r.testsRun == 3 and len(r.failures) == 1 and "test_differs" in r.failures[0][0].id(),
          f"stubs: assertExpectedInline passes equal text, fails different text ({r.failures})")
    expecttest.ACCEPT = "1"
    try:
        r = unittest.TextTestRunner(stream=io.StringIO()).run(T("test_differs"))
        check(len(r.failures) == 1 and "cannot rewrite" in r.failures[0][1], "stubs: ACCEPT never lets a mismatch pass")
    finally:
        expecttest.ACCEPT = None


FAKE_TORCH = '''
__version__ = "0.0+stand-in"
class version:
    cuda = "stand-in"
from . import cuda
'''
FAKE_TORCH_CUDA = '''
_pluggable = False
def init():
    pass
def get_allocator_backend():
    return "pluggable" if _pluggable else "native"
def get_device_name(i=0):
    return "no device (selftest)"
'''
FAKE_GPUMEM_TORCH = '''
_on = False
def use(limit=None, *, config=None):
    global _on
    import torch.cuda
    torch.cuda._pluggable = True
    _on = True
def installed():
    return _on
'''
FAKE_TESTS = '''
import os, time, unittest
import gpumem.torch
G = gpumem.torch.installed()

class TestCuda(unittest.TestCase):
    def test_graph_same(self):
        pass
    def test_graph_differs(self):
        self.assertFalse(G, "differs under gpumem")
    def test_graph_crash(self):
        if G:
            os.abort()
    def test_graph_hang(self):
        if G:
            time.sleep(60)
    @unittest.expectedFailure
    def test_graph_xfail(self):
        self.fail("expected")
    def test_graph_memory_not_in_memory(self):
        pass
    @unittest.skip("skipped everywhere")
    def test_memory_skip(self):
        pass
    def test_memory_both_fail(self):
        self.fail("fails everywhere")
    def test_record_stream_env(self):
        self.assertNotIn("GPUMEM_TORCH_ALLOCATOR", os.environ)
    def test_unselected(self):
        pass
'''


def test_run_sh():
    py = None
    for cand in (sys.executable, "/usr/bin/python3"):
        if cand and subprocess.run([cand, "-c", "import pytest"], capture_output=True).returncode == 0:
            py = cand
            break
    if py is None:
        print("selftest: run.sh end to end skipped: no interpreter here has pytest")
        return
    tmp = tempfile.mkdtemp(prefix="torchtests-selftest-")
    try:
        fake = os.path.join(tmp, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        os.makedirs(os.path.join(fake, "gpumem"))
        for path, text in ((("torch", "__init__.py"), FAKE_TORCH), (("torch", "cuda.py"), FAKE_TORCH_CUDA),
                           (("gpumem", "__init__.py"), ""), (("gpumem", "torch.py"), FAKE_GPUMEM_TORCH)):
            with open(os.path.join(fake, *path), "w") as f:
                f.write(textwrap.dedent(text))
        tests = os.path.join(tmp, "test_fake_cuda.py")
        with open(tests, "w") as f:
            f.write(FAKE_TESTS)
        out = os.path.join(tmp, "out")
        env = dict(os.environ, OUT=out, TEST_FILE=tests, PYTHON=py, EXTRA_PYTHONPATH=fake,
                   GPUMEM_LIBRARY="/nonexistent/selftest", TEST_TIMEOUT="4", ISOLATE="1",
                   ISOLATE_TIMEOUT="60", RUN_TIMEOUT="120", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        p = subprocess.run(["bash", os.path.join(HERE, "run.sh"), "graphs", "memory"], env=env,
                           capture_output=True, text=True, timeout=600)
        t = p.stdout
        check(p.returncode == 0, f"run.sh: exit status {p.returncode}\n{p.stdout}\n{p.stderr}")
        check("native: torch 0.0+stand-in" in t and "alloc_conf=-" in t, "run.sh: preflight line, PYTORCH_CUDA_ALLOC_CONF cleared")
        check("gpumem_installed=True" in t, "run.sh: gpumem preflight")
        r = compare.load_run(out, "gpumem", "graphs")
        n = compare.load_run(out, "native", "graphs")
        m = compare.load_run(out, "gpumem", "memory")
        if r is None or n is None or m is None:
            check(False, f"run.sh: runs missing\n{t}\n{p.stderr}")
            return
        check(set(n) == {"TestCuda::test_graph_same", "TestCuda::test_graph_differs", "TestCuda::test_graph_crash",
                         "TestCuda::test_graph_hang", "TestCuda::test_graph_xfail",
                         "TestCuda::test_graph_memory_not_in_memory"}, f"run.sh: graphs selection {sorted(n)}")
        check(set(m) == {"TestCuda::test_memory_skip", "TestCuda::test_memory_both_fail",
                         "TestCuda::test_record_stream_env"}, f"run.sh: memory selection {sorted(m)}")
        check(all(v[0] in ("passed", "xfailed") for v in n.values()), f"run.sh: native graphs {n}")
        check(r["TestCuda::test_graph_differs"][0] == "failed", "run.sh: gpumem difference recorded")
        check(r["TestCuda::test_graph_crash"][0] == "crashed" and "SIGABRT" in r["TestCuda::test_graph_crash"][1],
              f"run.sh: abort recorded as a crash {r.get('TestCuda::test_graph_crash')}")
        check(r["TestCuda::test_graph_hang"][0] == "crashed", f"run.sh: watchdog ended the hang {r.get('TestCuda::test_graph_hang')}")
        check(r["TestCuda::test_graph_same"][0] == "passed" and r["TestCuda::test_graph_xfail"][0] == "xfailed",
              "run.sh: tests after the deaths ran in new processes")
        check(m["TestCuda::test_record_stream_env"][0] == "passed", "run.sh: children do not inherit GPUMEM_TORCH_ALLOCATOR")
        check(m["TestCuda::test_memory_skip"][0] == "skipped" and m["TestCuda::test_memory_both_fail"][0] == "failed",
              "run.sh: skip and failure")
        cmp_txt = open(os.path.join(out, "compare.txt")).read()
        check("== graphs: 3 test(s) whose outcome differs" in cmp_txt, f"run.sh: compare.txt\n{cmp_txt}")
        check("[alone: native passed, gpumem failed]" in cmp_txt, "run.sh: ISOLATE=1 outcome of the failing test")
        check("[alone: native passed, gpumem crashed]" in cmp_txt, "run.sh: ISOLATE=1 outcome of a crashing test")
        check("1 test(s) that fail under both" in cmp_txt, "run.sh: failing under both")
        check(os.path.exists(os.path.join(out, "gpumem-graphs.log")) and
              "Timeout" in open(os.path.join(out, "gpumem-graphs.log")).read(), "run.sh: watchdog stacks in the log")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    r = subprocess.run(["bash", "-n", os.path.join(HERE, "run.sh")], capture_output=True, text=True)
    check(r.returncode == 0, f"bash -n run.sh: {r.stderr}")
    test_compare_basic()
    test_compare_crash()
    test_selection()
    test_stubs()
    test_run_sh()
    if FAILS:
        print(f"selftest: {len(FAILS)} failure(s)")
        return 1
    print("selftest: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
