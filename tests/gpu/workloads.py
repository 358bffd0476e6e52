"""Workloads written in plain PyTorch (or torchvision constructors) whose shapes vary from step to
step, as real jobs' do: shared by collect_traces.py (traces, PyTorch's figures) and
torch_memory.py (live memory under each allocator).

Each runner is run(torch, rt): rt (Runtime) names the device and the size (tiny: small
dimensions and 2 steps, to test the code on a CPU), times each step and records its loss.
Weights and data are random, with fixed seeds; nothing is downloaded. Works with PyTorch 1.13
and 2.x: scaled_dot_product_attention where it exists, else the same attention written out.
"""
import math
import os
import time

# Schedules. Full size on the GPU; the tiny ones keep each code path (varied shapes, grouped
# KV heads, autocast, cache growth) at dimensions a CPU runs in seconds.
LLAMA = dict(vocab=32000, dim=2048, layers=8, heads=16, kv_heads=4, ffn=5632)
LLAMA_TINY = dict(vocab=256, dim=64, layers=2, heads=4, kv_heads=2, ffn=160)
# (batch, sequence): tokens per step between 2048 and 8192.
LLAMA_TRAIN_STEPS = ((8, 512), (2, 2048), (24, 256), (6, 1024), (1, 2048), (16, 512), (4, 2048),
                     (12, 256), (5, 1024), (3, 2048))
LLAMA_TRAIN_TINY = ((2, 16), (1, 32))
# (batch, prompt length, tokens generated): one prefill, then decode steps.
LLAMA_SERVE_REQUESTS = ((1, 2048, 16), (32, 128, 16), (8, 512, 8), (16, 1024, 12), (4, 2048, 8),
                        (64, 64, 16), (2, 1536, 16), (24, 384, 8), (32, 2048, 4), (12, 768, 12),
                        (48, 256, 8), (1, 128, 16), (8, 1024, 16), (16, 2048, 8), (96, 32, 16),
                        (3, 1792, 12), (40, 512, 8), (6, 640, 16), (128, 16, 16), (20, 1024, 4))
LLAMA_SERVE_TINY = ((2, 12, 3), (1, 20, 2))
# (batch, resolution)
CONVNEXT_STEPS = ((64, 224), (128, 160), (32, 288), (96, 192), (48, 256), (128, 224), (80, 176),
                  (24, 320))
CONVNEXT_TINY = ((2, 32), (3, 48))
UNET = dict(ch=128, mults=(1, 2, 2, 4), attn_levels=(2, 3), nres=2, groups=32, heads=4)
UNET_TINY = dict(ch=16, mults=(1, 2), attn_levels=(1,), nres=1, groups=4, heads=2)
UNET_STEPS = ((32, 64), (16, 128), (24, 96), (48, 64), (8, 128), (32, 96), (12, 128), (64, 64))
UNET_TINY_STEPS = ((2, 16), (1, 24))
GRU = dict(vocab=48000, emb=512, hidden=1024, layers=2)
GRU_TINY = dict(vocab=64, emb=16, hidden=32, layers=2)
# (batch, source length, target length)
GRU_STEPS = ((128, 40, 36), (256, 20, 24), (64, 80, 72), (192, 50, 44), (96, 64, 60),
             (256, 32, 30), (32, 100, 90), (160, 45, 50))
GRU_TINY_STEPS = ((3, 7, 5), (2, 9, 6))


def _pairs(steps):
    return ",".join("(%s)" % ",".join(str(v) for v in s) for s in steps)


_LLAMA_DESC = ("Llama-style decoder in plain PyTorch (%d layers, dim %d, %d heads, %d KV heads, "
               "SwiGLU %d, vocabulary %d, RMSNorm, rotary embeddings, "
               "scaled_dot_product_attention)" % (LLAMA["layers"], LLAMA["dim"], LLAMA["heads"],
                                                  LLAMA["kv_heads"], LLAMA["ffn"], LLAMA["vocab"]))

