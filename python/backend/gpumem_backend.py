"""The build backend of the gpumem Python package (PEP 517): plain Python
with nothing to install, so that pip runs it offline, with build isolation
on or off (pyproject.toml: requires = [], backend-path = ["backend"]).
scripts/wheel.sh runs it as a script:

    python3 python/backend/gpumem_backend.py [DIR]   # writes DIR/gpumem-*.whl (DIR: dist)

A wheel carries, beside the Python modules, the three native parts:

    gpumem/libgpumem.so           the C library (clib/, cgo) the package loads
    gpumem/libgpumem_preload.so   the preload shim of gpumem run (shim/c/preload.c)
    gpumem/_bin/gpumem            the gpumem command (cmd/gpumem, static: CGO_ENABLED=0)

The command finds the two libraries in .. of its own directory (cli/run.go,
findLibrary), so an installed wheel's `gpumem run` needs no setting.

Building a wheel:

 1. Natives. In a checkout (python/ beside go.mod and scripts/lib.sh), with
    go and cc on PATH: scripts/lib.sh builds libgpumem.so (and copies it
    into python/gpumem/) and the shim into build/; go build builds the
    command; the shim and the command are staged in python/gpumem/ too.
    Without go or cc, the parts staged there by an earlier build are used
    if all three are; else the build stops with one line: what is missing,
    and that scripts/wheel.sh on a machine with Go builds a wheel to install.
 2. Tag. py3-none-manylinux_X_Y_ARCH (PEP 600): ARCH from the natives' ELF
    headers, X.Y the highest GLIBC_X.Y symbol version they need (their
    .gnu.version_r sections, read here: no binutils needed).
 3. Write. The package's files, then the .dist-info: METADATA, WHEEL,
    entry_points.txt and RECORD (the sha256 and size of every file), as a
    zip, written under a temporary name and renamed.

An editable install (pip install -e ./python, PEP 660) builds the natives
in place and installs a .pth that names python/. There is no sdist: the
native parts build from the repository, which an sdist of python/ would not
hold.
"""

import base64
import hashlib
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)  # python/
PACKAGE = os.path.join(SOURCE, "gpumem")
ROOT = os.path.dirname(SOURCE)  # the checkout, when there is one

# The native parts, relative to the package directory.
NATIVES = ("libgpumem.so", "libgpumem_preload.so", "_bin/gpumem")
# Files of the package besides its modules.
DATA = ("gpumem.h",)

# ELF machines a wheel may be built for (e_machine: the platform tag's arch).
MACHINES = {62: "x86_64", 183: "aarch64"}


class BuildError(Exception):
    """A build that cannot go on; the message is one line."""


def _fail(e):
    """Ends the build with e's one line on stderr (pip shows it; no traceback)."""
    sys.stderr.write(f"gpumem: {e}\n")
    sys.stderr.flush()
    raise SystemExit(1)


# --- the project's metadata (pyproject.toml [project]) ---

def _parse_toml(text):
    """The subset of TOML pyproject.toml uses ([tables], key = "string" or
    ["strings"], comments), for Pythons before tomllib (3.11)."""
    doc, table = {}, None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            table = doc
            for key in line.strip("[]").split("."):
                table = table.setdefault(key.strip().strip('"'), {})
            continue
        key, sep, value = line.partition("=")
        value = value.strip()
        m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"\s*(#.*)?', value)
        if m:
            table[key.strip().strip('"')] = re.sub(r"\\(.)", r"\1", m.group(1))
        elif value.startswith("[") and value.rstrip().endswith("]"):
            table[key.strip().strip('"')] = re.findall(r'"((?:[^"\\]|\\.)*)"', value)
        else:
            raise BuildError(f"pyproject.toml:{n}: {line!r}: this backend reads strings and lists of strings only")
    return doc


