"""A PyTorch program run from the installed wheel alone (scripts/gpu.sh
wheel): a small MLP trained under gpumem.torch.use(), with a CUDA graph of
its forward pass replayed beside it. Prints where gpumem was loaded from,
the losses, and gpumem's numbers; exits non-zero on any mismatch."""
import sys

import gpumem
import gpumem.torch
import torch

gpumem.torch.use(limit="8GiB")
print("gpumem", gpumem.__file__, gpumem.library().path, gpumem.version())
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4096, 512, device="cuda")
y = (x[:, :10].argmax(1)).long()
losses = []
for step in range(200):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("loss first %.4f last %.4f" % (losses[0], losses[-1]))
if not losses[-1] < losses[0] * 0.5:
    sys.exit("loss did not fall")
# A graph of the forward pass, replayed with tensors made after it.
static = torch.randn(256, 512, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s), torch.no_grad():
    for _ in range(3):
        model(static)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(g):
    out = model(static)
after = [torch.full((1 << 18,), float(i), device="cuda") for i in range(8)]
for _ in range(3):
    static.copy_(torch.randn(256, 512, device="cuda"))
    g.replay()
    with torch.no_grad():
        want = model(static)
    if not torch.equal(out, want):
        sys.exit("graph output differs from eager")
for i, t in enumerate(after):
    if not bool((t == i).all()):
        sys.exit(f"tensor {i} made after the capture was overwritten by a replay")
st = gpumem.torch.stats()
print("stats reserved %d allocs %d" % (st["reserved"], st["allocs"]))
print("ok")