# name -> (kind, description): the descriptions state the schedules exactly (docs/fragmentation.md's
# table is generated from them).
NEW_WORKLOADS = {
    "llama-train": ("training", _LLAMA_DESC + ", AdamW, bf16 autocast, %d steps, (batch, sequence) %s"
                    % (len(LLAMA_TRAIN_STEPS), _pairs(LLAMA_TRAIN_STEPS))),
    "convnext-train": ("training",
                       "torchvision convnext_tiny (average pool as a mean), AdamW, bf16 autocast, "
                       "%d steps, (batch, resolution) %s" % (len(CONVNEXT_STEPS), _pairs(CONVNEXT_STEPS))),
    "unet-train": ("training",
                   "diffusion UNet in plain PyTorch (channels %d x %s, %d ResBlocks per level with "
                   "GroupNorm and timestep embedding, self-attention at the two lowest levels, "
                   "strided-conv down and nearest-neighbour up sampling, skip connections), "
                   "noise-prediction MSE, AdamW, bf16 autocast, %d steps, (batch, resolution) %s"
                   % (UNET["ch"], "/".join(str(m) for m in UNET["mults"]), UNET["nres"],
                      len(UNET_STEPS), _pairs(UNET_STEPS))),
    "gru-seq2seq-train": ("training",
                          "GRU encoder-decoder (embedding %d, %d-layer GRUs of %d, Luong attention "
                          "with input feeding, vocabulary %d, one decoder call per target token, "
                          "teacher forcing), AdamW, fp32, %d steps, (batch, source, target length) %s"
                          % (GRU["emb"], GRU["layers"], GRU["hidden"], GRU["vocab"],
                             len(GRU_STEPS), _pairs(GRU_STEPS))),
    "llama-serve": ("inference",
                    "the llama-train model (%d layers, dim %d, %d/%d heads) in eval, bf16 weights, "
                    "torch.no_grad, %d requests one after another, each a prefill (logits of every "
                    "position) then greedy decode steps with a KV cache grown by torch.cat, "
                    "(batch, prompt, generated tokens) %s"
                    % (LLAMA["layers"], LLAMA["dim"], LLAMA["heads"], LLAMA["kv_heads"],
                       len(LLAMA_SERVE_REQUESTS), _pairs(LLAMA_SERVE_REQUESTS))),
}


def prepare(torch, device):
    """Seeds and deterministic kernels, so that losses compare bit for bit across allocators.
    CUBLAS_WORKSPACE_CONFIG must be in the environment before the first cuBLAS call."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


class Runtime:
    """Where and how big a workload runs, and what each step gave.

    for shape in rt.steps(schedule): ...; rt.done(loss) -- done() synchronizes, so the step
    time covers the device's work, and calls on_step(index, loss, seconds) if given."""

    def __init__(self, torch, device="cuda", tiny=False, on_step=None):
        self.torch, self.device, self.tiny, self.on_step = torch, device, tiny, on_step
        self.losses, self.step_s = [], []
        self._t0 = None

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def steps(self, schedule):
        for item in schedule:
            self.sync()
            self._t0 = time.perf_counter()
            yield item

    def done(self, value):
        v = float(value.item())
        self.sync()
        dt = time.perf_counter() - self._t0
        self.losses.append(v)
        self.step_s.append(dt)
        if self.on_step is not None:
            self.on_step(len(self.losses) - 1, v, dt)

    def autocast(self, dtype):
        enabled = self.device != "cpu" or _cpu_autocast_works(self.torch)
        return self.torch.autocast(device_type=self.device, dtype=dtype, enabled=enabled)


def _cpu_autocast_works(torch):
    """Whether CPU autocast runs the norms on a bf16 input with fp32 weights (PyTorch 1.13's
    does not; there the CPU check runs the same code in fp32)."""
    if not hasattr(_cpu_autocast_works, "ok"):
        F = torch.nn.functional
        try:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                x = F.conv2d(torch.ones(1, 4, 2, 2), torch.ones(4, 4, 1, 1))
                F.group_norm(x, 2, torch.ones(4), torch.zeros(4))
                F.layer_norm(x.permute(0, 2, 3, 1), (4,), torch.ones(4), torch.zeros(4))
            _cpu_autocast_works.ok = True
        except RuntimeError:
            _cpu_autocast_works.ok = False
    return _cpu_autocast_works.ok


# --- shared pieces

def attend(torch, q, k, v, causal):
    """Attention over (batch, heads, length, head_dim). causal only where q and k have the same
    length (a prefill or a training step)."""
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s.float(), dim=-1).to(v.dtype), v)


