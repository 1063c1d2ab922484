#!/usr/bin/env python3
"""Counts, without importing it, the test methods of PyTorch's test_cuda.py
that each selection of run.sh takes (by name, as torchtests_plugin.py does),
class by class.

    python3 bench/torchtests/count.py [TEST_FILE] [--match-class]

These are method definitions: PyTorch's @parametrize, @optims and
instantiate_device_type_tests turn some of them into several collected tests
(the exact list of a run is the "selected" line of OUT/A-S.jsonl).
"""

import ast
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from torchtests_plugin import name_selected, words  # noqa: E402

SELECTIONS = {
    "graphs": (words("graph"), []),
    "memory": (words("memory,oom,alloc,stream,cache,fraction,record,snapshot,pool"), ["graph"]),
}


def methods(path):
    tree = ast.parse(open(path).read(), path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test"):
                    expands = any(
                        isinstance(d, ast.Call) and getattr(d.func, "id", "") in ("parametrize", "optims")
                        for d in f.decorator_list)
                    yield node.name, f.name, expands


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    match_class = "--match-class" in sys.argv
    path = args[0] if args else os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "third_party", "test_cuda.py")
    all_methods = list(methods(path))
    print(f"{path}: {len(all_methods)} test methods")
    for sel, (inc, exc) in SELECTIONS.items():
        chosen = [(c, n, e) for c, n, e in all_methods if name_selected(c, n, inc, exc, match_class)]
        print(f"\n{sel}: {len(chosen)} test methods (* = parametrized: several tests each)")
        by_class = {}
        for c, n, e in chosen:
            by_class.setdefault(c, []).append(n + ("*" if e else ""))
        for c, names in by_class.items():
            print(f"  {c} ({len(names)}): {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
