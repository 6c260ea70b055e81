#!/usr/bin/python3
"""PyTorch parity of hputrain's graph examples: the same model, the same
initial weights, the same batches, the same optimizer; the loss per step.

  /usr/bin/python3 bench/torch_parity.py --model gpt|resnet [--build DIR]

For --model gpt (examples/gpt_lm) or resnet (examples/resnet) it
  1. builds the example's model in PyTorch (torch.nn modules, torch's own
     initialization: the same distributions as the layer library's, drawn
     by torch), and writes its parameters in hputrain's --load-params
     format: every parameter's fp32 values, unpadded, in declaration order
     (the order of the example's hpu_param_add calls: layer order, then the
     layer's parameters in order; the tied head's weight is wte.weight,
     stored once, with the embedding);
  2. runs hputrain from that file: hpulaunch --devices 1 --load-params FILE
     --max-steps N --log-every 1 --metrics FILE --no-eval, fp32, the
     optimizer below; the GPT with --dropout 0;
  3. trains the PyTorch model on the very batches hputrain trained on, in
     the same order, and compares the losses step by step.

Batch order: hputrain's sampler (worker/runtime/sampler.c) shuffles the
whole training set once per epoch with Fisher-Yates driven by xoshiro256**
seeded from (--seed, epoch) through splitmix64 (worker/runtime/rng.h), and
global batch s is perm[s*B .. (s+1)*B). This script computes the same
permutation bit for bit (Rng, permutation below), so both sides see the
same samples in the same order without changing the example or the
runtime; N steps stay inside epoch 0. The samples are made as the examples
make them: gpt_lm's windows of T characters of the license corpus (every
window of the first 90%), resnet's Fashion-MNIST images normalized in fp32
as fmnist.c does (px * (1/(255 std)) + (-mean/std), each product and sum
rounded to fp32, no FMA: the project compiles with -ffp-contract=off).

Optimizer: AdamW with hputrain's defaults (lr 1e-3, betas 0.9/0.999, eps
1e-8, weight decay 0.01, options/config.c), which are torch.optim.
AdamW's except weight decay (torch: 0.01 as well); --optimizer sgd is
torch.optim.SGD with --momentum (0.9) and no weight decay. Both sides
apply it to every parameter, biases and norms included.

The table has hputrain's loss, PyTorch's (fp32) and their relative
difference |ours - torch| / |torch| per step; with --fp64 also PyTorch in
fp64, the exact-arithmetic reference that shows how far each fp32 side is
from it. --params adds every parameter's relative L2 difference after the
last step; --eval the test loss after it (evaluation mode: batch norm's
running statistics; hputrain evaluates the example's test split in batches
of --batch, and so does this script). The exit status is 1 when a step's
relative difference (or the test loss's, with --eval) exceeds --tol (1e-5).

--grads compares the first step's gradients per parameter instead: hputrain
runs one plain SGD step (momentum 0, weight decay 0, lr L = 1e6) and saves
its parameters; its gradient is (p0 - p1) / L (in fp64; the fp32 rounding
of p1 costs ~1e-7 relative where L|g| dominates p0). Each parameter's row
gives ||g_ours - g_torch|| / ||g_torch|| and, against a PyTorch fp64
gradient, both sides' own errors: a layer whose ours-vs-fp64 error stands
above torch's fp32-vs-fp64 error is where the two differ. The exit status is
1 when a parameter's ours-vs-torch difference exceeds --tol.

Threads: OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1 (set before torch loads,
and passed to hpulaunch), torch.set_num_threads(1).
"""

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse
import gzip
import json
import math
import stat
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LICENSES = "/usr/share/common-licenses"
FMNIST = "/usr/share/datasets/fashion-mnist"
M64 = (1 << 64) - 1

# ---- hputrain's sampler (worker/runtime/rng.h, sampler.c) ----


class Rng:
    """xoshiro256** seeded by splitmix64, as hpu_rng."""

    def __init__(self, seed, stream):
        x = (seed ^ (stream * 0xD1342543DE82EF95)) & M64
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def next(self):
        s0, s1, s2, s3 = self.s
        x = (s1 * 5) & M64
        res = ((((x << 7) | (x >> 57)) & M64) * 9) & M64
        t = (s1 << 17) & M64
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = ((s3 << 45) | (s3 >> 19)) & M64
        self.s = [s0, s1, s2, s3]
        return res

    def below(self, n):
        limit = M64 - M64 % n
        while True:
            x = self.next()
            if x < limit:
                return x % n