def _modules(torch):
    """The model classes, defined once torch is imported (the orchestrating processes never
    import it)."""
    if hasattr(_modules, "cache"):
        return _modules.cache
    nn = torch.nn
    F = torch.nn.functional

    class MeanPool(nn.Module):
        """AdaptiveAvgPool2d(1) as a mean: the same values, and a backward with a deterministic
        kernel (adaptive_avg_pool2d_backward_cuda has none)."""

        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    # Llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.
    class RMSNorm(nn.Module):
        def __init__(self, dim, device, dtype, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * xf.to(x.dtype)

    def rope(seq, head_dim, offset, device):
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                                 / head_dim))
        t = torch.arange(offset, offset + seq, device=device, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def apply_rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)

    def repeat_kv(x, n):
        b, h, s, d = x.shape
        return x if n == 1 else x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)

    class Attention(nn.Module):
        def __init__(self, c, device, dtype):
            super().__init__()
            self.h, self.kv, self.hd = c["heads"], c["kv_heads"], c["dim"] // c["heads"]
            kw = dict(bias=False, device=device, dtype=dtype)
            self.wq = nn.Linear(c["dim"], self.h * self.hd, **kw)
            self.wk = nn.Linear(c["dim"], self.kv * self.hd, **kw)
            self.wv = nn.Linear(c["dim"], self.kv * self.hd, **kw)
            self.wo = nn.Linear(self.h * self.hd, c["dim"], **kw)

        def forward(self, x, cos, sin, cache):
            b, s, _ = x.shape
            q = self.wq(x).view(b, s, self.h, self.hd).transpose(1, 2)
            k = self.wk(x).view(b, s, self.kv, self.hd).transpose(1, 2)
            v = self.wv(x).view(b, s, self.kv, self.hd).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if cache is not None:
                # The cache grows by concatenation, as simple servers grow it: a new, longer
                # block every decode step.
                if cache[0] is not None:
                    k = torch.cat((cache[0], k), dim=2)
                    v = torch.cat((cache[1], v), dim=2)
                cache[0], cache[1] = k, v
            n = self.h // self.kv
            out = attend(torch, q, repeat_kv(k, n), repeat_kv(v, n), causal=s > 1 and s == k.shape[2])
            return self.wo(out.transpose(1, 2).reshape(b, s, self.h * self.hd))

    class Block(nn.Module):
        def __init__(self, c, device, dtype):
            super().__init__()
            kw = dict(bias=False, device=device, dtype=dtype)
            self.norm1 = RMSNorm(c["dim"], device, dtype)
            self.attn = Attention(c, device, dtype)
            self.norm2 = RMSNorm(c["dim"], device, dtype)
            self.w1 = nn.Linear(c["dim"], c["ffn"], **kw)
            self.w3 = nn.Linear(c["dim"], c["ffn"], **kw)
            self.w2 = nn.Linear(c["ffn"], c["dim"], **kw)

        def forward(self, x, cos, sin, cache):
            h = x + self.attn(self.norm1(x), cos, sin, cache)
            n = self.norm2(h)
            return h + self.w2(F.silu(self.w1(n)) * self.w3(n))

    class Llama(nn.Module):
        def __init__(self, c, device, dtype=torch.float32):
            super().__init__()
            self.hd = c["dim"] // c["heads"]
            self.emb = nn.Embedding(c["vocab"], c["dim"], device=device, dtype=dtype)
            self.blocks = nn.ModuleList([Block(c, device, dtype) for _ in range(c["layers"])])
            self.norm = RMSNorm(c["dim"], device, dtype)
            self.head = nn.Linear(c["dim"], c["vocab"], bias=False, device=device, dtype=dtype)

        def forward(self, ids, caches=None, pos=0):
            x = self.emb(ids)
            cos, sin = rope(ids.shape[1], self.hd, pos, ids.device)
            for i, blk in enumerate(self.blocks):
                x = blk(x, cos, sin, None if caches is None else caches[i])
            return self.head(self.norm(x))

    # Diffusion UNet: ResBlocks with GroupNorm and a timestep embedding, attention at low
    # resolution, strided-conv down and nearest-neighbour up sampling, skip connections.
    class ResBlock(nn.Module):
        def __init__(self, cin, cout, temb, groups):
            super().__init__()
            self.n1 = nn.GroupNorm(groups, cin)
            self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(temb, cout)
            self.n2 = nn.GroupNorm(groups, cout)
            self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, t):
            h = self.c1(F.silu(self.n1(x)))
            h = h + self.t(F.silu(t))[:, :, None, None]
            h = self.c2(F.silu(self.n2(h)))
            return self.skip(x) + h

    class AttnBlock(nn.Module):
        def __init__(self, ch, groups, heads):
            super().__init__()
            self.heads = heads
            self.norm = nn.GroupNorm(groups, ch)
            self.qkv = nn.Conv2d(ch, 3 * ch, 1)
            self.proj = nn.Conv2d(ch, ch, 1)

        def forward(self, x):
            b, c, hh, ww = x.shape
            # Tokens first, then heads: q, k and v end with a contiguous head dimension, which
            # the fused attention kernels need (else scaled_dot_product_attention falls back).
            qkv = self.qkv(self.norm(x)).reshape(b, 3 * c, hh * ww).transpose(1, 2)
            qkv = qkv.reshape(b, hh * ww, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            out = attend(torch, qkv[0], qkv[1], qkv[2], causal=False)
            out = out.transpose(1, 2).reshape(b, hh * ww, c).transpose(1, 2)
            return x + self.proj(out.reshape(b, c, hh, ww))

    def upsample2x(x):
        # Nearest neighbour by expand: its backward is a sum, deterministic (the CUDA backward
        # of upsample_nearest2d adds atomically).
        b, c, h, w = x.shape
        return x[:, :, :, None, :, None].expand(b, c, h, 2, w, 2).reshape(b, c, 2 * h, 2 * w)

    class UNet(nn.Module):
        def __init__(self, c):
            super().__init__()
            ch, g = c["ch"], c["groups"]
            temb = 4 * ch
            self.ch = ch
            self.temb = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
            self.inp = nn.Conv2d(3, ch, 3, padding=1)
            self.down = nn.ModuleList()
            skips, cur = [ch], ch
            last = len(c["mults"]) - 1
            for lvl, m in enumerate(c["mults"]):
                for _ in range(c["nres"]):
                    blk = nn.ModuleList([ResBlock(cur, ch * m, temb, g)])
                    cur = ch * m
                    if lvl in c["attn_levels"]:
                        blk.append(AttnBlock(cur, g, c["heads"]))
                    self.down.append(blk)
                    skips.append(cur)
                if lvl != last:
                    self.down.append(nn.ModuleList([nn.Conv2d(cur, cur, 3, stride=2, padding=1)]))
                    skips.append(cur)
            self.mid = nn.ModuleList([ResBlock(cur, cur, temb, g), AttnBlock(cur, g, c["heads"]),
                                      ResBlock(cur, cur, temb, g)])
            self.up = nn.ModuleList()
            for lvl, m in reversed(list(enumerate(c["mults"]))):
                for _ in range(c["nres"] + 1):
                    blk = nn.ModuleList([ResBlock(cur + skips.pop(), ch * m, temb, g)])
                    cur = ch * m
                    if lvl in c["attn_levels"]:
                        blk.append(AttnBlock(cur, g, c["heads"]))
                    self.up.append(blk)
                if lvl != 0:
                    self.up.append(nn.ModuleList([nn.Conv2d(cur, cur, 3, padding=1)]))
            self.out = nn.Sequential(nn.GroupNorm(g, cur), nn.SiLU(), nn.Conv2d(cur, 3, 3, padding=1))

        @staticmethod
        def _level(blk, h, t):
            """A ResBlock (and its attention), or the level's resampling conv."""
            if not isinstance(blk[0], ResBlock):
                return blk[0](h)
            h = blk[0](h, t)
            return blk[1](h) if len(blk) > 1 else h

        def forward(self, x, steps):
            half = self.ch // 2
            freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device,
                                                                dtype=torch.float32) / half)
            args = steps[:, None].float() * freqs[None]
            t = self.temb(torch.cat((args.sin(), args.cos()), dim=1))
            h = self.inp(x)
            hs = [h]
            for blk in self.down:
                h = self._level(blk, h, t)
                hs.append(h)
            h = self.mid[0](h, t)
            h = self.mid[1](h)
            h = self.mid[2](h, t)
            for blk in self.up:
                if isinstance(blk[0], ResBlock):
                    h = self._level(blk, torch.cat((h, hs.pop()), dim=1), t)
                else:
                    h = self._level(blk, upsample2x(h), t)
            return self.out(h)

    # GRU encoder-decoder with Luong attention and input feeding.
    class Seq2Seq(nn.Module):
        def __init__(self, c):
            super().__init__()
            e, h, v, n = c["emb"], c["hidden"], c["vocab"], c["layers"]
            self.hidden = h
            self.src_emb = nn.Embedding(v, e)
            self.tgt_emb = nn.Embedding(v, e)
            self.enc = nn.GRU(e, h, n, batch_first=True)
            self.dec = nn.GRU(e + h, h, n, batch_first=True)
            self.attn_w = nn.Linear(h, h, bias=False)
            self.combine = nn.Linear(2 * h, h)
            self.out = nn.Linear(h, v)

        def forward(self, src, tgt_in):
            enc_out, state = self.enc(self.src_emb(src))
            keys = self.attn_w(enc_out)
            emb = self.tgt_emb(tgt_in)
            feed = enc_out.new_zeros(src.shape[0], 1, self.hidden)
            logits = []
            for t in range(tgt_in.shape[1]):  # one decoder call per target token
                o, state = self.dec(torch.cat((emb[:, t:t + 1], feed), dim=2), state)
                a = torch.softmax(torch.bmm(o, keys.transpose(1, 2)), dim=-1)
                feed = torch.tanh(self.combine(torch.cat((o, torch.bmm(a, enc_out)), dim=2)))
                logits.append(self.out(feed))
            return torch.cat(logits, dim=1)

    _modules.cache = dict(MeanPool=MeanPool, Llama=Llama, UNet=UNet, Seq2Seq=Seq2Seq)
    return _modules.cache