def project():
    """pyproject.toml's [project] table."""
    with open(os.path.join(SOURCE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
        doc = tomllib.loads(raw.decode())
    except ImportError:
        doc = _parse_toml(raw.decode())
    p = doc["project"]
    for key in ("name", "version", "description"):
        if not isinstance(p.get(key), str):
            raise BuildError(f"pyproject.toml: [project] needs a {key}")
    return p


def _dist_name(p):
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


# --- 1. the native parts ---

def _run(args, env=None):
    """Runs a build command in the checkout; its output goes to stderr."""
    sys.stderr.write("+ " + " ".join(args) + "\n")
    sys.stderr.flush()
    e = dict(os.environ)
    e.update(env or {})
    try:
        out = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        out = None
    rc = subprocess.run(args, cwd=ROOT, env=e, stdout=out).returncode
    if rc != 0:
        raise BuildError(f"{' '.join(args)} failed (exit {rc}); its output is above")


def _replace(src, dst):
    """Copies src to dst through a temporary name, so that a process that
    runs or maps dst keeps its copy."""
    tmp = os.path.join(os.path.dirname(dst), "." + os.path.basename(dst) + ".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _cli_version(version):
    """v<version>, with +<commit> (and -dirty) where git knows the checkout."""
    def git(*args):
        try:
            p = subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True)
        except OSError:
            return ""
        return p.stdout.strip() if p.returncode == 0 else ""
    rev = git("rev-parse", "--short=12", "HEAD")
    if not rev:
        return "v" + version
    dirty = "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"v{version}+{rev}{dirty}"


def build_natives(version):
    """Builds the native parts into the package directory (scripts/lib.sh
    and go build); needs go and cc on PATH and the checkout."""
    _run(["bash", os.path.join("scripts", "lib.sh")])
    _replace(os.path.join(ROOT, "build", "libgpumem_preload.so"), os.path.join(PACKAGE, "libgpumem_preload.so"))
    os.makedirs(os.path.join(PACKAGE, "_bin"), exist_ok=True)
    tmp = os.path.join(PACKAGE, "_bin", ".gpumem.tmp")
    # gpumem version prints the package's version and the commit; Go's
    # own VCS stamping is off (it fails without git or on a checkout
    # another user owns).
    ld = f"-s -w -X github.com/gpumem/gpumem/cli.Version={_cli_version(version)}"
    _run(["go", "build", "-trimpath", "-buildvcs=false", "-ldflags=" + ld, "-o", tmp, "./cmd/gpumem"],
         env={"CGO_ENABLED": "0"})
    os.replace(tmp, os.path.join(PACKAGE, "_bin", "gpumem"))


def natives(version):
    """Makes the native parts present in the package directory: built when
    Go and a C compiler are here, else those an earlier build staged."""
    checkout = all(os.path.exists(os.path.join(ROOT, p)) for p in ("go.mod", "scripts/lib.sh", "cmd/gpumem"))
    tools = [t for t in ("go", "cc") if shutil.which(t) is None]
    if checkout and not tools:
        build_natives(version)
        return
    why = []
    if tools:
        why.append(" and ".join({"go": "no Go toolchain (go)", "cc": "no C compiler (cc)"}[t] for t in tools) + " on PATH")
    if not checkout:
        why.append(f"no gpumem checkout around {SOURCE} (go.mod, scripts/lib.sh)")
    missing = [n for n in NATIVES if not os.path.isfile(os.path.join(PACKAGE, n))]
    if not missing:
        sys.stderr.write(f"gpumem: {', '.join(why)}: using the native parts an earlier build left in {PACKAGE}\n")
        return
    raise BuildError(
        f"cannot build the native parts: {', '.join(why)}, and {PACKAGE} lacks {', '.join(missing)}; "
        f"on a machine with Go 1.26+ and a C compiler, scripts/wheel.sh builds a wheel "
        f"(dist/gpumem-{version}-py3-none-manylinux_*.whl) to pip install here instead")


# --- 2. the platform tag ---

def elf_needs(path):
    """The machine (a key of MACHINES or another e_machine) of an ELF file
    and the highest glibc version its symbols need, as (major, minor), or
    None for a file that needs none (a static binary)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BuildError(f"{path}: not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 18)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    need = None
    for _, kind, _, _, offset, _, link, count, _, _ in sections:
        if kind != 0x6FFFFFFE:  # SHT_GNU_verneed: Elf64_Verneed entries, then their Elf64_Vernaux
            continue
        strtab = sections[link][4]
        vn = offset
        for _ in range(count):
            _, cnt, _, aux, nxt = struct.unpack_from("<HHIII", data, vn)
            va = vn + aux
            for _ in range(cnt):
                _, _, _, name, vnext = struct.unpack_from("<IHHII", data, va)
                end = data.index(b"\0", strtab + name)
                m = re.fullmatch(rb"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", data[strtab + name:end])
                if m:
                    need = max(need or (0, 0), (int(m.group(1)), int(m.group(2))))
                va += vnext
            vn += nxt
    return machine, need


def platform_tag(files):
    """The platform tag of the ELF files (manylinux_X_Y_ARCH: X.Y the glibc
    they need at least), the glibc version and the arch."""
    glibc, arch = None, None
    for path in files:
        machine, need = elf_needs(path)
        if machine not in MACHINES:
            raise BuildError(f"{path}: ELF machine {machine}: wheels are for x86-64 or aarch64 Linux only")
        if arch not in (None, MACHINES[machine]):
            raise BuildError(f"{path}: built for {MACHINES[machine]}, the other natives for {arch}")
        arch = MACHINES[machine]
        if need:
            glibc = max(glibc or need, need)
    if glibc is None:
        return f"linux_{arch}", None, arch
    return f"manylinux_{glibc[0]}_{glibc[1]}_{arch}", glibc, arch


def _check_host():
    machine = platform.machine()
    if not sys.platform.startswith("linux") or machine not in MACHINES.values():
        raise BuildError(f"wheels are built on x86-64 or aarch64 Linux; this is {sys.platform} on {machine or 'an unknown machine'}")


# --- 3. the wheel ---

def _files():
    """The package's files: (path in the wheel, contents, mode)."""
    names = []
    for d, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "_bin"))
        rel = os.path.relpath(d, PACKAGE)
        names += [(os.path.normpath(os.path.join(rel, n)).replace(os.sep, "/"), 0o644)
                  for n in sorted(files) if n.endswith(".py")]
    names += [(n, 0o644) for n in DATA if os.path.isfile(os.path.join(PACKAGE, n))]
    names += [(n, 0o755) for n in NATIVES]
    out = []
    for name, mode in names:
        with open(os.path.join(PACKAGE, name), "rb") as f:
            out.append((f"gpumem/{name}", f.read(), mode))
    return out