def permutation(n, seed, epoch):
    """hpu__sampler_permute: epoch `epoch`'s order of n samples."""
    r = Rng(seed, 0x5A4D504C + epoch)
    perm = list(range(n))
    for i in range(n, 1, -1):
        j = r.below(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm


# ---- data, as the examples make it ----


def read_corpus(data_dir):
    """examples/common/corpus.c: the regular files (links skipped, names
    not starting with '.') in byte order of their names, concatenated;
    ids 0.. in byte order of the bytes that occur."""
    text = bytearray()
    for name in sorted(os.listdir(os.fsencode(data_dir))):
        path = os.path.join(os.fsencode(data_dir), name)
        if name.startswith(b".") or not stat.S_ISREG(os.lstat(path).st_mode):
            continue
        with open(path, "rb") as f:
            text += f.read()
    chars = sorted(set(text))
    lut = np.full(256, -1, dtype=np.int64)
    lut[chars] = np.arange(len(chars))
    return torch.from_numpy(lut[np.frombuffer(bytes(text), dtype=np.uint8)]), len(chars)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fmnist_split(data_dir, split, mean=0.2860, std=0.3530):
    """examples/common/fmnist.c's split ("train" or "t10k") for the resnet
    (mean and std as resnet.c's PIXEL_MEAN and PIXEL_STD), in fp32 as it
    computes."""
    px = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    f32 = np.float32
    scale = f32(1.0) / (f32(255.0) * f32(std))
    shift = -f32(mean) / f32(std)
    x = px.reshape(-1, 1, 28, 28).astype(f32) * scale + shift  # fp32 ops, rounded each
    assert x.dtype == np.float32
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


# ---- the models ----


class Block(nn.Module):
    """gpt_lm.c's block: x + drop(attn(ln1(x))), then + drop(fc2(gelu(fc1(ln2(.)))))."""

    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + self.drop(a)
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    """gpt_lm.c: wte + wpe (N(0, 0.02)), blocks, ln_f, head tied to wte."""

    def __init__(self, vocab, ctx, d, heads, layers, p=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        # True: may not attend (key after the query)
        self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).triu(1))

    def forward(self, tokens, pos):
        x = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x, self.mask)
        return F.linear(self.ln_f(x), self.wte.weight)

    def hpu_params(self):
        """(hputrain name, tensor) in gpt_lm.c's declaration order."""
        out = [("wte.weight", self.wte.weight), ("wpe.weight", self.wpe.weight)]
        for n, blk in enumerate(self.blocks):
            for name, p in blk.named_parameters():  # ln1, attn (in_proj_weight,
                out.append((f"h{n}.{name}", p))     # in_proj_bias, out_proj.*), ln2, fc1, fc2
        out += [("ln_f.weight", self.ln_f.weight), ("ln_f.bias", self.ln_f.bias)]
        return out