# --- runners

def run_llama_train(torch, rt):
    F = torch.nn.functional
    c = LLAMA_TINY if rt.tiny else LLAMA
    model = _modules(torch)["Llama"](c, rt.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch, seq in rt.steps(LLAMA_TRAIN_TINY if rt.tiny else LLAMA_TRAIN_STEPS):
        ids = torch.randint(0, c["vocab"], (batch, seq), device=rt.device)
        with rt.autocast(torch.bfloat16):
            logits = model(ids).float()
        # Next-token loss on the shifted sequence, as causal LM heads compute it.
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, c["vocab"]), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rt.done(loss)
        del logits, loss


def run_llama_serve(torch, rt):
    c = LLAMA_TINY if rt.tiny else LLAMA
    model = _modules(torch)["Llama"](c, rt.device, torch.bfloat16).eval()
    with torch.no_grad():
        for batch, prompt, new in rt.steps(LLAMA_SERVE_TINY if rt.tiny else LLAMA_SERVE_REQUESTS):
            ids = torch.randint(0, c["vocab"], (batch, prompt), device=rt.device)
            caches = [[None, None] for _ in range(c["layers"])]
            logits = model(ids, caches)  # every position's logits, as a plain forward gives
            last = logits[:, -1].float()
            del logits
            check = last.sum(dtype=torch.float64)
            for t in range(new - 1):
                nxt = last.argmax(-1, keepdim=True)
                last = model(nxt, caches, pos=prompt + t)[:, -1].float()
                check = check + last.sum(dtype=torch.float64)
            # The request's "loss": a checksum of the logits it produced, compared bit for bit.
            rt.done(check)
            del caches, last, check


