"""Checks, before bench/torchtests/run.sh runs PyTorch's tests under an
allocator, that this interpreter really gets that allocator, and prints one
line saying what it has.

    python3 bench/torchtests/preflight.py native [TEST_FILE]   # GPUMEM_TORCH_ALLOCATOR unset
    GPUMEM_TORCH_ALLOCATOR=gpumem python3 bench/torchtests/preflight.py gpumem [TEST_FILE]

Exits 0 when the allocator is the one named, 1 when it is not (a run
labelled "native" must have PyTorch's own caching allocator with no
PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF in force, one labelled
"gpumem" must have gpumem installed by sitecustomize.py). With TEST_FILE it
also imports that file as pytest would, and exits 1 when that fails: PyTorch's
test file takes its helpers from the installed torch's
torch.testing._internal, so a file newer than the installed PyTorch can ask
for names it does not have, and every test of the run would be an error.
"""

import os
import sys


def main():
    want = sys.argv[1] if len(sys.argv) > 1 else "native"
    import torch

    torch.cuda.init()
    backend = torch.cuda.get_allocator_backend()
    conf = {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if os.environ.get(k)}
    gpumem_in = False
    gm = sys.modules.get("gpumem.torch")
    if gm is not None:
        gpumem_in = bool(gm.installed())
    stand_ins = []
    for mod in ("expecttest", "psutil"):
        try:
            m = __import__(mod)
            if getattr(m, "STAND_IN", False):
                stand_ins.append(mod)
        except ImportError:
            stand_ins.append(mod + "(missing)")
    print(f"{want}: torch {torch.__version__} cuda {torch.version.cuda} "
          f"device {torch.cuda.get_device_name(0)!r} allocator_backend={backend} "
          f"gpumem_installed={gpumem_in} alloc_conf={conf or '-'} "
          f"stand_ins={','.join(stand_ins) or '-'}")
    if want == "native":
        ok = backend == "native" and not gpumem_in and not conf
    elif want == "gpumem":
        ok = gpumem_in
    else:
        print(f"preflight: unknown allocator {want!r}", file=sys.stderr)
        return 2
    if not ok:
        print(f"preflight: this interpreter does not have the {want} allocator as asked", file=sys.stderr)
        return 1
    if len(sys.argv) > 2:
        import compat
        compat.apply()
        return import_test_file(sys.argv[2])
    return 0


def import_test_file(path):
    import importlib.util

    path = os.path.abspath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    except BaseException as e:  # noqa: BLE001 - report whatever stops the import
        print(f"preflight: {path} does not import here: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
