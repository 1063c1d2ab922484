"""The real training programs behind testdata/traces, and a two-stream one.

Each program is a function program(steps, log) that builds its model from a
published configuration with random weights (nothing is downloaded), runs
its steps, and calls log(loss) once per step, after the step's work has
been issued; run.py times the steps and watches memory. Inputs come from a
generator seeded per program, so every allocator sees the same sequence of
shapes and, up to the GPU's own nondeterminism, computes the same losses.

The programs (see testdata/traces/README.md for the recorded runs;
beam_search_decode and infer_server have no trace there):

    gpt2_train_varlen    GPT-2 small training, AdamW, bf16 autocast, batch 8,
                         sequence length random in 64..1024
    bert_mlm_varlen      BERT-base masked-LM training, AdamW, bf16, batch
                         8/16/32, length random in 32..512
    t5_train_varlen      T5-small-sized training, source 32..512 and target
                         8..128 tokens
    resnet50_train       ResNet-50 training, SGD, bf16, batch 64 at 224x224
    gpt2_generate        GPT-2 small sampling 96 new tokens for random batches
                         (1..16) and prompts (16..256)
    beam_search_decode   T5-small-sized beam search (4, 6 or 8 beams), 64 new
                         tokens for random batches (1..8) of prompts of random
                         lengths (16..256, padded to the longest)
    infer_server         a two-model inference server under inference_mode:
                         each step 2..4 requests to a BERT-base classifier
                         (batch 1..32, length 16..512) and 2..3 to a GPT-2
                         small decoding greedily (batch 1..8, prompt 16..256,
                         16..48 new tokens), bf16, in random order
    sweep_create_dispose an MLP of random width and depth built on the GPU,
                         trained 5 steps and dropped, over and over
    two_stream           a side stream makes each batch (random tokens,
                         embedding, normalization) while the main stream trains
                         on the previous one; record_stream hands each batch over
"""

import gc
import random

import torch

DEVICE = "cuda"
BF16 = torch.bfloat16


def _rng(name):
    return random.Random(name)


def _optimize(loss, opt, log):
    """The end of every training step: backward, update, clear, log."""
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    log(loss)


def gpt2_train_varlen(steps, log, seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config()).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = _rng("gpt2_train_varlen")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        n = rng.randint(64, 1024)
        x = torch.randint(0, 50257, (8, n), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(x, labels=x).loss
        _optimize(loss, opt, log)
    return model, opt


def bert_mlm_varlen(steps, log, seed=0):
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig()).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = _rng("bert_mlm_varlen")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        b, n = rng.choice([8, 16, 32]), rng.randint(32, 512)
        x = torch.randint(1000, 30000, (b, n), device=DEVICE, generator=g)
        labels = torch.full_like(x, -100)
        mask = torch.rand(x.shape, device=DEVICE, generator=g) < 0.15
        labels[mask] = x[mask]
        x = x.masked_fill(mask, 103)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_ids=x, labels=labels).loss
        _optimize(loss, opt, log)
    return model, opt


def t5_train_varlen(steps, log, seed=0):
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(seed)
    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                   vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = _rng("t5_train_varlen")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        src, tgt = rng.randint(32, 512), rng.randint(8, 128)
        x = torch.randint(1, 32000, (16, src), device=DEVICE, generator=g)
        y = torch.randint(1, 32000, (16, tgt), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = model(input_ids=x, labels=y).loss
        _optimize(loss, opt, log)
    return model, opt


def resnet50_train(steps, log, seed=0):
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.resnet50().to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(64, 3, 224, 224, device=DEVICE, generator=g)
        y = torch.randint(0, 1000, (64,), device=DEVICE, generator=g)
        with torch.autocast(DEVICE, dtype=BF16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        _optimize(loss, opt, log)
    return model, opt


def gpt2_generate(steps, log, seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config()).to(DEVICE).eval()
    rng = _rng("gpt2_generate")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        b, n = rng.randint(1, 16), rng.randint(16, 256)
        x = torch.randint(0, 50257, (b, n), device=DEVICE, generator=g)
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=96, min_new_tokens=96,
                                 do_sample=True, top_k=50, pad_token_id=0)
        # The "loss" of a generation round: the mean token id, a checksum.
        log(out.float().mean())
    return model, None


def beam_search_decode(steps, log, seed=0):
    """Beam search with an encoder-decoder: every new token reorders each
    layer's key/value cache across the beams, so a step makes many small,
    short-lived requests of a few recurring sizes."""
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(seed)
    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                   vocab_size=32128, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg).to(DEVICE).eval()
    rng = _rng("beam_search_decode")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        b, beams = rng.randint(1, 8), rng.choice([4, 6, 8])
        lens = [rng.randint(16, 256) for _ in range(b)]
        x = torch.randint(2, 32000, (b, max(lens)), device=DEVICE, generator=g)
        mask = (torch.arange(max(lens), device=DEVICE)[None, :] <
                torch.tensor(lens, device=DEVICE)[:, None]).long()
        x = x * mask  # right padding with pad_token_id 0
        with torch.no_grad():
            out = model.generate(input_ids=x, attention_mask=mask, num_beams=beams, do_sample=False,
                                 max_new_tokens=64, min_new_tokens=64, decoder_start_token_id=0,
                                 pad_token_id=0, eos_token_id=1)
        # A checksum of the chosen sequences, as in gpt2_generate.
        log(out.float().mean())
    return model, None


