"""gpumem run's hook for PyTorch and CuPy programs.

`gpumem run -- python train.py` puts this directory first on PYTHONPATH, so
that Python runs this module at start (the site module imports
sitecustomize). It changes nothing until the program imports torch or
cupy: right after that import completes, and before any CUDA allocation
can happen, it makes gpumem the framework's allocator (gpumem.torch.use(),
gpumem.cupy.use()) with gpumem run's configuration (GPUMEM_CONFIG,
GPUMEM_LIBRARY). The program's own later use() call still works (it
reconfigures). GPUMEM_AUTOLOAD names the frameworks (gpumem run sets
"torch,cupy"; empty: none). A failure is said once on stderr and leaves
the framework's own allocator: the program's import never fails because
of this hook.

Then it runs the sitecustomize this one shadows, if there is one further
along sys.path, as Python would have."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _use(framework):
    try:
        if framework == "torch":
            import gpumem.torch
            gpumem.torch.use()
        else:
            import gpumem.cupy
            gpumem.cupy.use()
    except Exception as e:  # noqa: BLE001 - the program runs on, on its own allocator
        sys.stderr.write(f"gpumem run: {framework} stays on its own allocator: gpumem.{framework}.use() failed: {e}\n")


class _AfterImport:
    """A meta path finder that finds nothing itself: for the modules it
    watches it asks the finders after it, and has the loader found call
    _use once the module has run."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        self.names.discard(name)  # once, and not for the lookups below
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            run(module)
            _use(name)

        # This loader object only (the type, and so resource readers,
        # stay as they are).
        try:
            loader.exec_module = exec_module
        except AttributeError:
            return spec
        return spec


def _install():
    names = [n for n in os.environ.get("GPUMEM_AUTOLOAD", "").split(",") if n in ("torch", "cupy")]
    if not names:
        return
    # The gpumem package: importable from site-packages (a wheel), else
    # from the checkout this directory is in (python/gpumem/_autoload).
    if importlib.util.find_spec("gpumem") is None:
        sys.path.append(os.path.dirname(os.path.dirname(_HERE)))
    for n in [n for n in names if n in sys.modules]:
        _use(n)  # imported before site ran: too late to hook the import, not to use()
        names.remove(n)
    sys.meta_path.insert(0, _AfterImport(names))


def _chain():
    """Runs the sitecustomize module this one shadows, if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
