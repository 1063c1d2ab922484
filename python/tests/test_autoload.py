"""gpumem run's hook for PyTorch and CuPy (gpumem/_autoload/sitecustomize.py),
run in a fresh interpreter with stand-ins: a package named torch that
records when it ran, and gpumem.torch replaced by one whose use() records
its call, so that no GPU and no PyTorch are needed. On a GPU machine
scripts/gpu.sh's python part runs the same programs under `gpumem run`
with the real frameworks."""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import needs_gpu

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
AUTOLOAD = os.path.join(PYTHON_DIR, "gpumem", "_autoload")


def _run(tmp_path, program, autoload="torch,cupy", extra_site=None):
    fake = tmp_path / "fake"
    if fake.exists():  # a second run in one test: the stand-ins are there
        return _start(tmp_path, fake, program, autoload, extra_site)
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("import sys\nsys.modules[__name__].ran = True\n")
    (fake / "cupy").mkdir()
    (fake / "cupy" / "__init__.py").write_text("")
    # Stand-ins for gpumem.torch and gpumem.cupy: a package gpumem earlier
    # on the path than the real one, which records use() calls.
    (fake / "gpumem").mkdir()
    (fake / "gpumem" / "__init__.py").write_text("calls = []\n")
    for fw in ("torch", "cupy"):
        (fake / "gpumem" / f"{fw}.py").write_text(textwrap.dedent(f"""
            import sys
            import gpumem
            def use():
                gpumem.calls.append(({fw!r}, {fw!r} in sys.modules and getattr(sys.modules[{fw!r}], "ran", True)))
        """))
    return _start(tmp_path, fake, program, autoload, extra_site)


def _start(tmp_path, fake, program, autoload, extra_site):
    path = [AUTOLOAD, str(fake)] + ([str(extra_site)] if extra_site else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), GPUMEM_AUTOLOAD=autoload)
    return subprocess.run([sys.executable, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_use_runs_once_right_after_the_import(tmp_path):
    r = _run(tmp_path, "import gpumem; assert gpumem.calls == [], gpumem.calls\n"
                       "import torch; import torch\n"
                       "print(gpumem.calls)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[('torch', True)]"


def test_nothing_happens_without_the_import_or_when_turned_off(tmp_path):
    r = _run(tmp_path, "import gpumem; print(gpumem.calls)")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
    r = _run(tmp_path, "import torch, cupy, gpumem; print(gpumem.calls)", autoload="")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
    r = _run(tmp_path, "import cupy, torch, gpumem; print(gpumem.calls)", autoload="cupy")
    assert r.returncode == 0 and r.stdout.strip() == "[('cupy', True)]", r.stderr


def test_a_failing_use_leaves_the_import_working(tmp_path):
    r = _run(tmp_path, "import gpumem.torch\n"
                       "def broken(): raise RuntimeError('no CUDA here')\n"
                       "gpumem.torch.use = broken\n"
                       "import torch; print(torch.ran)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    assert "gpumem run: torch stays on its own allocator: gpumem.torch.use() failed: no CUDA here" in r.stderr


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITE = True\n")
    r = _run(tmp_path, "print(OTHER_SITE)", extra_site=other)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


@pytest.mark.parametrize("framework", ["torch"])
def test_real_package_found_from_a_checkout(tmp_path, framework):
    # Without a stand-in gpumem on the path, the hook finds the checkout's
    # package (python/) itself: gpumem imports, and gpumem.torch.use()
    # fails at once on the stand-in torch (no torch.cuda), said in one line.
    fake = tmp_path / "fake2"
    (fake / framework).mkdir(parents=True)
    (fake / framework / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([AUTOLOAD, str(fake)]), GPUMEM_AUTOLOAD=framework)
    r = subprocess.run([sys.executable, "-c", f"import {framework}; import gpumem; print(gpumem.__file__)"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.path.abspath(r.stdout.strip()).startswith(os.path.abspath(os.path.join(PYTHON_DIR, "gpumem")))
    assert f"gpumem run: {framework} stays on its own allocator" in r.stderr


def _gpumem_command():
    for p in (os.path.join(PYTHON_DIR, "gpumem", "_bin", "gpumem"),
              os.path.join(PYTHON_DIR, os.pardir, "build", "gpu", "gpumem"),
              os.path.join(PYTHON_DIR, os.pardir, "build", "gpumem")):
        if os.access(p, os.X_OK):
            return os.path.abspath(p)
    return None


def _run_under_gpumem(program, limit="2GiB"):
    """Runs program (dedented) under `gpumem run --limit limit` with PyTorch
    and the package importable, as a user would; skips without torch or a
    built gpumem command. Returns the CompletedProcess."""
    pytest.importorskip("torch")
    cmd = _gpumem_command()
    if cmd is None:
        pytest.skip("no gpumem command built (scripts/gpu.sh build, or the wheel's gpumem/_bin)")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("GPUMEM_AUTOLOAD", None)
    return subprocess.run([cmd, "run", "--limit", limit, "--", sys.executable, "-c", textwrap.dedent(program)],
                          env=env, capture_output=True, text=True, timeout=300)


@needs_gpu
def test_gpumem_run_makes_gpumem_pytorchs_allocator():
    """The real thing: `gpumem run -- python -c ...` with no gpumem call in
    the program; PyTorch's allocations land in gpumem's pool, under the
    command's limit."""
    r = _run_under_gpumem("""
        import torch
        x = torch.ones(64 << 20, device="cuda")
        import gpumem
        s = gpumem.stats(0)
        print(torch.cuda.memory.get_allocator_backend(), s["live_buffers"] >= 1, s["active"] >= 256 << 20,
              torch.cuda.memory_allocated() == s["active"], float(x.sum()))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pluggable", "True", "True", "True", str(float(64 << 20))], (r.stdout, r.stderr)


@needs_gpu
def test_gpumem_run_out_of_memory_is_pytorchs_error():
    """Under `gpumem run` the shim is in the process beside the pluggable
    allocator, which it did not load: gpumem's own driver calls must still
    reach the driver (a cuMemGetInfo through the shim's wrapper asks gpumem
    again, without end). A request over the limit is PyTorch's
    OutOfMemoryError with gpumem's verdict, the program goes on, and a 1 GiB
    request (one that asks the device's free memory) is served."""
    r = _run_under_gpumem("""
        import torch
        keep = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(6)]
        try:
            torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            print("served")
        except torch.cuda.OutOfMemoryError as e:
            print("oom", "gpumem" in str(e))
        del keep
        x = torch.ones(1 << 28, device="cuda")
        print(float(x.sum()))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["oom", "True", str(float(1 << 28))], (r.stdout, r.stderr[-3000:])
