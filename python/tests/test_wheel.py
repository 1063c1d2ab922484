"""The wheel and the package's build backend (python/backend/gpumem_backend.py).

A wheel that scripts/wheel.sh builds here installs with pip, offline, into
a fresh virtual environment, and from there, with no Go on PATH, the
`gpumem` command, `python -m gpumem` and `import gpumem` work and `gpumem
run` finds its shim inside the package. `pip install ./python` builds the
native parts itself with pip's build isolation on and no index; without Go
the backend stops with one line. About 15 s on 2 cores once Go's build
cache is warm."""

import base64
import csv
import hashlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import PACKAGE, ROOT

NATIVES = ("gpumem/libgpumem.so", "gpumem/libgpumem_preload.so", "gpumem/_bin/gpumem")
REFUSAL = "gpumem: cannot build the native parts: no Go toolchain (go) on PATH"

_missing = [t for t in ("go", "cc") if shutil.which(t) is None]
needs_tools = pytest.mark.skipif(bool(_missing), reason=f"{' and '.join(_missing)} not on PATH: the wheel is built with Go and a C compiler")
needs_venv = pytest.mark.skipif(importlib.util.find_spec("ensurepip") is None,
                                reason="python3 -m venv cannot install pip here (apt-get install python3-venv)")


def sh(args, check=True, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args}: exit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return p


def no_go_env(bin_dir):
    """The environment of a machine without Go: bin_dir first on PATH, no
    directory that holds go, nothing pointing at the checkout's package."""
    path = [bin_dir] + [d for d in os.environ.get("PATH", "").split(os.pathsep)
                        if d and not os.path.exists(os.path.join(d, "go"))]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GPUMEM_LIBRARY", "GPUMEM_PRELOAD", "GPUMEM_CONFIG", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(path)
    assert shutil.which("go", path=env["PATH"]) is None
    return env


def make_venv(where):
    """A fresh venv that sees the system's packages (pytest); returns its bin/."""
    sh([sys.executable, "-m", "venv", "--system-site-packages", str(where)])
    return os.path.join(str(where), "bin")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    sh(["bash", os.path.join(ROOT, "scripts", "wheel.sh"), str(out)], env=dict(os.environ, PYTHON=sys.executable))
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """(bin/, its environment, the installed package's directory)."""
    root = tmp_path_factory.mktemp("venv")
    bin_dir = make_venv(root / "v")
    env = no_go_env(bin_dir)
    sh([os.path.join(bin_dir, "python"), "-m", "pip", "install", "--no-index", "--no-deps", str(wheel)],
       env=env, cwd=str(root))
    p = sh([os.path.join(bin_dir, "python"), "-c", "import gpumem, os; print(os.path.dirname(gpumem.__file__))"],
           env=env, cwd=str(root))
    return bin_dir, env, p.stdout.strip(), str(root)


@needs_tools
def test_wheel_name_tag_and_record(wheel):
    m = re.fullmatch(r"gpumem-(.+)-py3-none-manylinux_(\d+)_(\d+)_(x86_64|aarch64)\.whl", wheel.name)
    assert m, wheel.name
    version, major, minor, arch = m.groups()
    info = f"gpumem-{version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for n in NATIVES:
            assert n in names, n
        assert (z.getinfo("gpumem/_bin/gpumem").external_attr >> 16) & 0o111, "the gpumem binary is not executable"
        tag = wheel.name[len(f"gpumem-{version}-"):-len(".whl")]
        assert f"Tag: {tag}\n" in z.read(f"{info}/WHEEL").decode()
        assert "Root-Is-Purelib: false" in z.read(f"{info}/WHEEL").decode()
        assert "gpumem = gpumem.__main__:main" in z.read(f"{info}/entry_points.txt").decode()
        assert f"glibc {major}.{minor} or newer" in z.read(f"{info}/METADATA").decode()
        rows = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode())))
        listed = {row[0] for row in rows}
        assert listed == names, listed ^ names
        for path, digest, size in rows:
            if path == f"{info}/RECORD":
                assert digest == size == ""
                continue
            data = z.read(path)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want, path
            assert int(size) == len(data), path


