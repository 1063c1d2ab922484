"""What the rooms of gpumem.torch share (torch.py says where each room is):
the installation's state, the originals of what gpumem put in PyTorch's
places, and the helpers that put them there. Defined here once; the other
rooms and torch.py import these objects, never copies."""

import sys
import threading
import types

_state = {"installed": False}
_patched = {}  # (module or class, name) -> what gpumem put its own in the place of
_lock = threading.Lock()


def _put(modules, name, fn):
    """Puts fn in the place of name in each of modules that has it (None
    skipped), keeping the original in _patched."""
    for module in modules:
        if module is not None and hasattr(module, name):
            _patched[(module.__name__, name)] = getattr(module, name)
            setattr(module, name, fn)


def _device(device):
    import torch
    return torch.cuda._utils._get_device_index(device, optional=True)


def _replace_all(torch, news):
    """Puts news[name] in the place of torch._C.<name> there and in every
    loaded module that holds it (from torch._C import <name>, under any
    name): torch.cuda.memory, for one."""
    olds = {}
    for name, new in news.items():
        orig = getattr(torch._C, name, None)
        if orig is not None:
            new.__name__ = new.__qualname__ = name
            olds[id(orig)] = (orig, new)
    modules = [torch._C, getattr(torch.cuda, "memory", None), getattr(torch.cuda, "graphs", None)]
    modules += [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    seen = set()
    for module in modules:
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        try:
            found = [(k, olds[id(v)]) for k, v in list(vars(module).items()) if id(v) in olds]
        except TypeError:
            continue
        for k, (orig, new) in found:
            if getattr(module, k, None) is orig:
                _patched[(getattr(module, "__name__", "?"), k)] = orig
                setattr(module, k, new)