class ResBlock(nn.Module):
    """resnet.c's block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""

    def __init__(self, cin, width, stride, eps, momentum):
        super().__init__()
        bn = lambda: nn.BatchNorm2d(width, eps=eps, momentum=momentum)  # noqa: E731
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = bn()
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = bn()
        self.proj = self.proj_bn = None
        if stride != 1 or cin != width:
            self.proj = nn.Conv2d(cin, width, 1, stride, 0, bias=False)
            self.proj_bn = bn()

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        skip = self.proj_bn(self.proj(x)) if self.proj is not None else x
        return F.relu(y + skip)


class ResNet(nn.Module):
    def __init__(self, width=16, blocks=2, eps=1e-5, momentum=0.1, classes=10):
        super().__init__()
        self.stem_conv = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(width, eps=eps, momentum=momentum)
        self.names, mods, cin = [], [], width
        for s in range(3):
            for k in range(blocks):
                w = width << s
                mods.append(ResBlock(cin, w, 2 if s > 0 and k == 0 else 1, eps, momentum))
                self.names.append(f"s{s}.b{k}")
                cin = w
        self.blocks = nn.ModuleList(mods)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem_conv(x)))
        for blk in self.blocks:
            x = blk(x)
        return self.fc(torch.flatten(F.avg_pool2d(x, x.shape[-1]), 1))

    def relu_inputs(self, x):
        """(name, tensor) of the input of every ReLU, as resnet.c names its
        layers: stem.bn, <block>.bn1 and <block>.sum."""
        out = [("stem.bn", self.stem_bn(self.stem_conv(x)))]
        x = F.relu(out[-1][1])
        for name, blk in zip(self.names, self.blocks):
            out.append((f"{name}.bn1", blk.bn1(blk.conv1(x))))
            y = blk.bn2(blk.conv2(F.relu(out[-1][1])))
            skip = blk.proj_bn(blk.proj(x)) if blk.proj is not None else x
            out.append((f"{name}.sum", y + skip))
            x = F.relu(out[-1][1])
        return out

    def hpu_params(self):
        out = [("stem.conv.weight", self.stem_conv.weight),
               ("stem.bn.weight", self.stem_bn.weight), ("stem.bn.bias", self.stem_bn.bias)]
        for name, blk in zip(self.names, self.blocks):
            for pn, p in blk.named_parameters():  # conv1, bn1, conv2, bn2, proj, proj_bn
                out.append((f"{name}.{pn}", p))
        return out + [("fc.weight", self.fc.weight), ("fc.bias", self.fc.bias)]


# ---- the two sides ----


def write_params(path, params):
    with open(path, "wb") as f:
        for _, p in params:
            f.write(p.detach().to(torch.float32).contiguous().numpy().tobytes())


def read_params(path, params):
    raw = np.fromfile(path, dtype=np.float32)
    out, at = [], 0
    for name, p in params:
        n = p.numel()
        out.append(torch.from_numpy(raw[at : at + n].copy()).view(p.shape))
        at += n
    if at != raw.size:
        raise SystemExit(f"{path}: {raw.size} values, the model has {at}")
    return out


def hputrain(a, setup, params_in, steps, train_opts, tmp, save=None, evaluate=False):
    """Runs hpulaunch; returns the per-step losses of its --metrics file and
    the final record (test_loss in it when `evaluate`)."""
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [os.path.join(a.build, "bin", "hpulaunch"), "-q", "--devices", "1",
           "--precision", "fp32", "--seed", str(a.seed), "--batch-size", str(a.batch),
           "--max-steps", str(steps), "--log-every", "1", "--metrics", metrics,
           "--scheduler", "constant",  # over the model's declared defaults (resnet: cosine)
           "--load-params", params_in] + train_opts
    if not evaluate:
        cmd.append("--no-eval")
    if save:
        cmd += ["--save-params", save]
    cmd += [os.path.join(a.build, "lib", setup["so"]), "--"] + setup["model_args"]
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout)
        raise SystemExit(f"hpulaunch failed (exit {r.returncode})")
    for line in r.stdout.splitlines():
        if line.startswith(("gpt_lm:", "resnet:")):
            print(line)
    recs = [json.loads(l) for l in open(metrics) if l.strip()]
    final = [j for j in recs if j.get("final")]
    losses = {int(j["step"]): j["loss"] for j in recs if "loss" in j and "step" in j
              and not j.get("final")}
    if sorted(losses) != list(range(1, steps + 1)) or len(final) != 1:
        raise SystemExit(f"{metrics}: expected the loss of steps 1..{steps} and a final "
                         f"record, got steps {sorted(losses)}, {len(final)} final records")
    if evaluate and "test_loss" not in final[0]:
        raise SystemExit(f"{metrics}: the final record has no test_loss")
    return [losses[s] for s in range(1, steps + 1)], final[0]


def train_opts(a):
    if a.optimizer == "adamw":
        return ["--optimizer", "adamw", "--lr", repr(a.lr), "--weight-decay", repr(a.wd),
                "--beta1", "0.9", "--beta2", "0.999", "--eps", "1e-8"]
    return ["--optimizer", "sgd", "--lr", repr(a.lr), "--momentum", repr(a.momentum),
            "--weight-decay", "0"]


def make_optimizer(a, params):
    if a.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                                 weight_decay=a.wd)
    return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum, weight_decay=0.0)


def setup_model(a):
    """The torch model, its hputrain launch, batch(indices) -> (inputs,
    labels) of the training split, and the test split as (inputs, labels)
    batches of --batch samples (the examples' test split, in order, as
    hputrain evaluates it)."""
    torch.manual_seed(a.seed)
    if a.model == "gpt":
        ids, vocab = read_corpus(a.data or LICENSES)
        t = a.ctx
        nval = len(ids) // 10
        ntrain = len(ids) - nval
        n = ntrain - t  # gpt_lm.c's training windows
        model = GPT(vocab, t, a.dim, a.heads, a.layers)
        pos = torch.arange(t)

        def windows(starts):
            w = ids[torch.as_tensor(starts)[:, None] + torch.arange(t + 1)]
            return (w[:, :-1], pos.expand(len(starts), t)), w[:, 1:]

        # validation: non-overlapping windows of the last 10%
        starts = [ntrain + k * t for k in range((nval - 1) // t)]
        test = [windows(starts[i : i + a.batch]) for i in range(0, len(starts), a.batch)]
        args = ["--ctx", str(t), "--dim", str(a.dim), "--heads", str(a.heads),
                "--layers", str(a.layers), "--dropout", "0", "--gen", "0"]
        if a.data:
            args += ["--data", a.data]
        return model, dict(so="gpt_lm.so", model_args=args, n=n,
                           info=f"vocab {vocab}, {n} training windows"), windows, test
    x, y = fmnist_split(a.data or FMNIST, "train")
    model = ResNet(a.width, a.blocks)

    def batch(idx):
        i = torch.as_tensor(idx)
        return (x[i],), y[i]

    tx, ty = fmnist_split(a.data or FMNIST, "t10k")
    test = [((tx[i : i + a.batch],), ty[i : i + a.batch]) for i in range(0, len(tx), a.batch)]
    args = ["--width", str(a.width), "--blocks", str(a.blocks)]
    if a.data:
        args += ["--data", a.data]
    return model, dict(so="resnet.so", model_args=args, n=len(x),
                       info=f"{len(x)} training images"), batch, test


def loss_of(model, inputs, labels):
    out = model(*inputs)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))


def torch_losses(model, batches, a, dtype):
    model = model.to(dtype)
    model.train()
    opt = make_optimizer(a, model.parameters())
    out = []
    for inputs, labels in batches:
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, inputs, labels)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_loss(model, test, dtype):
    """The mean loss over the test samples in evaluation mode (batch norm
    with its running statistics), summed per batch as hputrain does."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, labels in test:
            inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
            total += loss_of(model, inputs, labels).item() * len(labels)
            count += len(labels)
    model.train()
    return total / count