def _metadata(p, tag, glibc, arch):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p['description']}"]
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += ["Classifier: Operating System :: POSIX :: Linux", f"Supported-Platform: {tag}",
              "Description-Content-Type: text/markdown", ""]
    readme = p.get("readme")
    body = ""
    if isinstance(readme, str):
        with open(os.path.join(SOURCE, readme), encoding="utf-8") as f:
            body = f.read().rstrip("\n") + "\n\n"
    need = f"glibc {glibc[0]}.{glibc[1]} or newer" if glibc else "no particular glibc"
    body += (f"This wheel ({tag}) is for Linux on {arch.replace('_', '-')} with {need}. It carries gpumem's C library "
             "(libgpumem.so), the preload shim of `gpumem run` (libgpumem_preload.so) and the `gpumem` "
             "command; installing it needs neither Go nor a C compiler.\n")
    return "\n".join(lines) + "\n" + body


def _entry_points(p):
    scripts = p.get("scripts") or {}
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(scripts.items())) + "\n"


def _date_time():
    t = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01: zip's first day
    return time.gmtime(max(t, 315532800))[:6]


def _hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(directory, p, tag, glibc, arch, files):
    """Writes the wheel of files (as _files returns) into directory; returns its file name."""
    dist = _dist_name(p)
    info = f"{dist}-{p['version']}.dist-info"
    name = f"{dist}-{p['version']}-py3-none-{tag}.whl"
    entries = list(files)
    meta = [(f"{info}/METADATA", _metadata(p, tag, glibc, arch)),
            (f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: gpumem_backend (python/backend)\n"
                              f"Root-Is-Purelib: false\nTag: py3-none-{tag}\n")]
    ep = _entry_points(p)
    if ep:
        meta.append((f"{info}/entry_points.txt", ep))
    meta.append((f"{info}/top_level.txt", "gpumem\n"))
    entries += [(arc, text.encode(), 0o644) for arc, text in meta]
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, "." + name + ".tmp")
    record = []
    when = _date_time()
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in entries:
            zi = zipfile.ZipInfo(arc, date_time=when)
            zi.external_attr = (0o100000 | mode) << 16  # a regular file and its permissions
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            record.append(f"{arc},{_hash(data)},{len(data)}\n")
        record.append(f"{info}/RECORD,,\n")
        zi = zipfile.ZipInfo(f"{info}/RECORD", date_time=when)
        zi.external_attr = 0o100644 << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(zi, "".join(record))
    os.replace(tmp, os.path.join(directory, name))
    return name


def _build(wheel_directory, editable=False):
    p = project()
    _check_host()
    natives(p["version"])
    tag, glibc, arch = platform_tag([os.path.join(PACKAGE, n) for n in NATIVES])
    if editable:
        # The package is imported from the source tree: the wheel holds a
        # .pth naming it, and the metadata (with the gpumem command).
        files = [(f"__editable__.{_dist_name(p)}.pth", (SOURCE + "\n").encode(), 0o644)]
    else:
        files = _files()
    return write_wheel(wheel_directory, p, tag, glibc, arch, files)


# --- PEP 517 and PEP 660 hooks ---

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        return _build(wheel_directory)
    except BuildError as e:
        _fail(e)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        return _build(wheel_directory, editable=True)
    except BuildError as e:
        _fail(e)


def build_sdist(sdist_directory, config_settings=None):
    _fail("no source distribution: the native parts build from the repository "
          "(pip install ./python in a checkout, or a wheel from scripts/wheel.sh)")


if __name__ == "__main__":
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "dist"))
    print(os.path.join(out, build_wheel(out)))
