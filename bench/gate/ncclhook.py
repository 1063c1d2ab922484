"""ncclhook.py: PyTorch's NCCL registration hook under gpumem
(TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1): one process, one GPU,
an all-reduce checked, the group destroyed. Prints "ok" or dies; run with
TORCH_SHOW_CPP_STACKTRACES=1 to see where."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "python"))
import gpumem.torch  # noqa: E402

gpumem.torch.use()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29631")
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print("all_reduce", bool((x == 1).all()), flush=True)
dist.destroy_process_group()
print("ok", flush=True)
