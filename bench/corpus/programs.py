"""The corpus: real PyTorch programs recorded on the GPU for issue 11.

Each program is a function NAME(seed=0) that builds its models with random
weights (from a transformers config, torchvision, or written here; nothing
is downloaded), does real work on the GPU and returns when that work is
done. Shapes, batch sizes and orders are random but drawn from generators
seeded by the program's name and the seed, so a program asks for the same
sequence of sizes every time it is recorded (up to the library's own
choices, e.g. cuBLAS workspaces). Each is sized to run 10-35 s on an H100
with 1-30 GB live at its peak.

PROGRAMS maps a name to (function, split, what it exercises). The split is
fixed before any recording (MANIFEST.md says the rule): policy work may look
only at the `tune` traces; `holdout` traces are replayed for the final report
only. record.py records one program; record_all.sh records them all.
"""

import gc
import math
import os
import random
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

DEVICE = "cuda"
BF16 = torch.bfloat16


def _rng(name, seed):
    return random.Random("%s:%d" % (name, seed))


def _gen(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _step(loss, opt):
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _tokens_batch(rng, lo, hi, max_tokens, batches):
    """A sequence length in lo..hi and a batch size from batches that keeps
    batch * length within max_tokens (at least 1)."""
    n = rng.randint(lo, hi)
    fit = [b for b in batches if b * n <= max_tokens] or [1]
    return rng.choice(fit), n


# ---------------------------------------------------------------------------
# Building blocks written by hand.


class Attention(nn.Module):
    """Pre-norm causal self-attention (scaled_dot_product_attention)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, dim, heads, mlp=4):
        super().__init__()
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, mlp * dim)
        self.down = nn.Linear(mlp * dim, dim)

    def mlp(self, x):
        return self.down(F.gelu(self.up(self.ln2(x))))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class LM(nn.Module):
    """A decoder-only language model of Blocks with a tied output layer."""

    def __init__(self, vocab, dim, heads, layers, block=Block):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(4096, dim)
        self.blocks = nn.ModuleList([block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)

    def hidden(self, tokens, run=None):
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(n, device=tokens.device))
        for blk in self.blocks:
            x = run(blk, x) if run else blk(x)
        return self.ln(x)

    def loss(self, tokens, run=None):
        h = self.hidden(tokens[:, :-1], run)
        logits = h @ self.embed.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


class MoE(nn.Module):
    """Mixture of experts with top-2 routing: a router scores every token,
    each token goes to its two best experts (gathered into per-expert
    batches, sorted by expert), and the experts' outputs are weighted and
    scattered back with index_add_. Returns the output and the
    load-balancing loss (Switch Transformer's)."""

    def __init__(self, dim, hidden, experts):
        super().__init__()
        self.experts = experts
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * hidden ** -0.5)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        t = x.shape[0]
        probs = self.router(x).float().softmax(-1)
        top_w, top_i = probs.topk(2, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        flat = top_i.flatten()
        order = flat.argsort()
        tok = torch.arange(t, device=x.device).repeat_interleave(2)[order]
        counts = torch.bincount(flat, minlength=self.experts).tolist()
        xs = x[tok]
        outs = [F.gelu(chunk @ self.w1[e]) @ self.w2[e] for e, chunk in enumerate(xs.split(counts))]
        ys = torch.cat(outs).float() * top_w.flatten()[order].unsqueeze(1)
        out = torch.zeros(x.shape, dtype=ys.dtype, device=x.device).index_add_(0, tok, ys)
        frac = torch.bincount(flat, minlength=self.experts).float() / flat.numel()
        aux = self.experts * (frac * probs.mean(0)).sum()
        return out.reshape(shape), aux


class MoEBlock(nn.Module):
    def __init__(self, dim, heads, hidden, experts):
        super().__init__()
        self.attn = Attention(dim, heads)
        self.ln = nn.LayerNorm(dim)
        self.moe = MoE(dim, hidden, experts)

    def forward(self, x):
        x = x + self.attn(x)
        y, aux = self.moe(self.ln(x))
        return x + y, aux


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1 = nn.GroupNorm(32, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2 = nn.GroupNorm(32, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(temb))[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return h + self.skip(x)


class AttnBlock(nn.Module):
    def __init__(self, ch, heads=8):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(32, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.out = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).unbind(1)
        y = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
        return x + self.out(y.transpose(-1, -2).reshape(b, c, h, w))


class UNet(nn.Module):
    """A diffusion U-Net (DDPM-style): a sinusoidal timestep embedding fed
    to every residual block, two residual blocks per level, self-attention
    at the two lowest levels, skip connections concatenated on the way up."""

    def __init__(self, chans=(128, 256, 384, 512), tdim=512):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(chans[0], tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(3, chans[0], 3, padding=1)
        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        skips = [chans[0]]
        c = chans[0]
        for i, co in enumerate(chans):
            blocks = nn.ModuleList()
            for _ in range(2):
                blocks.append(ResBlock(c, co, tdim))
                c = co
                skips.append(c)
            self.down.append(blocks)
            self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1) if i < len(chans) - 1 else nn.Identity())
            if i < len(chans) - 1:
                skips.append(c)
        self.mid1 = ResBlock(c, c, tdim)
        self.mid_attn = AttnBlock(c)
        self.mid2 = ResBlock(c, c, tdim)
        self.up = nn.ModuleList()
        self.upsample = nn.ModuleList()
        self.attn_levels = {len(chans) - 1, len(chans) - 2}
        self.attn = nn.ModuleDict()
        for i, co in reversed(list(enumerate(chans))):
            blocks = nn.ModuleList()
            for _ in range(3):
                blocks.append(ResBlock(c + skips.pop(), co, tdim))
                c = co
            self.up.append(blocks)
            if i in self.attn_levels:
                self.attn[str(i)] = AttnBlock(c)
            self.upsample.append(nn.Conv2d(c, c, 3, padding=1) if i > 0 else nn.Identity())
        self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x, t):
        temb = self.temb(timestep_embedding(t, self.inp.out_channels))
        h = self.inp(x)
        hs = [h]
        for i, blocks in enumerate(self.down):
            for blk in blocks:
                h = blk(h, temb)
                hs.append(h)
            if i < len(self.down) - 1:
                h = self.downsample[i](h)
                hs.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, temb)), temb)
        levels = len(self.down)
        for j, blocks in enumerate(self.up):
            i = levels - 1 - j
            for blk in blocks:
                h = blk(torch.cat([h, hs.pop()], dim=1), temb)
            if str(i) in self.attn:
                h = self.attn[str(i)](h)
            if i > 0:
                h = self.upsample[j](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h)


class LoRA(nn.Module):
    """A low-rank adapter around a frozen GPT-2 Conv1D (y = x W + b, W of
    shape (in, out)): y + (x A^T B^T) * alpha / r, B zero at the start."""

    def __init__(self, base, r=16, alpha=32):
        super().__init__()
        self.base = base
        n_in, n_out = base.weight.shape
        self.a = nn.Parameter(torch.randn(r, n_in, device=base.weight.device) / math.sqrt(n_in))
        self.b = nn.Parameter(torch.zeros(n_out, r, device=base.weight.device))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + F.dropout(x, 0.05, self.training) @ self.a.t() @ self.b.t() * self.scale


# ---------------------------------------------------------------------------
# The programs.