def run_convnext_train(torch, rt):
    import torchvision
    if rt.tiny:
        from torchvision.models.convnext import CNBlockConfig, ConvNeXt
        model = ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)
        classes = 10
    else:
        model = torchvision.models.convnext_tiny(num_classes=1000)
        classes = 1000
    model.avgpool = _modules(torch)["MeanPool"]()
    model = model.to(rt.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch, res in rt.steps(CONVNEXT_TINY if rt.tiny else CONVNEXT_STEPS):
        x = torch.randn(batch, 3, res, res, device=rt.device)
        y = torch.randint(0, classes, (batch,), device=rt.device)
        with rt.autocast(torch.bfloat16):
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rt.done(loss)
        del out, loss


def run_unet_train(torch, rt):
    model = _modules(torch)["UNet"](UNET_TINY if rt.tiny else UNET).to(rt.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    betas = torch.linspace(1e-4, 0.02, 1000, device=rt.device)
    alphas = torch.cumprod(1.0 - betas, dim=0)
    for batch, res in rt.steps(UNET_TINY_STEPS if rt.tiny else UNET_STEPS):
        x0 = torch.randn(batch, 3, res, res, device=rt.device)
        noise = torch.randn_like(x0)
        steps = torch.randint(0, 1000, (batch,), device=rt.device)
        a = alphas[steps].view(batch, 1, 1, 1)
        xt = a.sqrt() * x0 + (1.0 - a).sqrt() * noise
        with rt.autocast(torch.bfloat16):
            pred = model(xt, steps)
        loss = torch.nn.functional.mse_loss(pred.float(), noise)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rt.done(loss)
        del pred, loss


def run_gru_seq2seq_train(torch, rt):
    c = GRU_TINY if rt.tiny else GRU
    # Built on the host and moved: .to() flattens the GRUs' weights for cuDNN, as usual code does.
    model = _modules(torch)["Seq2Seq"](c).to(rt.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch, slen, tlen in rt.steps(GRU_TINY_STEPS if rt.tiny else GRU_STEPS):
        src = torch.randint(0, c["vocab"], (batch, slen), device=rt.device)
        tgt = torch.randint(0, c["vocab"], (batch, tlen + 1), device=rt.device)
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]), tgt[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rt.done(loss)
        del logits, loss


NEW_RUNNERS = {"llama-train": run_llama_train, "convnext-train": run_convnext_train,
               "unet-train": run_unet_train, "gru-seq2seq-train": run_gru_seq2seq_train,
               "llama-serve": run_llama_serve}