def first_grads(model, inputs, labels, dtype):
    model = model.to(dtype)
    model.train()
    model.zero_grad(set_to_none=True)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    loss = loss_of(model, inputs, labels)
    loss.backward()
    return loss.item(), [p.grad.detach().double().clone() for _, p in model.hpu_params()]


def rel(a, b):
    d = (a - b).norm().item()
    n = b.norm().item()
    return d / n if n > 0 else (0.0 if d == 0 else math.inf)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["gpt", "resnet"], required=True)
    ap.add_argument("--build", default="build", help="the build directory (build)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=0, help="global batch (gpt 16, resnet 32)")
    ap.add_argument("--seed", type=int, default=42, help="init (torch) and sampler seed (42)")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--lr", type=float, default=0.0, help="(adamw 1e-3, sgd 1e-2)")
    ap.add_argument("--wd", type=float, default=0.01, help="AdamW weight decay (0.01)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (0.9)")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--fp64", action="store_true", help="also PyTorch in fp64")
    ap.add_argument("--grads", action="store_true", help="compare the first step's gradients")
    ap.add_argument("--params", action="store_true",
                    help="compare every parameter after the last step")
    ap.add_argument("--kinks", action="store_true",
                    help="resnet: after the last step, the next batch's ReLU sign flips and "
                         "gradients from ours vs torch's parameters, both in PyTorch")
    ap.add_argument("--eval", action="store_true",
                    help="compare the test loss after the last step (evaluation mode)")
    ap.add_argument("--data", default=None, help=f"dataset directory ({LICENSES} / {FMNIST})")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=2)
    a = ap.parse_args()
    a.batch = a.batch or (16 if a.model == "gpt" else 32)
    a.lr = a.lr or (1e-3 if a.optimizer == "adamw" else 1e-2)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

    model, setup, make_batch, test = setup_model(a)
    params = model.hpu_params()
    npar = sum(p.numel() for _, p in params)
    print(f"model {a.model}: {setup['info']}; {len(params)} parameter tensors, {npar} values; "
          f"batch {a.batch}, seed {a.seed}, {a.optimizer} lr {a.lr:g}"
          + (f" weight decay {a.wd:g}" if a.optimizer == "adamw" else f" momentum {a.momentum:g}")
          + f"; torch {torch.__version__}, {torch.get_num_threads()} thread", flush=True)
    steps = 1 if a.grads else a.steps
    if steps * a.batch > setup["n"]:
        raise SystemExit(f"{steps} steps of {a.batch} do not fit in epoch 0 ({setup['n']} samples)")
    perm = permutation(setup["n"], a.seed, 0)
    more = 1 if a.kinks else 0
    if (steps + more) * a.batch > setup["n"]:
        raise SystemExit(f"{steps + more} batches of {a.batch} do not fit in epoch 0")
    batches = [make_batch(perm[s * a.batch : (s + 1) * a.batch]) for s in range(steps + more)]
    nxt = batches.pop() if a.kinks else None
    init = {name: p.detach().clone() for name, p in params}
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        p0 = os.path.join(tmp, "init.f32")
        write_params(p0, params)
        if a.grads:
            return compare_grads(a, model, setup, batches[0], init, p0, tmp)
        p1 = os.path.join(tmp, "final.bin")
        ours, final = hputrain(a, setup, p0, steps, train_opts(a), tmp, save=p1,
                               evaluate=a.eval)
        ours_params = read_params(p1, params)
    rc = compare_run(a, model, batches, test, init, ours, final, ours_params)
    if a.kinks:
        kinks(model, nxt, ours_params, len(batches))
    return rc