def llama_train_varlen(seed=0):
    """LLaMA-style decoder (GQA, RoPE, SwiGLU, RMSNorm; ~200M parameters)
    trained with AdamW under bf16 autocast on batches of random length."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("llama_train_varlen", seed), _gen(seed)
    for _ in range(40):
        b, n = _tokens_batch(rng, 128, 2048, 16384, [2, 4, 6, 8, 12, 16])
        x = torch.randint(0, cfg.vocab_size, (b, n), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_ids=x, labels=x).loss
        _step(loss, opt)
    torch.cuda.synchronize()


def infer_server(seed=0):
    """An inference server with two models, each on a stream of its own: a
    GPT-2 generating with a KV cache that grows token by token
    (use_cache=True) and a BERT classifier; requests of random batch and
    length arrive in a seeded random order, mixed."""
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    gpt = GPT2LMHeadModel(GPT2Config()).to(DEVICE, BF16).eval()
    bert = BertForSequenceClassification(BertConfig(num_labels=4)).to(DEVICE, BF16).eval()
    s_gen, s_cls = torch.cuda.Stream(), torch.cuda.Stream()
    rng, g = _rng("infer_server", seed), _gen(seed)
    requests = ["gen"] * 14 + ["cls"] * 36
    rng.shuffle(requests)
    answers = []
    with torch.no_grad():
        for kind in requests:
            if kind == "gen":
                b, n, new = rng.randint(1, 12), rng.randint(16, 384), rng.randint(16, 80)
                with torch.cuda.stream(s_gen):
                    x = torch.randint(0, 50257, (b, n), device=DEVICE, generator=g)
                    out = gpt.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                       min_new_tokens=new, do_sample=True, top_k=50, pad_token_id=0,
                                       use_cache=True)
                    answers.append(out[:, n:].sum().item())
            else:
                b, n = rng.randint(1, 64), rng.randint(16, 512)
                with torch.cuda.stream(s_cls):
                    x = torch.randint(1000, 30000, (b, n), device=DEVICE, generator=g)
                    logits = bert(input_ids=x, attention_mask=torch.ones_like(x)).logits
                    answers.append(logits.argmax(-1).sum().item())
    torch.cuda.synchronize()


def t5_beam_search(seed=0):
    """Beam-search decoding with a T5-base-sized encoder-decoder: random
    batches (1..16) of random source lengths, 2..8 beams, 24..64 new tokens."""
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(seed)
    cfg = T5Config(d_model=768, d_ff=3072, num_layers=8, num_decoder_layers=8, num_heads=12,
                   vocab_size=32128, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg).to(DEVICE).eval()
    rng, g = _rng("t5_beam_search", seed), _gen(seed)
    with torch.no_grad():
        for _ in range(12):
            b, n = rng.randint(1, 16), rng.randint(32, 512)
            beams, new = rng.choice([2, 4, 6, 8]), rng.randint(24, 64)
            x = torch.randint(2, 32000, (b, n), device=DEVICE, generator=g)
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), num_beams=beams,
                                 max_new_tokens=new, min_new_tokens=new, do_sample=False)
            out.sum().item()
    torch.cuda.synchronize()


def moe_top2_train(seed=0):
    """A mixture-of-experts language model (8 layers, 8 experts of 3072,
    top-2 routing written by hand, load-balancing loss) trained with AdamW
    under bf16 autocast on batches of random length: the per-expert batches
    change size every step."""
    torch.manual_seed(seed)
    dim, heads, vocab = 768, 12, 32000

    class MoELM(LM):
        def loss(self, tokens):
            n = tokens.shape[1] - 1
            x = self.embed(tokens[:, :-1]) + self.pos(torch.arange(n, device=tokens.device))
            aux = 0.0
            for blk in self.blocks:
                x, a = blk(x)
                aux = aux + a
            logits = self.ln(x) @ self.embed.weight.t()
            ce = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            return ce + 0.01 * aux

    with torch.device(DEVICE):  # 300M expert weights initialize slowly on a CPU
        model = MoELM(vocab, dim, heads, 8, block=lambda d, h: MoEBlock(d, h, 3072, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("moe_top2_train", seed), _gen(seed)
    for _ in range(40):
        b, n = _tokens_batch(rng, 128, 1024, 12288, [4, 8, 12, 16])
        x = torch.randint(0, vocab, (b, n + 1), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model.loss(x)
        _step(loss, opt)
    torch.cuda.synchronize()


def ckpt_grad_accum(seed=0):
    """Activation checkpointing (torch.utils.checkpoint, non-reentrant) of
    every block of a ~550M-parameter decoder, with gradients accumulated over
    4 micro-batches of random length per optimizer step, bf16 autocast."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = LM(32000, 1536, 12, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("ckpt_grad_accum", seed), _gen(seed)

    def run(blk, x):
        return checkpoint(blk, x, use_reentrant=False)

    for _ in range(14):
        for _ in range(4):
            b, n = _tokens_batch(rng, 256, 2048, 8192, [2, 4, 8])
            x = torch.randint(0, 32000, (b, n + 1), device=DEVICE, generator=g)
            with torch.autocast(DEVICE, dtype=BF16):
                loss = model.loss(x, run) / 4
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def fp16_gradscaler_bert(seed=0):
    """BERT-large-sized sequence classification trained in fp16 with
    torch.amp.GradScaler (scale, unscale, clip, step, update; steps with
    inf gradients are skipped) on batches of random size and length."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                     num_labels=3)
    model = BertForSequenceClassification(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    scaler = torch.amp.GradScaler("cuda")
    rng, g = _rng("fp16_gradscaler_bert", seed), _gen(seed)
    for _ in range(40):
        b, n = _tokens_batch(rng, 64, 512, 12288, [8, 16, 24, 32, 48])
        x = torch.randint(1000, 30000, (b, n), device=DEVICE, generator=g)
        y = torch.randint(0, 3, (b,), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=torch.float16):
            loss = model(input_ids=x, attention_mask=torch.ones_like(x), labels=y).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def diffusion_unet(seed=0):
    """DDPM training of a hand-written U-Net (timestep embedding, linear
    noise schedule over 1000 steps, epsilon prediction) at random
    resolutions (64..256) and batch sizes, bf16 autocast."""
    torch.manual_seed(seed)
    model = UNet().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    betas = torch.linspace(1e-4, 0.02, 1000, device=DEVICE)
    alpha_bar = torch.cumprod(1 - betas, dim=0)
    rng, g = _rng("diffusion_unet", seed), _gen(seed)
    for _ in range(40):
        res = rng.choice([64, 96, 128, 160, 192, 256])
        b = max(2, min(64, (24 * 128 * 128) // (res * res)))
        b = rng.randint(max(1, b // 2), b)
        x0 = torch.randn(b, 3, res, res, device=DEVICE, generator=g).clamp_(-1, 1)
        t = torch.randint(0, 1000, (b,), device=DEVICE, generator=g)
        noise = torch.randn(x0.shape, device=DEVICE, generator=g)
        a = alpha_bar[t][:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        with torch.autocast(DEVICE, dtype=BF16):
            loss = F.mse_loss(model(xt, t).float(), noise)
        _step(loss, opt)
    torch.cuda.synchronize()


def vit_train(seed=0):
    """torchvision's ViT-B/16 trained with AdamW, bf16 autocast, label
    smoothing, at random batch sizes (32..128) of 224x224 images."""
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.vit_b_16(weights=None).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    rng, g = _rng("vit_train", seed), _gen(seed)
    for _ in range(40):
        b = rng.choice([32, 48, 64, 96, 128])
        x = torch.randn(b, 3, 224, 224, device=DEVICE, generator=g)
        y = torch.randint(0, 1000, (b,), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        _step(loss, opt)
    torch.cuda.synchronize()


def prefetch_two_stream(seed=0):
    """A two-stream input pipeline: a side stream copies the next batch from
    pinned host memory (non_blocking), converts, normalizes and flips it on
    the GPU while the main stream trains a ResNet-34 on the current one; the
    batch is handed over with an event and record_stream. Resolutions
    (128..288) and batch sizes change every step."""
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.resnet34(weights=None).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = _rng("prefetch_two_stream", seed)
    g = _gen(seed)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    host = torch.randint(0, 256, (128 * 3 * 288 * 288 + 4096,), dtype=torch.uint8).pin_memory()
    mean = torch.tensor([0.485, 0.456, 0.406], device=DEVICE).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=DEVICE).view(1, 3, 1, 1) * 255

    def fetch():
        res = rng.choice([128, 160, 192, 224, 256, 288])
        b = rng.choice([32, 48, 64, 96, 128])
        off = rng.randint(0, 4096)
        src = host[off:off + b * 3 * res * res].view(b, 3, res, res)
        with torch.cuda.stream(side):
            x = src.to(DEVICE, non_blocking=True)
            x = (x.float() - mean) / std
            flip = torch.rand(b, device=DEVICE, generator=g) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
            y = torch.randint(0, 1000, (b,), device=DEVICE, generator=g)
            ev = side.record_event()
        return x, y, ev

    nxt = fetch()
    for _ in range(50):
        x, y, ev = nxt
        main.wait_event(ev)
        x.record_stream(main)
        y.record_stream(main)
        nxt = fetch()
        with torch.autocast(DEVICE, dtype=BF16):
            loss = F.cross_entropy(model(x), y)
        _step(loss, opt)
        del x, y
    torch.cuda.synchronize()


def _init_dist():
    import torch.distributed as dist
    path = os.path.join(tempfile.mkdtemp(prefix="corpus_dist_"), "store")
    dist.init_process_group("nccl", init_method="file://" + path, rank=0, world_size=1)
    return dist


def comm_buckets(seed=0):
    """Gradient buckets all-reduced on a communication stream while backward
    goes on, as DDP does, written by hand with torch.distributed (NCCL,
    world size 1): a post-accumulate-grad hook per parameter; when a ~25 MB
    bucket is complete, the comm stream waits for the main stream, flattens
    the bucket (allocated on the comm stream), all-reduces it and copies it
    back; the optimizer waits for the comm stream. GPT-2 small, random
    lengths, bf16 autocast."""
    from transformers import GPT2Config, GPT2LMHeadModel
    dist = _init_dist()
    try:
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(GPT2Config()).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        comm = torch.cuda.Stream()
        params = [p for p in model.parameters() if p.requires_grad]
        buckets, cur, size = [], [], 0
        for p in reversed(params):  # backward produces gradients roughly in reverse
            cur.append(p)
            size += p.numel() * 4
            if size >= 25 << 20:
                buckets.append(cur)
                cur, size = [], 0
        if cur:
            buckets.append(cur)
        where = {id(p): i for i, bkt in enumerate(buckets) for p in bkt}
        ready = [0] * len(buckets)

        def reduce_bucket(i):
            grads = [p.grad for p in buckets[i]]
            comm.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(comm):
                flat = torch.cat([gr.flatten() for gr in grads])
                flat.div_(dist.get_world_size())
                dist.all_reduce(flat)
                off = 0
                for gr in grads:
                    gr.copy_(flat[off:off + gr.numel()].view_as(gr))
                    gr.record_stream(comm)
                    off += gr.numel()

        def hook(p):
            i = where[id(p)]
            ready[i] += 1
            if ready[i] == len(buckets[i]):
                reduce_bucket(i)

        for p in params:
            p.register_post_accumulate_grad_hook(hook)
        rng, g = _rng("comm_buckets", seed), _gen(seed)
        for _ in range(40):
            b, n = _tokens_batch(rng, 64, 1024, 12288, [4, 8, 12, 16])
            x = torch.randint(0, 50257, (b, n), device=DEVICE, generator=g)
            ready[:] = [0] * len(buckets)
            with torch.autocast(DEVICE, dtype=BF16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.cuda.current_stream().wait_stream(comm)
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


def ddp_world1(seed=0):
    """torch.nn.parallel.DistributedDataParallel over NCCL with world size 1
    (the reducer's buckets and all-reduces run as on one rank of many): a
    T5-small-sized encoder-decoder trained on random source and target
    lengths, bf16 autocast."""
    from transformers import T5Config, T5ForConditionalGeneration
    dist = _init_dist()
    try:
        torch.manual_seed(seed)
        cfg = T5Config(d_model=512, d_ff=2048, num_layers=8, num_decoder_layers=8, num_heads=8,
                       vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
        model = T5ForConditionalGeneration(cfg).to(DEVICE)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=25)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        rng, g = _rng("ddp_world1", seed), _gen(seed)
        for _ in range(40):
            b = rng.choice([8, 16, 24, 32])
            src, tgt = rng.randint(32, 512), rng.randint(8, 192)
            x = torch.randint(2, 32000, (b, src), device=DEVICE, generator=g)
            y = torch.randint(2, 32000, (b, tgt), device=DEVICE, generator=g)
            with torch.autocast(DEVICE, dtype=BF16):
                loss = model(input_ids=x, labels=y).loss
            _step(loss, opt)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


class _ImageSet(torch.utils.data.Dataset):
    """Images made on the CPU in the loader's workers: an index is
    (sample, resolution), so one batch shares a resolution."""

    def __init__(self, seed):
        self.seed = seed

    def __len__(self):
        return 1 << 30

    def __getitem__(self, key):
        i, res = key
        g = torch.Generator().manual_seed(self.seed * 1000003 + i)
        img = torch.randint(0, 256, (3, res, res), dtype=torch.uint8, generator=g)
        return img, i % 1000


class _Batches(torch.utils.data.Sampler):
    def __init__(self, seed, n):
        self.seed, self.n = seed, n

    def __len__(self):
        return self.n

    def __iter__(self):
        rng = _rng("dataloader_pinned", self.seed)
        k = 0
        for _ in range(self.n):
            res, b = rng.choice([128, 160, 192, 224, 256]), rng.choice([32, 64, 96, 128])
            yield [(k + j, res) for j in range(b)]
            k += b


def dataloader_pinned(seed=0):
    """torch.utils.data.DataLoader with 3 workers making uint8 images on the
    CPU, pin_memory=True, and non_blocking copies to the GPU, feeding a
    ConvNeXt-Tiny trained with AdamW under bf16 autocast; batches of random
    size and resolution."""
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.convnext_tiny(weights=None).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_ImageSet(seed), batch_sampler=_Batches(seed, 50), num_workers=3,
                                         pin_memory=True, prefetch_factor=4)
    mean = torch.tensor([0.485, 0.456, 0.406], device=DEVICE).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=DEVICE).view(1, 3, 1, 1) * 255
    for img, label in loader:
        x = (img.to(DEVICE, non_blocking=True).float() - mean) / std
        y = label.to(DEVICE, non_blocking=True)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = F.cross_entropy(model(x), y)
        _step(loss, opt)
    torch.cuda.synchronize()


class _SeqClassifier(nn.Module):
    def __init__(self, encoder, dim, classes):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


def model_sweep(seed=0):
    """A notebook-style sweep: build a model of random architecture and width
    on the GPU (torchvision ResNets and MobileNet, transformer encoders,
    MLPs), train it a few steps, delete it, collect garbage; 14 times."""
    import torchvision
    torch.manual_seed(seed)
    rng, g = _rng("model_sweep", seed), _gen(seed)
    for _ in range(14):
        kind = rng.choice(["resnet", "mobilenet", "transformer", "mlp"])
        if kind == "resnet":
            ctor = rng.choice([torchvision.models.resnet18, torchvision.models.resnet50,
                               torchvision.models.wide_resnet50_2])
            model, shape, classes = ctor(weights=None), (rng.choice([32, 64, 96]), 3, 224, 224), 1000
        elif kind == "mobilenet":
            model = torchvision.models.mobilenet_v2(weights=None, width_mult=rng.choice([0.5, 1.0, 1.4]))
            shape, classes = (rng.choice([64, 128]), 3, 224, 224), 1000
        elif kind == "transformer":
            d = rng.choice([512, 768, 1024, 1280])
            layer = nn.TransformerEncoderLayer(d, d // 64, 4 * d, batch_first=True, norm_first=True)
            model = _SeqClassifier(nn.TransformerEncoder(layer, rng.randint(4, 16), enable_nested_tensor=False),
                                   d, 10)
            shape, classes = (rng.choice([16, 32]), rng.choice([128, 256, 512]), d), 10
        else:
            w = rng.choice([2048, 4096, 8192])
            layers = []
            for _ in range(rng.randint(3, 8)):
                layers += [nn.Linear(w, w), nn.GELU()]
            model = nn.Sequential(nn.Linear(1024, w), *layers, nn.Linear(w, 10))
            shape, classes = (rng.choice([256, 1024]), 1024), 10
        model = model.to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(rng.randint(4, 8)):
            x = torch.randn(shape, device=DEVICE, generator=g)
            y = torch.randint(0, classes, (shape[0],), device=DEVICE, generator=g)
            with torch.autocast(DEVICE, dtype=BF16):
                loss = F.cross_entropy(model(x).float(), y)
            _step(loss, opt)
        loss.item()
        del model, opt, x, y, loss
        gc.collect()
    torch.cuda.synchronize()


def fcn_segmentation(seed=0):
    """torchvision's FCN-ResNet50 (dilated backbone, auxiliary head) trained
    for 21-class segmentation at random sizes (256..512) and batches."""
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=21,
                                                          aux_loss=True).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    rng, g = _rng("fcn_segmentation", seed), _gen(seed)
    for _ in range(30):
        h, w = rng.randrange(256, 513, 32), rng.randrange(256, 513, 32)
        b = max(2, min(16, (8 * 448 * 448) // (h * w)))
        b = rng.randint(max(2, b // 2), b)
        x = torch.randn(b, 3, h, w, device=DEVICE, generator=g)
        y = torch.randint(0, 21, (b, h, w), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            out = model(x)
            loss = F.cross_entropy(out["out"].float(), y) + 0.5 * F.cross_entropy(out["aux"].float(), y)
        _step(loss, opt)
    torch.cuda.synchronize()


def gnn_random_graphs(seed=0):
    """A GraphSAGE-style network (mean aggregation by index_add_ over edge
    lists, 4 layers, hidden 512) trained on node classification, a new
    random graph every step (20k..120k nodes, degree 4..16)."""
    torch.manual_seed(seed)

    class Sage(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.self_lin = nn.Linear(cin, cout)
            self.nb_lin = nn.Linear(cin, cout)

        def forward(self, x, src, dst, inv_deg):
            agg = torch.zeros_like(x).index_add_(0, dst, x[src]) * inv_deg[:, None]
            return self.self_lin(x) + self.nb_lin(agg)

    dims = [256, 512, 512, 512, 40]
    layers = nn.ModuleList([Sage(a, b) for a, b in zip(dims, dims[1:])]).to(DEVICE)
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)
    rng, g = _rng("gnn_random_graphs", seed), _gen(seed)
    for _ in range(40):
        n, deg = rng.randint(20000, 120000), rng.randint(4, 16)
        e = n * deg
        src = torch.randint(0, n, (e,), device=DEVICE, generator=g)
        dst = torch.randint(0, n, (e,), device=DEVICE, generator=g)
        inv_deg = 1.0 / torch.bincount(dst, minlength=n).clamp_(min=1).float()
        x = torch.randn(n, dims[0], device=DEVICE, generator=g)
        y = torch.randint(0, dims[-1], (n,), device=DEVICE, generator=g)
        h = x
        for i, layer in enumerate(layers):
            h = layer(h, src, dst, inv_deg)
            if i < len(layers) - 1:
                h = F.dropout(F.relu(h), 0.2, True)
        loss = F.cross_entropy(h, y)
        _step(loss, opt)
    torch.cuda.synchronize()


def clip_contrastive(seed=0):
    """CLIP contrastive training (transformers CLIPModel from a config:
    ViT-B/16 image tower, 12-layer text tower) on random image batches and
    captions of random length, bf16 autocast."""
    from transformers import CLIPConfig, CLIPModel
    torch.manual_seed(seed)
    cfg = CLIPConfig(text_config={"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048,
                                  "num_hidden_layers": 12, "num_attention_heads": 8,
                                  "max_position_embeddings": 77},
                     vision_config={"image_size": 224, "patch_size": 16, "hidden_size": 768,
                                    "intermediate_size": 3072, "num_hidden_layers": 12,
                                    "num_attention_heads": 12},
                     projection_dim=512)
    model = CLIPModel(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    rng, g = _rng("clip_contrastive", seed), _gen(seed)
    for _ in range(30):
        b, n = rng.choice([32, 64, 96, 128, 160]), rng.randint(8, 77)
        ids = torch.randint(3, 49000, (b, n), device=DEVICE, generator=g)
        ids[:, -1] = cfg.text_config.eos_token_id
        px = torch.randn(b, 3, 224, 224, device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px,
                         return_loss=True).loss
        _step(loss, opt)
    torch.cuda.synchronize()


def maskrcnn_train(seed=0):
    """torchvision's Mask R-CNN (ResNet-50 FPN) trained on images of random
    sizes (400..800 a side, resized by the model) with 1..12 random boxes
    and masks each, batches of 2..6."""
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                               num_classes=91).to(DEVICE).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, weight_decay=1e-4)
    rng, g = _rng("maskrcnn_train", seed), _gen(seed)
    for _ in range(30):
        images, targets = [], []
        for _ in range(rng.randint(2, 6)):
            h, w = rng.randint(400, 800), rng.randint(400, 800)
            images.append(torch.rand(3, h, w, device=DEVICE, generator=g))
            boxes, k = [], rng.randint(1, 12)
            masks = torch.zeros(k, h, w, dtype=torch.uint8, device=DEVICE)
            for j in range(k):
                x1, y1 = rng.randint(0, w - 32), rng.randint(0, h - 32)
                x2, y2 = rng.randint(x1 + 16, w), rng.randint(y1 + 16, h)
                boxes.append([x1, y1, x2, y2])
                masks[j, y1:y2, x1:x2] = 1
            targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32, device=DEVICE),
                            "labels": torch.tensor([rng.randint(1, 90) for _ in range(k)], device=DEVICE),
                            "masks": masks})
        losses = model(images, targets)
        _step(sum(losses.values()), opt)
    torch.cuda.synchronize()


def whisper_train(seed=0):
    """A Whisper-base-sized encoder-decoder (transformers WhisperConfig)
    trained on random log-mel inputs (30 s, 80 bins, 3000 frames) with
    transcripts of random length (16..200 tokens), batches of 4..24, bf16."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    torch.manual_seed(seed)
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, encoder_layers=6, decoder_layers=6, d_model=512,
                        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                        decoder_ffn_dim=2048, max_source_positions=1500, max_target_positions=448)
    model = WhisperForConditionalGeneration(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("whisper_train", seed), _gen(seed)
    for _ in range(30):
        b, n = rng.choice([4, 8, 12, 16, 24]), rng.randint(16, 200)
        feats = torch.randn(b, 80, 3000, device=DEVICE, generator=g)
        labels = torch.randint(0, 50000, (b, n), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_features=feats, labels=labels).loss
        _step(loss, opt)
    torch.cuda.synchronize()


def lora_finetune(seed=0):
    """LoRA fine-tuning written by hand: a GPT-2-medium-sized model frozen in
    bf16, rank-16 adapters on every attention and MLP input projection
    trained with AdamW, batches of random length (128..1024)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)).to(DEVICE, BF16)
    model.requires_grad_(False)
    for blk in model.transformer.h:
        blk.attn.c_attn = LoRA(blk.attn.c_attn)
        blk.mlp.c_fc = LoRA(blk.mlp.c_fc)
    adapters = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(adapters, lr=2e-4)
    model.train()
    rng, g = _rng("lora_finetune", seed), _gen(seed)
    for _ in range(40):
        b, n = _tokens_batch(rng, 128, 1024, 12288, [4, 8, 12, 16])
        x = torch.randint(0, 50257, (b, n), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_ids=x, labels=x).loss
        _step(loss, opt)
    torch.cuda.synchronize()


class PagedDecoder(nn.Module):
    """A decoder-only model (bf16, no grad) whose keys and values live in a
    preallocated pool of pages of 16 tokens, as in paged attention: each
    sequence owns a list of pages (its block table); prefill writes a
    prompt's keys and values into its pages, and each decode step writes one
    token per sequence and gathers every sequence's pages for attention."""

    def __init__(self, vocab, dim, heads, layers, pages, page=16, dtype=BF16):
        super().__init__()
        self.dim, self.heads, self.hd, self.page = dim, heads, dim // heads, page
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        shape = (layers, pages * page, heads, dim // heads)
        self.register_buffer("k_pool", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_pool", torch.zeros(shape, dtype=dtype), persistent=False)

    def _qkv(self, blk, x):
        b, n, _ = x.shape
        return blk.attn.qkv(blk.attn.ln(x)).view(b, n, 3, self.heads, self.hd).unbind(2)

    def _rest(self, blk, x, y):
        b, n, _ = x.shape
        x = x + blk.attn.proj(y.transpose(1, 2).reshape(b, n, self.dim))
        return x + blk.mlp(x)

    def _next(self, x):
        return (self.ln(x[:, -1]) @ self.embed.weight.t()).argmax(-1)

    def prefill(self, tokens, slots):
        """tokens (1, n); slots (n,): the pool rows of its positions."""
        x = self.embed(tokens)
        for i, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x)
            self.k_pool[i].index_copy_(0, slots, k[0])
            self.v_pool[i].index_copy_(0, slots, v[0])
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = self._rest(blk, x, y)
        return self._next(x)

    def decode(self, tokens, new_slots, table, lengths):
        """tokens (B,); new_slots (B,): where each token's key goes;
        table (B, P) pages; lengths (B,) tokens including the new one."""
        x = self.embed(tokens[:, None])
        span = table.shape[1] * self.page
        rows = (table[:, :, None] * self.page + torch.arange(self.page, device=table.device)).flatten(1)
        mask = (torch.arange(span, device=table.device)[None] < lengths[:, None])[:, None, None, :]
        for i, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x)
            self.k_pool[i].index_copy_(0, new_slots, k[:, 0])
            self.v_pool[i].index_copy_(0, new_slots, v[:, 0])
            kk = self.k_pool[i][rows].transpose(1, 2)
            vv = self.v_pool[i][rows].transpose(1, 2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask)
            x = self._rest(blk, x, y)
        return self._next(x)


def paged_kv_server(seed=0):
    """A long-context inference server with a paged, preallocated KV cache
    and continuous batching: 56 requests (prompts 128..3072 tokens, 16..160
    new tokens, greedy) are admitted while pages last, at most 16 decode
    together, and each frees its pages when done; a ~0.8B-parameter decoder
    in bf16."""
    torch.manual_seed(seed)
    page, pages = 16, 5120
    with torch.device(DEVICE):  # built on the GPU: 0.8B weights initialize slowly on a CPU
        model = PagedDecoder(32000, 2048, 16, 16, pages, page).to(BF16).eval()
    rng, g = _rng("paged_kv_server", seed), _gen(seed)
    queue = [(rng.randint(128, 3072), rng.randint(16, 160)) for _ in range(56)]
    free = list(range(pages))
    active = []  # dicts: pages, length, left, token
    with torch.no_grad():
        while queue or active:
            while queue and len(active) < 16:
                n, new = queue[0]
                need = -(-(n + new) // page)
                if need > len(free):
                    break
                queue.pop(0)
                own = [free.pop() for _ in range(need)]
                slots = torch.tensor([own[t // page] * page + t % page for t in range(n)], device=DEVICE)
                tokens = torch.randint(0, 32000, (1, n), device=DEVICE, generator=g)
                tok = model.prefill(tokens, slots)
                active.append({"pages": own, "length": n, "left": new, "token": tok})
            width = max(-(-(s["length"] + 1) // page) for s in active)
            table = torch.tensor([s["pages"][:width] + [0] * (width - min(width, len(s["pages"])))
                                  for s in active], device=DEVICE)
            new_slots = torch.tensor([s["pages"][s["length"] // page] * page + s["length"] % page
                                      for s in active], device=DEVICE)
            lengths = torch.tensor([s["length"] + 1 for s in active], device=DEVICE)
            tokens = torch.cat([s["token"] for s in active])
            out = model.decode(tokens, new_slots, table, lengths)
            for j, s in enumerate(active):
                s["token"], s["length"], s["left"] = out[j:j + 1], s["length"] + 1, s["left"] - 1
            for s in [s for s in active if s["left"] == 0]:
                free.extend(s["pages"])
                active.remove(s)
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# A second holdout (added 2026-11-24, after the first holdout was spent on
# the end-placement decision; MANIFEST.md): six programs of mechanisms no
# earlier program has, recorded once and replayed only for the report.


def gan_dcgan(seed=0):
    """DCGAN-style adversarial training: a generator of transposed
    convolutions and a discriminator of strided convolutions, two Adam
    optimizers, alternating discriminator and generator steps on random
    batch sizes (32..256) at random resolutions (64, 96 or 128)."""
    torch.manual_seed(seed)

    def up(cin, cout):
        return [nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]

    def down(cin, cout):
        return [nn.Conv2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2, True)]

    zdim = 128
    gen = nn.Sequential(nn.ConvTranspose2d(zdim, 1024, 4, 1, 0, bias=False), nn.BatchNorm2d(1024), nn.ReLU(True),
                        *up(1024, 512), *up(512, 256), *up(256, 128), *up(128, 64),
                        nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh()).to(DEVICE)
    disc = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2, True), *down(64, 128), *down(128, 256),
                         *down(256, 512), *down(512, 1024), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(1024, 1)).to(DEVICE)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    rng, g = _rng("gan_dcgan", seed), _gen(seed)
    for _ in range(60):
        b, size = rng.randint(32, 256), rng.choice([64, 96, 128])
        real = torch.rand(b, 3, size, size, device=DEVICE, generator=g) * 2 - 1
        z = torch.randn(b, zdim, 1, 1, device=DEVICE, generator=g)
        fake = gen(z)
        if size != fake.shape[-1]:
            fake = F.interpolate(fake, size=(size, size), mode="bilinear", align_corners=False)
        ones, zeros = torch.ones(b, 1, device=DEVICE), torch.zeros(b, 1, device=DEVICE)
        loss_d = (F.binary_cross_entropy_with_logits(disc(real), ones)
                  + F.binary_cross_entropy_with_logits(disc(fake.detach()), zeros))
        _step(loss_d, opt_d)
        loss_g = F.binary_cross_entropy_with_logits(disc(fake), ones)
        _step(loss_g, opt_g)
        opt_d.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


class CachedDecoder(nn.Module):
    """A decoder-only model with a key/value cache per layer that grows by
    torch.cat and is cut back by slicing (as speculative decoding rolls
    back rejected tokens)."""

    def __init__(self, vocab, dim, heads, layers):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens, cache):
        """tokens (B, n) after the cache's positions; cache: a list of
        (k, v) per layer, (B, heads, length, hd) each, or None. Returns the
        logits of every position and the new cache."""
        x = self.embed(tokens)
        b, n, d = x.shape
        out = []
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.attn.qkv(blk.attn.ln(x)).view(b, n, 3, self.heads, self.hd).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            past = k.shape[2] - n
            mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=x.device).tril(past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + blk.attn.proj(y.transpose(1, 2).reshape(b, n, d))
            x = x + blk.mlp(x)
            out.append((k, v))
        return self.ln(x) @ self.embed.weight.t(), out


def spec_decode(seed=0):
    """Speculative decoding: a small draft decoder proposes 4 tokens with
    its own cache, a large target decoder checks them in one forward, and
    both caches are cut back to the accepted length (acceptance drawn from a
    seeded generator at about 60%, as for a trained pair); 16 requests of
    random batch (1..8), prompt (64..1024) and length (32..96), bf16."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        draft = CachedDecoder(32000, 512, 8, 4).to(BF16).eval()
        target = CachedDecoder(32000, 1536, 12, 12).to(BF16).eval()
    rng, g = _rng("spec_decode", seed), _gen(seed)

    def crop(cache, n):
        return [(k[:, :, :n], v[:, :, :n]) for k, v in cache]

    with torch.no_grad():
        for _ in range(16):
            b, n, new = rng.randint(1, 8), rng.randint(64, 1024), rng.randint(32, 96)
            prompt = torch.randint(0, 32000, (b, n), device=DEVICE, generator=g)
            _, tc = target(prompt[:, :-1], None)
            _, dc = draft(prompt[:, :-1], None)
            last, done = prompt[:, -1:], 0
            while done < new:
                props, tok, c = [], last, dc
                for _ in range(4):
                    logits, c = draft(tok, c)
                    tok = logits[:, -1:].argmax(-1)
                    props.append(tok)
                check = torch.cat([last] + props[:-1], 1)
                logits, tc = target(check, tc)
                verdict = logits.argmax(-1)
                accepted = sum(1 for _ in range(4) if rng.random() < 0.6)
                keep = tc[0][0].shape[2] - 4 + accepted + 1
                tc, dc = crop(tc, keep), crop(c, min(keep, c[0][0].shape[2]))
                last = verdict[:, accepted:accepted + 1] if accepted < 4 else props[-1]
                done += accepted + 1
            last.sum().item()
    torch.cuda.synchronize()


def lstm_lm_varlen(seed=0):
    """A 3-layer LSTM language model (cuDNN, hidden 1536, vocabulary 32k)
    trained with truncated backpropagation through time on batches of
    random size and length (the hidden state carried, detached, between
    chunks of one batch)."""
    torch.manual_seed(seed)

    class LM(nn.Module):
        def __init__(self, vocab=32000, dim=1536):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.lstm = nn.LSTM(dim, dim, num_layers=3, batch_first=True, dropout=0.1)
            self.out = nn.Linear(dim, vocab)

        def forward(self, x, state):
            y, state = self.lstm(self.embed(x), state)
            return self.out(y), state

    model = LM().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng, g = _rng("lstm_lm_varlen", seed), _gen(seed)
    for _ in range(16):
        b, n = _tokens_batch(rng, 256, 1536, 24576, [8, 16, 24, 32, 48, 64])
        x = torch.randint(0, 32000, (b, n + 1), device=DEVICE, generator=g)
        state, chunk = None, rng.choice([64, 128, 256])
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            logits, state = model(x[:, s:e], state)
            loss = F.cross_entropy(logits.flatten(0, 1), x[:, s + 1:e + 1].flatten())
            _step(loss, opt)
            state = tuple(h.detach() for h in state)
    torch.cuda.synchronize()


def bart_train_generate(seed=0):
    """Summarization-style training of a BART-base-sized encoder-decoder
    (transformers BartConfig) at random source and target lengths, bf16
    autocast, with a greedy generate() of random length on a random batch
    every fourth step (evaluation inside training)."""
    from transformers import BartConfig, BartForConditionalGeneration
    torch.manual_seed(seed)
    cfg = BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                     encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                     decoder_ffn_dim=3072, max_position_embeddings=1024)
    model = BartForConditionalGeneration(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    rng, g = _rng("bart_train_generate", seed), _gen(seed)
    for step in range(40):
        b, n = _tokens_batch(rng, 128, 1024, 24576, [4, 8, 12, 16, 24, 32])
        m = rng.randint(16, 256)
        src = torch.randint(4, 50000, (b, n), device=DEVICE, generator=g)
        tgt = torch.randint(4, 50000, (b, m), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_ids=src, attention_mask=torch.ones_like(src), labels=tgt).loss
        _step(loss, opt)
        if step % 4 == 3:
            model.eval()
            with torch.no_grad(), torch.autocast(DEVICE, dtype=BF16):
                eb = rng.randint(1, 16)
                out = model.generate(input_ids=src[:eb], attention_mask=torch.ones_like(src[:eb]),
                                     num_beams=1, do_sample=False, max_new_tokens=rng.randint(16, 96),
                                     min_new_tokens=16)
                out.sum().item()
            model.train()
    torch.cuda.synchronize()


def ppo_rollouts(seed=0):
    """Reinforcement learning in the PPO manner: a policy and a value
    network act on a batch of simulated environments (random linear
    dynamics on the GPU) for a rollout whose per-step tensors are kept in
    lists, then advantages by GAE and four epochs of clipped updates over
    shuffled minibatches; environments (512..4096) and horizon (64..256)
    random per iteration."""
    torch.manual_seed(seed)
    obs_dim, act = 256, 18
    pi = nn.Sequential(nn.Linear(obs_dim, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(),
                       nn.Linear(1024, act)).to(DEVICE)
    vf = nn.Sequential(nn.Linear(obs_dim, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(),
                       nn.Linear(1024, 1)).to(DEVICE)
    opt = torch.optim.Adam(list(pi.parameters()) + list(vf.parameters()), lr=3e-4)
    rng, g = _rng("ppo_rollouts", seed), _gen(seed)
    dyn = torch.randn(act, obs_dim, obs_dim, device=DEVICE, generator=g) / obs_dim ** 0.5
    for _ in range(8):
        envs, horizon = rng.choice([512, 1024, 2048, 4096]), rng.randint(64, 256)
        obs = torch.randn(envs, obs_dim, device=DEVICE, generator=g)
        keep = {k: [] for k in ("obs", "act", "logp", "val", "rew")}
        with torch.no_grad():
            for _ in range(horizon):
                logits = pi(obs)
                a = torch.multinomial(F.softmax(logits, -1), 1, generator=g).squeeze(1)
                keep["obs"].append(obs)
                keep["act"].append(a)
                keep["logp"].append(F.log_softmax(logits, -1).gather(1, a[:, None]).squeeze(1))
                keep["val"].append(vf(obs).squeeze(1))
                keep["rew"].append(obs[:, :8].sum(1).tanh())
                obs = torch.tanh(torch.bmm(dyn[a], obs[:, :, None]).squeeze(2)
                                 + 0.1 * torch.randn(envs, obs_dim, device=DEVICE, generator=g))
            rew, val = torch.stack(keep["rew"]), torch.stack(keep["val"])
            adv, last = torch.zeros_like(rew), torch.zeros(envs, device=DEVICE)
            for t in reversed(range(horizon)):
                nxt = val[t + 1] if t + 1 < horizon else torch.zeros_like(val[t])
                last = rew[t] + 0.99 * nxt - val[t] + 0.99 * 0.95 * last
                adv[t] = last
            ret = (adv + val).flatten()
            adv = ((adv - adv.mean()) / (adv.std() + 1e-8)).flatten()
        o, a, lp = torch.cat(keep["obs"]), torch.cat(keep["act"]), torch.cat(keep["logp"])
        del keep
        total, mb = o.shape[0], rng.choice([4096, 8192, 16384])
        for _ in range(4):
            perm = torch.randperm(total, device=DEVICE, generator=g)
            for s in range(0, total, mb):
                i = perm[s:s + mb]
                logits = pi(o[i])
                ratio = (F.log_softmax(logits, -1).gather(1, a[i, None]).squeeze(1) - lp[i]).exp()
                loss = (-torch.min(ratio * adv[i], ratio.clamp(0.8, 1.2) * adv[i]).mean()
                        + 0.5 * (vf(o[i]).squeeze(1) - ret[i]).pow(2).mean()
                        - 0.01 * torch.distributions.Categorical(logits=logits).entropy().mean())
                _step(loss, opt)
    torch.cuda.synchronize()


def dlrm_sparse(seed=0):
    """A DLRM-style recommender: eight embedding tables (0.25M..2M rows of
    128, EmbeddingBag with sparse gradients, SparseAdam) looked up with bags
    of random length, a bottom MLP on dense features, pairwise feature
    interactions (bmm) and a top MLP (Adam); batches of random size
    (2048..16384)."""
    torch.manual_seed(seed)
    rng, g = _rng("dlrm_sparse", seed), _gen(seed)
    rows = [rng.choice([250_000, 500_000, 1_000_000, 2_000_000]) for _ in range(8)]
    dim = 128
    tables = nn.ModuleList([nn.EmbeddingBag(r, dim, mode="sum", sparse=True) for r in rows]).to(DEVICE)
    bottom = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                           nn.Linear(256, dim), nn.ReLU()).to(DEVICE)
    pairs = (len(rows) + 1) * len(rows) // 2
    top = nn.Sequential(nn.Linear(pairs + dim, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                        nn.Linear(512, 1)).to(DEVICE)
    opt_sparse = torch.optim.SparseAdam(list(tables.parameters()), lr=1e-3)
    opt_dense = torch.optim.Adam(list(bottom.parameters()) + list(top.parameters()), lr=1e-3)
    iu = torch.triu_indices(len(rows) + 1, len(rows) + 1, offset=1, device=DEVICE)
    for _ in range(60):
        b = rng.choice([2048, 4096, 8192, 12288, 16384])
        dense = torch.randn(b, 64, device=DEVICE, generator=g)
        embs = []
        for t, r in zip(tables, rows):
            lengths = torch.randint(1, rng.randint(2, 40), (b,), device=DEVICE, generator=g)
            offsets = torch.cumsum(lengths, 0) - lengths
            idx = torch.randint(0, r, (int(lengths.sum().item()),), device=DEVICE, generator=g)
            embs.append(t(idx, offsets))
        x = bottom(dense)
        feats = torch.stack([x] + embs, 1)
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, iu[0], iu[1]]
        logit = top(torch.cat([x, inter], 1)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logit, torch.rand(b, device=DEVICE, generator=g).round())
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
        opt_sparse.zero_grad(set_to_none=True)
        opt_dense.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def video_conv3d(seed=0):
    """Video action recognition: torchvision's R(2+1)D-18 (random weights,
    400 classes) trained with SGD and bf16 autocast on clips of random
    length (8..32 frames), size (112 or 128) and batch (2..12)."""
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.video.r2plus1d_18(weights=None, num_classes=400).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng, g = _rng("video_conv3d", seed), _gen(seed)
    for _ in range(40):
        t, s, b = rng.choice([8, 16, 24, 32]), rng.choice([112, 128]), rng.randint(2, 12)
        x = torch.randn(b, 3, t, s, s, device=DEVICE, generator=g)
        y = torch.randint(0, 400, (b,), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            loss = F.cross_entropy(model(x), y)
        _step(loss, opt)
    torch.cuda.synchronize()


def knn_retrieval(seed=0):
    """Vector search over a database of fp16 embeddings (256-d, 1M to start)
    that grows by torch.cat as batches of new vectors arrive (20k..200k)
    and is compacted by index_select when a random tenth is deleted;
    queries in chunks of random size (1k..4k) scored against shards of the
    database by matmul, top-32 per shard, merged by cat and topk."""
    rng, g = _rng("knn_retrieval", seed), _gen(seed)
    dim, k = 256, 32
    db = torch.randn(1_000_000, dim, device=DEVICE, dtype=torch.float16, generator=g)
    for _ in range(120):
        op = rng.random()
        if op < 0.3:
            new = torch.randn(rng.randint(20_000, 200_000), dim, device=DEVICE, dtype=torch.float16, generator=g)
            db = torch.cat([db, new])
            del new
        elif op < 0.4 and db.shape[0] > 500_000:
            keep = torch.rand(db.shape[0], device=DEVICE, generator=g) > 0.1
            db = db.index_select(0, keep.nonzero().squeeze(1))
            del keep
        else:
            q = torch.randn(rng.randint(1_000, 4_000), dim, device=DEVICE, dtype=torch.float16, generator=g)
            shard = rng.choice([131_072, 262_144, 524_288])
            vals, idxs = [], []
            for s in range(0, db.shape[0], shard):
                v, i = (q @ db[s:s + shard].t()).topk(k, dim=1)
                vals.append(v)
                idxs.append(i + s)
            v, pos = torch.cat(vals, 1).topk(k, dim=1)
            ids = torch.cat(idxs, 1).gather(1, pos)
            ids.sum().item()
            del q, vals, idxs, v, pos, ids
    torch.cuda.synchronize()


def streaming_kv(seed=0):
    """Streaming generation with attention sinks: a decoder (8 layers, dim
    1024) generates for four sequences in turn, each with a batch of 1..4,
    a prompt of 64..512 tokens and a window of 128..1024; past the window
    its key/value cache keeps the first 4 tokens and the last `window`,
    rebuilt by torch.cat every step, and a sequence that reaches its
    length (150..700 tokens) is replaced by a new one. bf16, no grad."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = CachedDecoder(32000, 1024, 16, 8).to(BF16).eval()
    rng, g = _rng("streaming_kv", seed), _gen(seed)

    def new_seq():
        b, n = rng.randint(1, 4), rng.randint(64, 512)
        prompt = torch.randint(0, 32000, (b, n), device=DEVICE, generator=g)
        logits, cache = model(prompt, None)
        return {"cache": cache, "tok": logits[:, -1:].argmax(-1), "left": rng.randint(150, 700),
                "window": rng.choice([128, 256, 512, 1024])}

    with torch.no_grad():
        seqs = [new_seq() for _ in range(4)]
        done = 0
        for _ in range(600):
            i = rng.randrange(len(seqs))
            st = seqs[i]
            logits, cache = model(st["tok"], st["cache"])
            w = st["window"]
            if cache[0][0].shape[2] > 4 + w:
                cache = [(torch.cat([k[:, :, :4], k[:, :, -w:]], 2), torch.cat([v[:, :, :4], v[:, :, -w:]], 2))
                         for k, v in cache]
            st["cache"], st["tok"] = cache, logits[:, -1:].argmax(-1)
            st["left"] -= 1
            if st["left"] == 0:
                st["tok"].sum().item()
                seqs[i] = new_seq()
                done += 1
    torch.cuda.synchronize()


def layer_offload(seed=0):
    """Inference with weights streamed from pinned host memory (as
    accelerate's CPU offload and ZeRO-Inference do): 16 MLP blocks of
    4096 x 11008 bf16 weights live on the host; each block's weights are
    copied to the GPU on a side stream while the block before computes
    (event, record_stream), used, and dropped; the output feeds a
    vocabulary head trained on the GPU (AdamW). Random batch and length."""
    torch.manual_seed(seed)
    dim, ffn, layers = 4096, 11008, 16
    rng, g = _rng("layer_offload", seed), _gen(seed)
    host = []
    for _ in range(layers):
        pair = []
        for shape in ((ffn, dim), (dim, ffn)):
            w = torch.empty(shape, dtype=BF16, pin_memory=True)
            w.copy_(torch.randn(shape, device=DEVICE, dtype=BF16, generator=g) * 0.02)
            pair.append(w)
        host.append(pair)
    head = nn.Linear(dim, 32000).to(DEVICE)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-4)
    copy, main = torch.cuda.Stream(), torch.cuda.current_stream()

    def fetch(i):
        with torch.cuda.stream(copy):
            w1, w2 = (w.to(DEVICE, non_blocking=True) for w in host[i])
            ev = torch.cuda.Event()
            ev.record()
        return w1, w2, ev

    for _ in range(30):
        b, n = _tokens_batch(rng, 128, 2048, 16384, [1, 2, 4, 8, 16])
        h = torch.randn(b, n, dim, device=DEVICE, dtype=BF16, generator=g)
        with torch.no_grad():
            nxt = fetch(0)
            for i in range(layers):
                w1, w2, ev = nxt
                main.wait_event(ev)
                w1.record_stream(main)
                w2.record_stream(main)
                if i + 1 < layers:
                    nxt = fetch(i + 1)
                h = h + F.gelu(F.layer_norm(h, (dim,)) @ w1.t()) @ w2.t()
                del w1, w2
        y = torch.randint(0, 32000, (b, n), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            logits = head(h)
        _step(F.cross_entropy(logits.float().flatten(0, 1), y.flatten()), opt)
        del h, logits
    torch.cuda.synchronize()


def pointnet_varpts(seed=0):
    """Point-cloud segmentation in the PointNet++ manner, written by hand:
    clouds of random size (4k..24k points, batch 2..6), centres sampled at
    random, neighbourhoods by torch.cdist and topk (k = 32), grouped by
    gather, shared MLPs and max pooling over two levels, features carried
    back by inverse-distance interpolation from the 3 nearest centres;
    per-point cross entropy, AdamW."""
    torch.manual_seed(seed)

    class SetAbstraction(nn.Module):
        def __init__(self, cin, cout, k=32):
            super().__init__()
            self.k = k
            self.mlp = nn.Sequential(nn.Linear(cin + 3, cout), nn.ReLU(), nn.Linear(cout, cout), nn.ReLU())

        def forward(self, xyz, feat, m, g):
            b, n, _ = xyz.shape
            idx = torch.randint(0, n, (b, m), device=DEVICE, generator=g)
            centres = xyz.gather(1, idx[..., None].expand(-1, -1, 3))
            near = torch.cdist(centres, xyz).topk(self.k, dim=2, largest=False).indices.reshape(b, -1)
            gx = xyz.gather(1, near[..., None].expand(-1, -1, 3)).view(b, m, self.k, 3) - centres[:, :, None]
            gf = feat.gather(1, near[..., None].expand(-1, -1, feat.shape[-1])).view(b, m, self.k, -1)
            return centres, self.mlp(torch.cat([gx, gf], -1)).max(2).values

    class Propagate(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(cin, cout), nn.ReLU())

        def forward(self, fine_xyz, fine_feat, xyz, feat):
            b, n, _ = fine_xyz.shape
            d, idx = torch.cdist(fine_xyz, xyz).topk(3, dim=2, largest=False)
            w = 1.0 / (d + 1e-8)
            w = w / w.sum(2, keepdim=True)
            near = feat.gather(1, idx.reshape(b, -1)[..., None].expand(-1, -1, feat.shape[-1])).view(b, n, 3, -1)
            return self.mlp(torch.cat([(near * w[..., None]).sum(2), fine_feat], -1))

    sa1, sa2 = SetAbstraction(3, 128).to(DEVICE), SetAbstraction(128, 256).to(DEVICE)
    fp2, fp1 = Propagate(256 + 128, 256).to(DEVICE), Propagate(256 + 3, 128).to(DEVICE)
    cls = nn.Linear(128, 16).to(DEVICE)
    params = [p for m in (sa1, sa2, fp2, fp1, cls) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    rng, g = _rng("pointnet_varpts", seed), _gen(seed)
    for _ in range(50):
        b, n = rng.randint(2, 6), rng.randint(4_000, 24_000)
        xyz = torch.rand(b, n, 3, device=DEVICE, generator=g)
        labels = torch.randint(0, 16, (b, n), device=DEVICE, generator=g)
        c1, f1 = sa1(xyz, xyz, n // 4, g)
        c2, f2 = sa2(c1, f1, n // 16, g)
        up1 = fp2(c1, f1, c2, f2)
        out = cls(fp1(xyz, xyz, c1, up1))
        _step(F.cross_entropy(out.flatten(0, 1), labels.flatten()), opt)
    torch.cuda.synchronize()


def train_eval_mix(seed=0):
    """Training with evaluation and checkpoints in between: a 12-layer
    transformer classifier (dim 768, written here) trained with AdamW at
    random batch (8..64) and length (64..512); every fifth step an
    evaluation under no_grad and bf16 autocast at four times the batch;
    every tenth a checkpoint: the model's and the optimizer's state copied
    to host memory."""
    torch.manual_seed(seed)

    class Classifier(nn.Module):
        def __init__(self, vocab=32000, dim=768, heads=12, layers=12, classes=1000):
            super().__init__()
            self.lm = LM(vocab, dim, heads, layers)
            self.out = nn.Linear(dim, classes)

        def forward(self, tokens):
            return self.out(self.lm.hidden(tokens).mean(1))

    model = Classifier().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("train_eval_mix", seed), _gen(seed)
    saved = None
    for step in range(60):
        b, n = rng.randint(8, 64), rng.randint(64, 512)
        x = torch.randint(0, 32000, (b, n), device=DEVICE, generator=g)
        y = torch.randint(0, 1000, (b,), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            loss = F.cross_entropy(model(x), y)
        _step(loss, opt)
        if step % 5 == 4:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=BF16):
                for _ in range(3):
                    xe = torch.randint(0, 32000, (4 * b, n), device=DEVICE, generator=g)
                    model(xe).argmax(-1).sum().item()
            model.train()
        if step % 10 == 9:
            saved = ({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                     {k: {n2: t.to("cpu", copy=True) if torch.is_tensor(t) else t for n2, t in st.items()}
                      for k, st in opt.state_dict()["state"].items()})
    del saved
    torch.cuda.synchronize()


def chat_small_lm(seed=0):
    """A small chat model served one conversation at a time: a 12-layer
    decoder (dim 768, bf16, no grad) answers turns of random length
    (16..80 tokens) to prompts of random length (16..256), its key/value
    cache grown by torch.cat a token at a time and kept across the turns
    of a conversation (2..5 turns), then dropped for the next one."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = CachedDecoder(32000, 768, 12, 12).to(BF16).eval()
    rng, g = _rng("chat_small_lm", seed), _gen(seed)
    with torch.no_grad():
        for _ in range(3):
            cache = None
            for _ in range(rng.randint(2, 5)):
                prompt = torch.randint(0, 32000, (1, rng.randint(16, 256)), device=DEVICE, generator=g)
                logits, cache = model(prompt, cache)
                tok = logits[:, -1:].argmax(-1)
                for _ in range(rng.randint(16, 80)):
                    logits, cache = model(tok, cache)
                    tok = logits[:, -1:].argmax(-1)
                tok.sum().item()
            del cache
    torch.cuda.synchronize()


def vision_infer_mixed(seed=0):
    """An image-inference service with two small models: torchvision's
    ResNet-18 and MobileNetV3-Small (random weights, eval, no grad),
    requests in seeded random order at random batch (1..64) and size
    (128..384), some in channels_last, some under bf16 autocast."""
    import torchvision

    torch.manual_seed(seed)
    models = [torchvision.models.resnet18(weights=None).to(DEVICE).eval(),
              torchvision.models.mobilenet_v3_small(weights=None).to(DEVICE).eval()]
    rng, g = _rng("vision_infer_mixed", seed), _gen(seed)
    with torch.no_grad():
        for _ in range(300):
            m = rng.choice(models)
            b, s = rng.randint(1, 64), rng.choice([128, 160, 224, 288, 384])
            x = torch.rand(b, 3, s, s, device=DEVICE, generator=g)
            if rng.random() < 0.3:
                x = x.contiguous(memory_format=torch.channels_last)
            if rng.random() < 0.5:
                with torch.autocast("cuda", dtype=BF16):
                    y = m(x)
            else:
                y = m(x)
            y.argmax(-1).sum().item()
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# The fourth holdout (2026-11-29, fifth session): six programs of mechanisms
# no earlier one has, written and split before their first recording
# (MANIFEST.md).


def hyena_fft_lm(seed=0):
    """A Hyena-style language model: every block mixes tokens by a long
    convolution as long as the sequence (a filter made by a small MLP from
    sine features of the position, decayed), applied by FFT (cuFFT: rfft
    and irfft of twice the length, in float32, a plan and a workspace for
    every new length) and gated, then a GELU MLP; 8 blocks of dim 768,
    trained with AdamW under bf16 autocast at random lengths 1,024..8,192
    (batch from 1..16 within 32k tokens)."""
    torch.manual_seed(seed)

    class LongConv(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.ln = nn.LayerNorm(dim)
            self.inp = nn.Linear(dim, 3 * dim)
            self.filt = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, dim))
            self.out = nn.Linear(dim, dim)

        def forward(self, x):
            b, n, d = x.shape
            u, gate, v = self.inp(self.ln(x)).chunk(3, -1)
            t = torch.linspace(0, 1, n, device=x.device)[:, None]
            waves = [f(t * (2 ** k) * math.pi) for k in range(8) for f in (torch.sin, torch.cos)]
            h = self.filt(torch.cat(waves, -1)).float() * torch.exp(-4 * t)
            hf = torch.fft.rfft(h.t(), n=2 * n)
            uf = torch.fft.rfft(u.float().transpose(1, 2), n=2 * n)
            y = torch.fft.irfft(uf * hf, n=2 * n)[..., :n].transpose(1, 2)
            return x + self.out((y * torch.sigmoid(gate.float()) + v.float()).to(x.dtype))

    class HyenaBlock(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.mix = LongConv(dim)
            self.ln2 = nn.LayerNorm(dim)
            self.up = nn.Linear(dim, 4 * dim)
            self.down = nn.Linear(4 * dim, dim)

        def forward(self, x):
            x = self.mix(x)
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class HyenaLM(LM):
        def __init__(self, vocab, dim, layers):
            super().__init__(vocab, dim, 1, layers, block=HyenaBlock)
            self.pos = nn.Embedding(8192, dim)

    model = HyenaLM(32000, 768, 8).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("hyena_fft_lm", seed), _gen(seed)
    for _ in range(30):
        b, n = _tokens_batch(rng, 1024, 8191, 32768, [1, 2, 4, 8, 16])
        x = torch.randint(0, 32000, (b, n + 1), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            loss = model.loss(x)
        _step(loss, opt)
    torch.cuda.synchronize()


def shampoo_mlp(seed=0):
    """Second-order training: a 6-layer MLP of random widths (1,024..2,560)
    trained with a Shampoo-style preconditioner written here: per weight
    matrix a left and a right statistic (G G^T and G^T G, accumulated every
    step), their inverse fourth roots recomputed every 8th step by
    torch.linalg.eigh (cuSOLVER, its workspaces), the update L^-1/4 G
    R^-1/4 grafted to the gradient's norm; random batches of 256..4,096."""
    torch.manual_seed(seed)
    rng, g = _rng("shampoo_mlp", seed), _gen(seed)
    widths = [1024] + [rng.choice([1024, 1536, 2048, 2560]) for _ in range(5)] + [1000]
    layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(widths, widths[1:])]).to(DEVICE)
    stats = {}

    def root(m):
        w, v = torch.linalg.eigh(m + 1e-4 * torch.eye(m.shape[0], device=DEVICE))
        return (v * w.clamp_min(1e-6).pow(-0.25)) @ v.t()

    for step in range(64):
        b = rng.choice([256, 512, 1024, 2048, 4096])
        x = torch.randn(b, widths[0], device=DEVICE, generator=g)
        y = torch.randint(0, widths[-1], (b,), device=DEVICE, generator=g)
        h = x
        for i, lin in enumerate(layers):
            h = lin(h)
            if i < len(layers) - 1:
                h = F.gelu(h)
        F.cross_entropy(h, y).backward()
        with torch.no_grad():
            for lin in layers:
                gw = lin.weight.grad
                if lin not in stats:
                    stats[lin] = [torch.zeros(gw.shape[0], gw.shape[0], device=DEVICE),
                                  torch.zeros(gw.shape[1], gw.shape[1], device=DEVICE), None, None]
                st = stats[lin]
                st[0].add_(gw @ gw.t())
                st[1].add_(gw.t() @ gw)
                if step % 8 == 0:
                    st[2], st[3] = root(st[0] / (step + 1)), root(st[1] / (step + 1))
                u = st[2] @ gw @ st[3]
                u.mul_(gw.norm() / u.norm().clamp_min(1e-12))
                lin.weight.sub_(1e-3 * u)
                lin.bias.sub_(1e-3 * lin.bias.grad)
                lin.weight.grad = None
                lin.bias.grad = None
    torch.cuda.synchronize()


def voxel_bev(seed=0):
    """Lidar-style detection in the PointPillars manner, written here:
    clouds of random size (20k..120k points, batch 2..6) cropped to a random
    range (a mask: data-dependent sizes), voxelized by torch.unique with
    return_inverse over 256x256 cells, per-point features (an MLP) averaged
    into their pillars by index_add, scattered into a dense bird's-eye canvas
    by index_copy, a 2-D CNN backbone and head, BCE against sparse random
    heatmaps; AdamW."""
    torch.manual_seed(seed)
    H = W = 256
    pfn = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64)).to(DEVICE)

    def conv(cin, cout, stride=1):
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    backbone = nn.Sequential(*conv(64, 128, 2), *conv(128, 128), *conv(128, 256, 2), *conv(256, 256),
                             nn.ConvTranspose2d(256, 128, 4, stride=4), nn.BatchNorm2d(128), nn.ReLU(),
                             nn.Conv2d(128, 8, 1)).to(DEVICE)
    opt = torch.optim.AdamW(list(pfn.parameters()) + list(backbone.parameters()), lr=1e-3)
    rng, g = _rng("voxel_bev", seed), _gen(seed)
    scale = torch.tensor([80.0, 80.0, 4.0, 1.0], device=DEVICE)
    shift = torch.tensor([40.0, 40.0, 2.0, 0.0], device=DEVICE)
    for _ in range(60):
        b, n = rng.randint(2, 6), rng.randint(20_000, 120_000)
        pts = torch.rand(b, n, 4, device=DEVICE, generator=g) * scale - shift
        r = rng.uniform(25.0, 40.0)
        keep = (pts[..., 0].abs() < r) & (pts[..., 1].abs() < r)
        bi = torch.arange(b, device=DEVICE)[:, None].expand(b, n)[keep]
        p = pts[keep]
        ix = ((p[:, 0] + 40) / 80 * W).long().clamp_(0, W - 1)
        iy = ((p[:, 1] + 40) / 80 * H).long().clamp_(0, H - 1)
        vox, inv = torch.unique((bi * H + iy) * W + ix, return_inverse=True)
        m = vox.numel()
        cnt = torch.zeros(m, device=DEVICE).index_add_(0, inv, torch.ones_like(p[:, 0]))
        mean = torch.zeros(m, 4, device=DEVICE).index_add_(0, inv, p) / cnt[:, None]
        feat = pfn(torch.cat([p, p[:, :2] - mean[inv, :2]], 1))
        pillars = torch.zeros(m, 64, device=DEVICE).index_add(0, inv, feat) / cnt[:, None]
        canvas = torch.zeros(b * H * W, 64, device=DEVICE).index_copy(0, vox, pillars)
        canvas = canvas.view(b, H, W, 64).permute(0, 3, 1, 2)
        with torch.autocast("cuda", dtype=BF16):
            out = backbone(canvas)
        target = (torch.rand(b, 8, H, W, device=DEVICE, generator=g) < 0.01).float()
        _step(F.binary_cross_entropy_with_logits(out.float(), target), opt)
    torch.cuda.synchronize()


def moco_queue(seed=0):
    """MoCo-style contrastive learning: a query encoder and a momentum key
    encoder (torchvision ResNet-18, channels_last, bf16 autocast) on two
    noisy views of random batches (64..256) and sizes (96..160), the key
    encoder moved toward the query one by torch._foreach_mul_/_foreach_add_
    every step, logits against a 65,536 x 128 queue of past keys written in
    place as a ring; SGD with momentum."""
    import torchvision

    torch.manual_seed(seed)
    rng, g = _rng("moco_queue", seed), _gen(seed)

    def encoder():
        return torchvision.models.resnet18(weights=None, num_classes=128).to(DEVICE).to(memory_format=torch.channels_last)

    q_enc, k_enc = encoder(), encoder()
    k_enc.load_state_dict(q_enc.state_dict())
    qp, kp = list(q_enc.parameters()), list(k_enc.parameters())
    for p in kp:
        p.requires_grad_(False)
    size = 65536
    queue = F.normalize(torch.randn(size, 128, device=DEVICE, generator=g), dim=1)
    ptr = 0
    opt = torch.optim.SGD(qp, lr=0.03, momentum=0.9, weight_decay=1e-4)
    for _ in range(80):
        b, s = rng.choice([64, 128, 192, 256]), rng.choice([96, 112, 128, 160])
        x = torch.rand(b, 3, s, s, device=DEVICE, generator=g)
        x1 = (x + 0.1 * torch.randn(x.shape, device=DEVICE, generator=g)).contiguous(memory_format=torch.channels_last)
        x2 = (x.flip(3) + 0.1 * torch.randn(x.shape, device=DEVICE, generator=g)).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=BF16):
            q = F.normalize(q_enc(x1).float(), dim=1)
            with torch.no_grad():
                torch._foreach_mul_(kp, 0.999)
                torch._foreach_add_(kp, qp, alpha=0.001)
                k = F.normalize(k_enc(x2).float(), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], 1) / 0.07
        _step(F.cross_entropy(logits, torch.zeros(b, dtype=torch.long, device=DEVICE)), opt)
        n = min(b, size - ptr)
        queue[ptr:ptr + n] = k[:n]
        ptr = (ptr + n) % size
    torch.cuda.synchronize()


def cfg_sampler(seed=0):
    """Image generation as a diffusion service does it: requests of random
    batch (1..8) and latent size (32, 48, 64), each sampled in 20..40 DDIM
    steps of a U-Net (bf16 weights under bf16 autocast, no grad) with classifier-free guidance (the
    batch doubled by torch.cat, the two halves combined), then decoded by a
    convolutional decoder that upsamples eight times to pixels (the
    largest activations of the request come at its end)."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        unet = UNet().to(BF16).eval()
        dec = nn.Sequential(
            nn.Conv2d(3, 512, 3, padding=1), nn.SiLU(),
            nn.Upsample(scale_factor=2.0), nn.Conv2d(512, 512, 3, padding=1), nn.SiLU(),
            nn.Upsample(scale_factor=2.0), nn.Conv2d(512, 256, 3, padding=1), nn.SiLU(),
            nn.Upsample(scale_factor=2.0), nn.Conv2d(256, 128, 3, padding=1), nn.SiLU(),
            nn.Conv2d(128, 3, 3, padding=1)).to(BF16).eval()
    rng, g = _rng("cfg_sampler", seed), _gen(seed)
    alphas = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, device=DEVICE), 0)
    with torch.no_grad(), torch.autocast("cuda", dtype=BF16):
        for _ in range(14):
            b, s, steps = rng.randint(1, 8), rng.choice([32, 48, 64]), rng.randint(20, 40)
            x = torch.randn(b, 3, s, s, device=DEVICE, generator=g, dtype=BF16)
            ts = torch.linspace(999, 0, steps, device=DEVICE).long()
            for i, t in enumerate(ts):
                tt = t.repeat(2 * b)
                eps_u, eps_c = unet(torch.cat([x, x]), tt).chunk(2)
                eps = eps_u + 7.5 * (eps_c - eps_u)
                a = alphas[t]
                a_prev = alphas[ts[i + 1]] if i + 1 < steps else torch.ones((), device=DEVICE)
                x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
                x = (a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps).to(BF16)
            dec(x).float().clamp(-1, 1).mean().item()
    torch.cuda.synchronize()


def compiled_lm_varlen(seed=0):
    """torch.compile (Inductor, dynamic shapes) of a 6-layer transformer
    language model's loss (dim 768), trained with AdamW under bf16 autocast
    at random batch (4..32) and length (128..1,024): Triton kernels that
    fuse what eager mode allocates one by one, buffers Inductor plans and
    reuses itself, one compiled graph for every shape."""
    import torch._inductor.config as inductor

    # PyTorch 2.11's tiling heuristic fails an assertion on this graph with
    # dynamic shapes (InductorError in get_pw_red_splits, the first run on
    # the H200); it chooses tilings only, not what is computed or allocated.
    inductor.triton.coalesce_tiling_analysis = False
    torch.manual_seed(seed)
    model = LM(32000, 768, 12, 6).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.compile(model.loss, dynamic=True)
    rng, g = _rng("compiled_lm_varlen", seed), _gen(seed)
    for _ in range(40):
        b, n = _tokens_batch(rng, 128, 1024, 16384, [4, 8, 16, 32])
        x = torch.randint(0, 32000, (b, n + 1), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            loss = loss_fn(x)
        _step(loss, opt)
    torch.cuda.synchronize()


def ctc_asr_varlen(seed=0):
    """Speech recognition trained with CTC: log-mel frames of random length
    (200..1,600, batch 4..32, each utterance of the batch at least half as
    long as the longest), a convolutional subsampler (stride 4), a 6-layer
    transformer encoder (dim 512) with a padding mask, per-frame
    log-probabilities over 257 symbols, F.ctc_loss against random
    transcripts of random length; AdamW under bf16 autocast. Added to the
    fourth holdout in voxel_bev's place, split before its first recording."""
    torch.manual_seed(seed)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = nn.Sequential(nn.Conv1d(80, 512, 3, stride=2, padding=1), nn.GELU(),
                                     nn.Conv1d(512, 512, 3, stride=2, padding=1), nn.GELU())
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.out = nn.Linear(512, 257)

        def forward(self, x, pad):
            return self.out(self.enc(self.sub(x.transpose(1, 2)).transpose(1, 2), src_key_padding_mask=pad))

    model = Encoder().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("ctc_asr_varlen", seed), _gen(seed)
    for _ in range(50):
        b, n = rng.choice([4, 8, 16, 32]), rng.randint(200, 1600)
        lens = [rng.randint(n // 2, n) for _ in range(b)]
        x = torch.randn(b, n, 80, device=DEVICE, generator=g)
        t = (n + 3) // 4
        out_lens = [min(t, (m + 3) // 4) for m in lens]
        pad = torch.arange(t, device=DEVICE)[None, :] >= torch.tensor(out_lens, device=DEVICE)[:, None]
        tgt_lens = [rng.randint(1, m // 2) for m in out_lens]
        targets = torch.randint(1, 257, (sum(tgt_lens),), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            logits = model(x, pad)
        logp = logits.float().log_softmax(-1).transpose(0, 1)
        loss = F.ctc_loss(logp, targets, torch.tensor(out_lens), torch.tensor(tgt_lens), zero_infinity=True)
        _step(loss, opt)
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# The fifth holdout (MANIFEST.md): written and split before their first
# recording.


def _segsum(x):
    """segsum[..., i, j] = x[..., j+1] + ... + x[..., i] for i >= j, and -inf
    above the diagonal: the log decay between two positions of a chunk
    (Mamba-2's state-space duality)."""
    t = x.shape[-1]
    c = x.cumsum(-1)
    s = c[..., :, None] - c[..., None, :]
    keep = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
    return s.masked_fill(~keep, float("-inf"))


def mamba_scan_lm(seed=0):
    """A Mamba-2-style state-space language model written here: each block
    projects to a gate, an input (a causal depthwise conv1d), B, C and a
    step size per head, and runs the selective scan chunk by chunk (the
    state-space duality: decays between positions of a chunk by cumulative
    sums, exp, einsums within chunks, the states carried between chunks by
    another), 12 blocks of dim 768 (24 heads, state 64), AdamW under bf16
    autocast at random lengths 512..4,096 (multiples of 256, batch 1..16
    within 16k tokens) and a random chunk length (64, 128 or 256) each step;
    30 steps."""
    torch.manual_seed(seed)

    def ssd(X, A, B, C, l):
        # X (b, n, h, p); A (b, n, h), log decays; B and C (b, n, h, s)
        b, n, h, p = X.shape
        c = n // l
        X, B, C = X.reshape(b, c, l, h, p), B.reshape(b, c, l, h, -1), C.reshape(b, c, l, h, -1)
        A = A.reshape(b, c, l, h).permute(0, 3, 1, 2)
        acum = A.cumsum(-1)
        y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, torch.exp(_segsum(A)), X)
        decay = torch.exp(acum[..., -1:] - acum)
        states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay, X)
        states = torch.cat([torch.zeros_like(states[:, :1]), states], 1)
        carry = torch.exp(_segsum(F.pad(acum[..., -1], (1, 0))))
        states = torch.einsum("bhzc,bchpn->bzhpn", carry, states)[:, :-1]
        y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(acum))
        return (y_diag + y_off).reshape(b, n, h, p)

    class Mamba2(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            inner, self.state, self.h = 2 * dim, 64, heads
            self.p = inner // heads
            self.ln = nn.LayerNorm(dim)
            self.inp = nn.Linear(dim, 2 * inner + 2 * self.state + heads)
            self.conv = nn.Conv1d(inner, inner, 4, groups=inner, padding=3)
            self.dt_bias = nn.Parameter(torch.zeros(heads))
            self.a_log = nn.Parameter(torch.log(torch.rand(heads) * 15 + 1))
            self.d = nn.Parameter(torch.ones(heads))
            self.out = nn.Linear(inner, dim)
            self.chunk = 128

        def forward(self, x):
            b, n, _ = x.shape
            inner = self.h * self.p
            z, u, bm, cm, dt = self.inp(self.ln(x)).split([inner, inner, self.state, self.state, self.h], -1)
            u = F.silu(self.conv(u.transpose(1, 2))[..., :n].transpose(1, 2))
            dt = F.softplus(dt.float() + self.dt_bias)
            a = -torch.exp(self.a_log.float()) * dt
            uh = u.float().reshape(b, n, self.h, self.p)
            bh = bm.float()[:, :, None, :].expand(b, n, self.h, self.state)
            ch = cm.float()[:, :, None, :].expand(b, n, self.h, self.state)
            y = ssd(uh * dt[..., None], a, bh, ch, self.chunk) + uh * self.d[:, None]
            return x + self.out(y.reshape(b, n, inner).to(x.dtype) * F.silu(z))

    model = LM(32000, 768, 24, 12, block=Mamba2).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("mamba_scan_lm", seed), _gen(seed)
    for _ in range(30):
        b = rng.choice([1, 2, 4, 8, 16])
        n = 256 * rng.randint(2, min(16, 16384 // (256 * b)))
        chunk = rng.choice([64, 128, 256])
        for blk in model.blocks:
            blk.chunk = chunk
        x = torch.randint(0, 32000, (b, n + 1), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            loss = model.loss(x)
        _step(loss, opt)
    torch.cuda.synchronize()


def swin_train(seed=0):
    """A hierarchical vision transformer: torchvision's Swin-T (shifted 7x7
    windows: torch.roll, window partitions and their copies, a relative
    position bias per window, patch merging; random weights) trained with
    AdamW under bf16 autocast at random resolutions (160..384 in steps of
    32; batch at most 64 and 48 images of 256x256 worth of pixels, at least
    half that); 40 steps."""
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.swin_t(weights=None, num_classes=1000).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("swin_train", seed), _gen(seed)
    for _ in range(40):
        r = rng.choice(range(160, 385, 32))
        most = max(1, min(64, 48 * 256 * 256 // (r * r)))
        b = rng.randint(max(1, most // 2), most)
        x = torch.randn(b, 3, r, r, device=DEVICE, generator=g)
        y = torch.randint(0, 1000, (b,), device=DEVICE, generator=g)
        with torch.autocast("cuda", dtype=BF16):
            loss = F.cross_entropy(model(x), y)
        _step(loss, opt)
    torch.cuda.synchronize()


def nerf_rays(seed=0):
    """NeRF-style volume rendering, written here: random batches of rays
    (2,048..12,288), 64 stratified samples each through a positional
    encoding and an 8-layer MLP (width 256, a skip) to density and color,
    alpha compositing by cumprod; then 64 more samples a ray drawn from the
    coarse weights by inverse-CDF sampling (torch.searchsorted, gather),
    merged and sorted, and of those 128 only the ones near a coarse sample
    of above-average weight evaluated (a mask: how many is known only on
    the GPU), scattered back by index_put; MSE of both renders to random
    colors, Adam, bf16 autocast; 60 steps."""
    torch.manual_seed(seed)

    def encode(pt, k):
        f = 2.0 ** torch.arange(k, device=pt.device, dtype=torch.float32) * math.pi
        y = pt[..., None] * f
        return torch.cat([pt, y.sin().flatten(-2), y.cos().flatten(-2)], -1)

    class Field(nn.Module):
        def __init__(self, w=256):
            super().__init__()
            din = 3 + 6 * 10
            self.a = nn.ModuleList([nn.Linear(din, w)] + [nn.Linear(w, w) for _ in range(3)])
            self.b = nn.ModuleList([nn.Linear(w + din, w)] + [nn.Linear(w, w) for _ in range(3)])
            self.sigma = nn.Linear(w, 1)
            self.rgb = nn.Sequential(nn.Linear(w + 3 + 6 * 4, w // 2), nn.ReLU(), nn.Linear(w // 2, 3))

        def forward(self, pts, dirs):
            e = encode(pts, 10)
            h = e
            for lin in self.a:
                h = F.relu(lin(h))
            h = torch.cat([h, e.to(h.dtype)], -1)
            for lin in self.b:
                h = F.relu(lin(h))
            sigma = F.softplus(self.sigma(h).float()).squeeze(-1)
            rgb = torch.sigmoid(self.rgb(torch.cat([h, encode(dirs, 4).to(h.dtype)], -1)).float())
            return sigma, rgb

    def render(sigma, rgb, z):
        delta = torch.cat([z[:, 1:] - z[:, :-1], torch.full_like(z[:, :1], 1e10)], -1)
        alpha = 1 - torch.exp(-sigma * delta)
        trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], -1), -1)[:, :-1]
        w = alpha * trans
        return (w[..., None] * rgb).sum(1), w

    field = Field().to(DEVICE)
    opt = torch.optim.Adam(field.parameters(), lr=5e-4)
    rng, g = _rng("nerf_rays", seed), _gen(seed)
    nc = nf = 64
    for _ in range(60):
        r = rng.choice([2048, 4096, 8192, 12288])
        o = torch.randn(r, 3, device=DEVICE, generator=g)
        d = F.normalize(torch.randn(r, 3, device=DEVICE, generator=g), dim=-1)
        target = torch.rand(r, 3, device=DEVICE, generator=g)
        t = (torch.arange(nc, device=DEVICE) + torch.rand(r, nc, device=DEVICE, generator=g)) / nc
        z = 2.0 + 4.0 * t
        with torch.autocast("cuda", dtype=BF16):
            pts = o[:, None] + d[:, None] * z[..., None]
            sigma, rgb = field(pts, d[:, None].expand(r, nc, 3))
            color_c, w = render(sigma, rgb, z)
            # inverse-CDF samples from the coarse weights
            pdf = w.detach() + 1e-5
            cdf = torch.cat([torch.zeros_like(pdf[:, :1]), (pdf / pdf.sum(-1, keepdim=True)).cumsum(-1)], -1)
            u = torch.rand(r, nf, device=DEVICE, generator=g).contiguous()
            idx = torch.searchsorted(cdf.contiguous(), u, right=True)
            lo, hi = (idx - 1).clamp(0, nc), idx.clamp(0, nc)
            zb = torch.cat([z, z[:, -1:] + 4.0 / nc], -1)
            c0, c1 = cdf.gather(1, lo), cdf.gather(1, hi)
            frac = ((u - c0) / (c1 - c0).clamp_min(1e-6)).clamp(0, 1)
            zf = zb.gather(1, lo) + frac * (zb.gather(1, hi) - zb.gather(1, lo))
            zall, _ = torch.sort(torch.cat([z, zf], -1), -1)
            near = torch.searchsorted(z.contiguous(), zall.contiguous()).clamp(max=nc - 1)
            wn = w.detach().gather(1, near)
            keep = wn > wn.mean(-1, keepdim=True)
            ri, ci = keep.nonzero(as_tuple=True)
            pa = o[ri] + d[ri] * zall[ri, ci][:, None]
            s_k, c_k = field(pa, d[ri])
            sig = torch.zeros(r, 2 * nc, device=DEVICE).index_put((ri, ci), s_k)
            col = torch.zeros(r, 2 * nc, 3, device=DEVICE).index_put((ri, ci), c_k)
            color_f, _ = render(sig, col, zall)
            loss = F.mse_loss(color_c, target) + F.mse_loss(color_f, target)
        _step(loss, opt)
    torch.cuda.synchronize()


def save_on_cpu_train(seed=0):
    """Training with activations offloaded to the host: a 16-layer
    transformer (dim 1,024) whose tensors saved for backward go to pinned
    host memory as the forward pass makes them and come back as the
    backward pass needs them (torch.autograd.graph.save_on_cpu with
    pin_memory: a device-to-host copy per saved tensor, the device tensor
    dropped, a host-to-device copy in backward), AdamW under bf16 autocast
    at random lengths 512..2,048 (batch 1..16 within 8k tokens); 20 steps."""
    torch.manual_seed(seed)
    model = LM(32000, 1024, 16, 16).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("save_on_cpu_train", seed), _gen(seed)
    for _ in range(20):
        b, n = _tokens_batch(rng, 512, 2048, 8192, [1, 2, 4, 8, 16])
        x = torch.randint(0, 32000, (b, n + 1), device=DEVICE, generator=g)
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            with torch.autocast("cuda", dtype=BF16):
                loss = model.loss(x)
        _step(loss, opt)
    torch.cuda.synchronize()


def dpsgd_per_sample(seed=0):
    """Differentially private training as Opacus does it, written with
    torch.func: per-sample gradients of a small CNN (functional_call under
    vmap(grad): a batch x parameters gradient, about 0.5M parameters each),
    every example's gradient clipped to norm 1, summed, Gaussian noise
    added, a plain SGD step on new parameter tensors; batches of
    64..1,024 random 32x32 images; 40 steps."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.GroupNorm(8, 128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.GroupNorm(8, 256), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(DEVICE)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(prm, x, y):
        return F.cross_entropy(functional_call(model, prm, (x[None],)), y[None])

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
    rng, g = _rng("dpsgd_per_sample", seed), _gen(seed)
    for _ in range(40):
        b = rng.choice([64, 128, 256, 512, 1024])
        x = torch.randn(b, 3, 32, 32, device=DEVICE, generator=g)
        y = torch.randint(0, 10, (b,), device=DEVICE, generator=g)
        gs = per_sample(params, x, y)
        norms = torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in gs.values()))
        scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
        for k, v in gs.items():
            noisy = (v * scale.view(-1, *[1] * (v.dim() - 1))).sum(0)
            noisy = noisy + torch.randn(noisy.shape, device=DEVICE, generator=g)
            params[k] = params[k] - 0.1 * noisy / b
        del gs
    torch.cuda.synchronize()


def rnnt_asr(seed=0):
    """Speech recognition with a transducer, written here: a convolutional
    subsampler (stride 4) and a 6-layer transformer encoder (dim 512) over
    log-mel frames of random length, an LSTM prediction network over the
    transcript, the joint network over every (frame, label) pair (batch x
    frames x labels x 320, then logits over 256 symbols, log-softmaxed), and
    the RNN-T loss by its forward recursion over frames (a logcumsumexp over
    labels a frame, autograd through every frame's); utterances of
    400..1,600 frames (batch 2..16 within 12,800 frames), transcripts of
    10..80 symbols; AdamW in float32; 30 steps."""
    torch.manual_seed(seed)
    vocab = 256

    class Transducer(nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = nn.Sequential(nn.Conv1d(80, 512, 3, stride=2, padding=1), nn.GELU(),
                                     nn.Conv1d(512, 512, 3, stride=2, padding=1), nn.GELU())
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.embed = nn.Embedding(vocab, 320)
            self.pred = nn.LSTM(320, 512, batch_first=True)
            self.je, self.jp, self.jo = nn.Linear(512, 320), nn.Linear(512, 320), nn.Linear(320, vocab)

        def forward(self, x, labels):
            e = self.enc(self.sub(x.transpose(1, 2)).transpose(1, 2))
            p, _ = self.pred(self.embed(F.pad(labels, (1, 0))))
            j = torch.tanh(self.je(e)[:, :, None] + self.jp(p)[:, None])
            return self.jo(j).log_softmax(-1)

    def loss_fn(lp, labels, t_lens, u_lens):
        b, t_max, u1, _ = lp.shape
        blank = lp[..., 0]
        emit = lp[:, :, :-1].gather(-1, labels[:, None, :, None].expand(b, t_max, u1 - 1, 1)).squeeze(-1)
        alphas, prev = [], None
        for t in range(t_max):
            e = torch.cat([torch.zeros_like(emit[:, t, :1]), emit[:, t].cumsum(-1)], -1)
            a = e if prev is None else e + torch.logcumsumexp(prev + blank[:, t - 1] - e, -1)
            alphas.append(a)
            prev = a
        alpha = torch.stack(alphas, 1)
        bi = torch.arange(b, device=lp.device)
        ll = alpha[bi, t_lens - 1, u_lens] + blank[bi, t_lens - 1, u_lens]
        return -(ll / u_lens).mean()

    model = Transducer().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng, g = _rng("rnnt_asr", seed), _gen(seed)
    for _ in range(30):
        n = rng.randint(400, 1600)
        fit = [c for c in [2, 4, 8, 16] if c * n <= 12800] or [2]
        b = rng.choice(fit)
        lens = [rng.randint(n // 2, n) for _ in range(b)]
        lens[0] = n
        u_lens = [rng.randint(10, 80) for _ in range(b)]
        x = torch.randn(b, n, 80, device=DEVICE, generator=g)
        labels = torch.randint(1, vocab, (b, max(u_lens)), device=DEVICE, generator=g)
        t_lens = torch.tensor([(m + 3) // 4 for m in lens], device=DEVICE)
        lp = model(x, labels)
        loss = loss_fn(lp, labels, t_lens, torch.tensor(u_lens, device=DEVICE))
        _step(loss, opt)
    torch.cuda.synchronize()


# name: (function, split, what it exercises). Chosen before any recording;
# MANIFEST.md gives the rule. The order is the recording order: the fourteen
# kinds the issue asks for first (8 tune, 6 holdout), then six for breadth,
# so that a run cut short by its time budget loses breadth first.
PROGRAMS = {
    "llama_train_varlen": (llama_train_varlen, "tune", "LLaMA-style training, variable lengths"),
    "infer_server": (infer_server, "tune", "two models on two streams, mixed batches, growing KV cache"),
    "t5_beam_search": (t5_beam_search, "tune", "beam-search decoding"),
    "moe_top2_train": (moe_top2_train, "holdout", "mixture of experts, top-2 routing"),
    "ckpt_grad_accum": (ckpt_grad_accum, "tune", "activation checkpointing + gradient accumulation"),
    "fp16_gradscaler_bert": (fp16_gradscaler_bert, "holdout", "fp16 mixed precision with GradScaler"),
    "diffusion_unet": (diffusion_unet, "tune", "diffusion U-Net training, random resolutions"),
    "vit_train": (vit_train, "holdout", "ViT training"),
    "prefetch_two_stream": (prefetch_two_stream, "tune", "side-stream prefetch from pinned memory"),
    "comm_buckets": (comm_buckets, "tune", "gradient buckets all-reduced on a comm stream"),
    "dataloader_pinned": (dataloader_pinned, "holdout", "DataLoader workers, pin_memory, non_blocking"),
    "model_sweep": (model_sweep, "tune", "build/train/delete models of varying architecture"),
    "ddp_world1": (ddp_world1, "holdout", "DistributedDataParallel, NCCL, world size 1"),
    "paged_kv_server": (paged_kv_server, "tune", "paged preallocated KV cache, continuous batching"),
    "fcn_segmentation": (fcn_segmentation, "tune", "segmentation CNN at random sizes"),
    "whisper_train": (whisper_train, "holdout", "audio encoder-decoder training"),
    "gnn_random_graphs": (gnn_random_graphs, "tune", "GNN on random graphs, scatter/gather"),
    "lora_finetune": (lora_finetune, "holdout", "LoRA adapters on a frozen bf16 model"),
    "clip_contrastive": (clip_contrastive, "tune", "contrastive two-tower training"),
    "maskrcnn_train": (maskrcnn_train, "tune", "detection with variable images and targets"),
    # The second holdout (see above).
    "gan_dcgan": (gan_dcgan, "holdout", "adversarial training, two models and optimizers alternating"),
    "spec_decode": (spec_decode, "tune", "speculative decoding, two KV caches grown and cut back"),
    "lstm_lm_varlen": (lstm_lm_varlen, "holdout", "cuDNN LSTM, truncated BPTT at random lengths"),
    "bart_train_generate": (bart_train_generate, "holdout", "encoder-decoder training with generate() inside"),
    "ppo_rollouts": (ppo_rollouts, "holdout", "RL rollouts kept in lists, GAE, shuffled minibatches"),
    "dlrm_sparse": (dlrm_sparse, "holdout", "embedding bags with sparse gradients, SparseAdam"),
    # The third holdout (2026-11-24, later session): six more, written and
    # split before their first recording (MANIFEST.md).
    "video_conv3d": (video_conv3d, "holdout", "3-D convolutions on clips of random length and size"),
    "knn_retrieval": (knn_retrieval, "holdout", "a vector database grown by cat, compacted, queried in shards"),
    "streaming_kv": (streaming_kv, "tune", "attention-sink KV caches rebuilt each step past a window"),
    "layer_offload": (layer_offload, "holdout", "weights streamed from pinned host memory on a side stream"),
    "pointnet_varpts": (pointnet_varpts, "holdout", "point clouds of random size, cdist/topk/gather"),
    "train_eval_mix": (train_eval_mix, "holdout", "training with no_grad evaluation and host checkpoints between"),
    # Two more (later that session), in place of streaming_kv and
    # infer_server, which moved to tune (MANIFEST.md).
    "chat_small_lm": (chat_small_lm, "holdout", "a small chat model, one KV cache kept across a conversation's turns"),
    "vision_infer_mixed": (vision_infer_mixed, "holdout", "two small vision models serving mixed batches and sizes"),
    # The fourth holdout (2026-11-29, fifth session): six more, written and
    # split before their first recording (MANIFEST.md); voxel_bev moved to
    # tune after its report.
    "hyena_fft_lm": (hyena_fft_lm, "holdout", "long convolutions by FFT (cuFFT plans and workspaces) at random lengths"),
    "shampoo_mlp": (shampoo_mlp, "holdout", "a Shampoo-style optimizer: statistics and torch.linalg.eigh roots"),
    "voxel_bev": (voxel_bev, "tune", "point clouds voxelized by unique/masks (data-dependent sizes) into a dense canvas"),
    "moco_queue": (moco_queue, "holdout", "momentum encoder updated by foreach ops, a key queue written in place"),
    "cfg_sampler": (cfg_sampler, "holdout", "diffusion sampling with classifier-free guidance, then an 8x decoder"),
    "compiled_lm_varlen": (compiled_lm_varlen, "holdout", "torch.compile with dynamic shapes, training at random lengths"),
    # In voxel_bev's place (MANIFEST.md), split before its first recording.
    "ctc_asr_varlen": (ctc_asr_varlen, "holdout", "CTC loss over padded variable-length utterances, a transformer encoder"),
    # The fifth holdout (MANIFEST.md), split before their first recording.
    "mamba_scan_lm": (mamba_scan_lm, "holdout", "a Mamba-2-style selective scan by chunks (cumsum, exp, einsums) at random lengths and chunks"),
    "swin_train": (swin_train, "holdout", "torchvision Swin-T: shifted windows (roll, partition copies) at random resolutions"),
    "nerf_rays": (nerf_rays, "holdout", "NeRF rays: cumprod compositing, searchsorted resampling, a mask of samples (sizes known on the GPU) scattered back"),
    "save_on_cpu_train": (save_on_cpu_train, "holdout", "activations saved to pinned host memory in forward and brought back in backward (save_on_cpu)"),
    "dpsgd_per_sample": (dpsgd_per_sample, "holdout", "per-sample gradients by torch.func vmap(grad), clipped and noised, parameters made anew each step"),
    "rnnt_asr": (rnnt_asr, "holdout", "a transducer: a batch x frames x labels joint tensor and a loss recursion over frames"),
}
