"""record_check.py PROGRAM OUTDIR: the same program recorded two ways, for
the check that both replay to the same peak live bytes:

  OUTDIR/PROGRAM.gpumem.trace.gz   gpumem.torch.record under gpumem
  OUTDIR/PROGRAM.gpumem.stats.json gpumem's numbers at the end of that run
                                   (peak_reserved: the real pool peak, for
                                   replay_check.py: issue 30's replay-versus-run
                                   agreement; allocator: gpumem.Stats, with
                                   Segments and Handoffs)
  OUTDIR/PROGRAM.snapshot.pickle   PyTorch's memory history under its own
                                   allocator (torch.cuda.memory._dump_snapshot),
                                   for `gpumem import`

Each in a process of its own (an allocator is chosen per process). The
step callback does nothing, so the host may run steps ahead of the GPU: a
run to compare with its replay is `run.py PROGRAM gpumem --record TRACE`
(scripts/gpu.sh's record part), which synchronizes at each step as the
training suite does."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def child(prog, mode, outdir):
    import torch
    sys.path.insert(0, HERE)
    import programs
    fn, steps = programs.PROGRAMS[prog]
    if mode == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
        with gpumem.torch.record(os.path.join(outdir, prog + ".gpumem.trace.gz")):
            fn(steps, lambda loss: None)
            torch.cuda.synchronize()
        import json
        # gpumem.torch.stats() and, under "allocator", the allocator's own
        # (arenas, handoffs, fences: what tells a run whose streams waited
        # on each other from its replay, where no GPU lags).
        st = dict(gpumem.torch.stats())
        st["allocator"] = json.loads(gpumem.library().stats_json(torch.cuda.current_device()))
        with open(os.path.join(outdir, prog + ".gpumem.stats.json"), "w") as f:
            json.dump(st, f)
    else:
        torch.cuda.memory._record_memory_history(max_entries=10_000_000)
        fn(steps, lambda loss: None)
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(os.path.join(outdir, prog + ".snapshot.pickle"))


if __name__ == "__main__":
    if len(sys.argv) == 4:
        child(*sys.argv[1:])
    else:
        prog, outdir = sys.argv[1:3]
        os.makedirs(outdir, exist_ok=True)
        for mode in ("gpumem", "native"):
            subprocess.run([sys.executable, __file__, prog, mode, outdir], check=True)