def reset(model, init):
    for name, p in model.hpu_params():
        p.data = init[name].clone()


def compare_grads(a, model, setup, batch, init, p0, tmp):
    """--grads: the first step's gradient of every parameter, both sides."""
    big = 1e6
    p1 = os.path.join(tmp, "step1.bin")
    sgd = ["--optimizer", "sgd", "--lr", repr(big), "--momentum", "0", "--weight-decay", "0"]
    ours_loss = hputrain(a, setup, p0, 1, sgd, tmp, save=p1)[0][0]
    params = model.hpu_params()
    after = read_params(p1, params)
    g_ours = [(init[name].double() - q.double()) / big for (name, _), q in zip(params, after)]
    l32, g32 = first_grads(model, *batch, torch.float32)
    reset(model, init)
    l64, g64 = first_grads(model, *batch, torch.float64)
    print(f"\nstep 1 loss: hputrain {ours_loss:.9g}  torch fp32 {l32:.9g}  "
          f"torch fp64 {l64:.9g}\n")
    print(f"{'parameter':28s} {'numel':>8s} {'|g| fp64':>10s} {'ours-torch':>11s} "
          f"{'ours-fp64':>10s} {'torch-fp64':>10s}   (relative L2 differences)")
    worst = (0.0, "")
    for (name, p), go, gt, gd in zip(params, g_ours, g32, g64):
        worst = max(worst, (rel(go, gt), name))
        print(f"{name:28s} {p.numel():8d} {gd.norm().item():10.3e} {rel(go, gt):11.2e} "
              f"{rel(go, gd):10.2e} {rel(gt, gd):10.2e}")
    ok = worst[0] <= a.tol
    print(f"\ngrads model={a.model} max_rel_diff={worst[0]:.3e} at {worst[1]} tol={a.tol:g} "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


def kinks(model, batch, ours_params, steps):
    """--kinks: PyTorch (fp32) computes the next step's forward and gradient
    twice, from hputrain's parameters after `steps` steps and from its own;
    prints the ReLU inputs whose sign differs and how far apart the two
    gradients are. Gradients jump where a ReLU input crosses 0, so a
    parameter difference of 1e-6 can move them by much more."""
    if not hasattr(model, "relu_inputs"):
        raise SystemExit("--kinks is for --model resnet")
    model = model.float()
    theirs = [p.detach().clone() for _, p in model.hpu_params()]
    runs = []
    for vals in (ours_params, theirs):
        for (_, p), v in zip(model.hpu_params(), vals):
            p.data = v.clone().float()
        with torch.no_grad():
            pre = model.relu_inputs(*batch[0])
        runs.append((pre, first_grads(model, *batch, torch.float32)[1]))
    dp = max(rel(o.double(), t.double()) for o, t in zip(ours_params, theirs))
    print(f"\nstep {steps + 1} computed by PyTorch fp32 from hputrain's and from PyTorch's "
          f"parameters after step {steps} (parameters apart by at most {dp:.2e}, relative L2)")
    flips = 0
    for (name, a), (_, b) in zip(runs[0][0], runs[1][0]):
        n = int(((a > 0) != (b > 0)).sum())
        flips += n
        if n:
            print(f"  ReLU input {name}: {n} of {a.numel()} elements change sign")
    print(f"  {flips} ReLU inputs change sign in all")
    diffs = sorted(((rel(g, h), name) for (name, _), g, h in
                    zip(model.hpu_params(), runs[0][1], runs[1][1])), reverse=True)
    print("  gradients apart the most: "
          + ", ".join(f"{name} {d:.2e}" for d, name in diffs[:4]))
    for (_, p), v in zip(model.hpu_params(), theirs):
        p.data = v


def compare_run(a, model, batches, test, init, ours, final, ours_params):
    """The loss table; with --params the parameters after the last step,
    with --eval the test loss after it."""
    steps = len(batches)
    theirs = torch_losses(model, batches, a, torch.float32)
    t32 = [p.detach().double().clone() for _, p in model.hpu_params()]
    theirs_test = test_loss(model, test, torch.float32) if a.eval else None
    ref = t64 = None
    if a.fp64:
        reset(model, init)
        ref = torch_losses(model, batches, a, torch.float64)
        t64 = [p.detach().clone() for _, p in model.hpu_params()]
    print()
    head = f"{'step':>4s} {'hputrain':>14s} {'torch fp32':>14s} {'rel diff':>10s}"
    if ref:
        head += f" {'torch fp64':>18s} {'ours-fp64':>10s} {'torch-fp64':>10s}"
    print(head)
    worst = 0.0
    for s in range(steps):
        d = abs(ours[s] - theirs[s]) / abs(theirs[s])
        worst = max(worst, d)
        line = f"{s + 1:4d} {ours[s]:14.9f} {theirs[s]:14.9f} {d:10.2e}"
        if ref:
            line += (f" {ref[s]:18.15f} {abs(ours[s] - ref[s]) / ref[s]:10.2e}"
                     f" {abs(theirs[s] - ref[s]) / ref[s]:10.2e}")
        print(line)
    if a.params:
        print(f"\nparameters after step {steps} (relative L2 differences)")
        print(f"{'parameter':28s} {'ours-torch':>11s}"
              + (f" {'ours-fp64':>10s} {'torch-fp64':>10s}" if t64 else ""))
        for k, (name, _) in enumerate(model.hpu_params()):
            go = ours_params[k].double()
            line = f"{name:28s} {rel(go, t32[k]):11.2e}"
            if t64:
                line += f" {rel(go, t64[k]):10.2e} {rel(t32[k], t64[k]):10.2e}"
            print(line)
    verdict = worst
    if a.eval:
        ot = final["test_loss"]
        d = abs(ot - theirs_test) / abs(theirs_test)
        verdict = max(verdict, d)
        print(f"\ntest loss after step {steps} (evaluation mode): hputrain {ot:.9f} "
              f"torch fp32 {theirs_test:.9f} rel diff {d:.2e}")
    ok = verdict <= a.tol
    print(f"\nparity model={a.model} steps={steps} optimizer={a.optimizer} lr={a.lr:g} "
          f"max_rel_diff={worst:.3e}" + (f" test_rel_diff={d:.3e}" if a.eval else "")
          + f" tol={a.tol:g} {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