@needs_tools
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump to check the glibc tag against")
def test_glibc_tag_is_what_objdump_says(wheel, tmp_path):
    """The backend reads the natives' version needs itself; objdump agrees."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path, [n for n in NATIVES if n.endswith(".so")])
    need = set()
    for n in NATIVES[:2]:
        out = sh(["objdump", "-T", str(tmp_path / n)]).stdout
        need |= {tuple(map(int, v)) for v in re.findall(r"GLIBC_(\d+)\.(\d+)", out)}
    major, minor = max(need)
    assert f"manylinux_{major}_{minor}_" in wheel.name


@needs_tools
@needs_venv
def test_installed_package_holds_the_natives(venv):
    _, _, package, _ = venv
    for n in NATIVES:
        assert os.path.isfile(os.path.join(os.path.dirname(package), n)), n
    assert os.access(os.path.join(package, "_bin", "gpumem"), os.X_OK)


@needs_tools
@needs_venv
def test_gpumem_command(venv):
    bin_dir, env, _, cwd = venv
    for args in ([os.path.join(bin_dir, "gpumem"), "--help"], [os.path.join(bin_dir, "python"), "-m", "gpumem", "--help"]):
        p = sh(args, env=env, cwd=cwd)
        assert "Usage:" in p.stdout and "gpumem <command>" in p.stdout, p.stdout
    # The console command is on the venv's PATH.
    assert sh(["gpumem", "version"], env=env, cwd=cwd).stdout.startswith("gpumem v")


@needs_tools
@needs_venv
def test_import_from_the_venv(venv):
    bin_dir, env, package, cwd = venv
    p = sh([os.path.join(bin_dir, "python"), "-c",
            "import gpumem, gpumem.torch, gpumem.cupy; print(gpumem.version()); print(gpumem.library().path)"],
           env=dict(env, GPUMEM_CONFIG="device=sim"), cwd=cwd)
    version, path = p.stdout.split("\n")[:2]
    assert version.startswith("gpumem")
    assert path == os.path.join(package, "libgpumem.so")


@needs_tools
@needs_venv
def test_run_finds_the_shim_in_the_package(venv):
    bin_dir, env, package, cwd = venv
    p = sh([os.path.join(bin_dir, "gpumem"), "run", "--", "/bin/sh", "-c", 'echo "$LD_PRELOAD"; echo "$GPUMEM_LIBRARY"'],
           env=env, cwd=cwd)
    assert p.stdout.split("\n")[:2] == [os.path.join(package, "libgpumem_preload.so"),
                                        os.path.join(package, "libgpumem.so")]


def _bare_checkout(where):
    """A checkout's outline with the package and no native parts."""
    for d in ("scripts", "cmd/gpumem", "python/gpumem"):
        os.makedirs(os.path.join(where, d))
    shutil.copy(os.path.join(ROOT, "go.mod"), where)
    shutil.copy(os.path.join(ROOT, "scripts", "lib.sh"), os.path.join(where, "scripts"))
    shutil.copytree(os.path.join(PACKAGE, "backend"), os.path.join(where, "python", "backend"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(PACKAGE, f), os.path.join(where, "python"))
    for f in os.listdir(os.path.join(PACKAGE, "gpumem")):
        if f.endswith(".py"):
            shutil.copy(os.path.join(PACKAGE, "gpumem", f), os.path.join(where, "python", "gpumem"))
    return os.path.join(where, "python")


def test_backend_without_go_is_one_line(tmp_path):
    source = _bare_checkout(str(tmp_path / "co"))
    bin_dir = tmp_path / "bin"  # cc only, where there is one
    bin_dir.mkdir()
    if shutil.which("cc"):
        os.symlink(shutil.which("cc"), bin_dir / "cc")
    env = dict(os.environ, PATH=str(bin_dir))
    p = sh([sys.executable, os.path.join(source, "backend", "gpumem_backend.py"), str(tmp_path / "out")],
           check=False, env=env, cwd=str(tmp_path))
    assert p.returncode != 0
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(REFUSAL), p.stderr
    assert "scripts/wheel.sh" in lines[0] and "libgpumem.so" in lines[0]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@needs_tools
@needs_venv
def test_pip_install_checkout_without_go_is_one_line(venv, tmp_path):
    """pip, build isolation on, no index: the backend needs nothing, and
    its one line is what pip shows."""
    bin_dir, env, _, _ = venv
    source = _bare_checkout(str(tmp_path / "co"))
    p = sh([os.path.join(bin_dir, "python"), "-m", "pip", "install", "--no-index", source],
           check=False, env=env, cwd=str(tmp_path))
    assert p.returncode != 0
    out = (p.stdout + p.stderr).splitlines()
    assert len([l for l in out if "gpumem:" in l]) == 1, p.stdout + p.stderr
    assert any(l.strip().startswith(REFUSAL) for l in out), p.stdout + p.stderr


@needs_tools
@needs_venv
def test_pip_install_checkout_builds_the_natives(tmp_path):
    """pip install ./python with Go here: build isolation on, no index."""
    bin_dir = make_venv(tmp_path / "v")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUMEM_LIBRARY", "VIRTUAL_ENV")}
    sh([os.path.join(bin_dir, "python"), "-m", "pip", "install", "--no-index", PACKAGE], env=env, cwd=str(tmp_path))
    p = sh([os.path.join(bin_dir, "gpumem"), "version"], env=no_go_env(bin_dir), cwd=str(tmp_path))
    assert p.stdout.startswith("gpumem v")