def infer_server(steps, log, seed=0):
    """Two models served from one process: a stream of requests of random
    batch and length, in random order, to a classifier (one forward) and a
    generator (a key/value cache growing token by token).

    cuDNN's attention is left out of scaled_dot_product_attention: in bf16
    on Hopper PyTorch picks it first, and it builds a plan for every new
    key length, once per generated token here. On an H200 (PyTorch 2.11)
    that made a generation call 5 times slower (859 against 167 ms for 32
    tokens) and the median step 10 times (4-5 s against 0.45 s), time
    that has nothing to do with memory."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    bert = BertForSequenceClassification(BertConfig(num_labels=4)).to(DEVICE, BF16).eval()
    gpt = GPT2LMHeadModel(GPT2Config()).to(DEVICE, BF16).eval()
    rng = _rng("infer_server")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with torch.inference_mode(), sdpa_kernel(backends):
        for _ in range(steps):
            requests = ["cls"] * rng.randint(2, 4) + ["gen"] * rng.randint(2, 3)
            rng.shuffle(requests)
            answers = []
            for kind in requests:
                if kind == "cls":
                    b, n = rng.randint(1, 32), rng.randint(16, 512)
                    x = torch.randint(1000, 30000, (b, n), device=DEVICE, generator=g)
                    logits = bert(input_ids=x, attention_mask=torch.ones_like(x)).logits
                    answers.append(logits.float().abs().mean())
                else:
                    b, n, new = rng.randint(1, 8), rng.randint(16, 256), rng.randint(16, 48)
                    x = torch.randint(0, 50257, (b, n), device=DEVICE, generator=g)
                    out = gpt.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                       min_new_tokens=new, do_sample=False, pad_token_id=0)
                    answers.append(out[:, n:].float().mean() / 50257)
            # The "loss" of a round: each answer's checksum, of like scale, summed.
            log(torch.stack(answers).sum())
    return (bert, gpt), None


def sweep_create_dispose(steps, log, seed=0):
    torch.manual_seed(seed)
    rng = _rng("sweep_create_dispose")
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    model = opt = None
    for _ in range(steps):
        width, depth = rng.choice([2048, 3072, 4096, 6144, 8192]), rng.randint(2, 8)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width, device=DEVICE), torch.nn.GELU()]
        # Built on the GPU: on the CPU, initializing the weights takes most
        # of a step and makes its time as noisy as the host's CPU.
        model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10, device=DEVICE))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        for _ in range(5):
            x = torch.randn(512, width, device=DEVICE, generator=g)
            y = torch.randint(0, 10, (512,), device=DEVICE, generator=g)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        log(loss)
        del model, opt, x, y, loss, layers
        gc.collect()
        model = opt = None
    return None, None


def two_stream(steps, log, seed=0):
    """Batches made on a side stream, consumed on the main stream: the side
    stream's tensors are handed over with record_stream, so the allocator
    must not give their memory to the side stream's next batch while the
    main stream still reads it."""
    torch.manual_seed(seed)
    dim, vocab = 2048, 32000
    embed = torch.nn.Embedding(vocab, dim).to(DEVICE)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * dim, dim)) for _ in range(6)],
                                torch.nn.Linear(dim, vocab)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    rng = _rng("two_stream")
    g = torch.Generator(device=DEVICE).manual_seed(seed)

    def make_batch():
        n = rng.randint(256, 2048)
        with torch.cuda.stream(side):
            tokens = torch.randint(0, vocab, (8, n), device=DEVICE, generator=g)
            with torch.no_grad():
                x = torch.nn.functional.layer_norm(embed(tokens), (dim,))
            ev = side.record_event()
        return tokens, x, ev

    nxt = make_batch()
    for _ in range(steps):
        tokens, x, ev = nxt
        main.wait_event(ev)
        x.record_stream(main)
        tokens.record_stream(main)
        nxt = make_batch()  # the side stream works on the next batch meanwhile
        with torch.autocast(DEVICE, dtype=BF16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del tokens, x, logits  # after the step, as measured
        log(loss)
    return model, opt


PROGRAMS = {
    "gpt2_train_varlen": (gpt2_train_varlen, 30),
    "bert_mlm_varlen": (bert_mlm_varlen, 30),
    "t5_train_varlen": (t5_train_varlen, 30),
    "resnet50_train": (resnet50_train, 20),
    "gpt2_generate": (gpt2_generate, 8),
    "beam_search_decode": (beam_search_decode, 10),
    "infer_server": (infer_server, 10),
    "sweep_create_dispose": (sweep_create_dispose, 12),
    "two_stream": (two_stream, 40),
}
