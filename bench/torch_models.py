#!/usr/bin/python3
"""Single-process PyTorch peer of hputrain's example models, for throughput.

Trains, on one pinned core with one thread, the model an hputrain run of
examples/<model> trains, and prints its training throughput:

  mlp      examples/fmnist_mlp: Linear 784-1024-1024-10 with ReLU
  cnn      examples/fmnist_cnn: conv 5x5 1->32 pad 2, ReLU, maxpool 2,
           conv 5x5 32->64 pad 2, ReLU, maxpool 2, Linear 64*7*7->256,
           ReLU, Linear 256->10
  gpt_lm   examples/gpt_lm: character GPT-2 (pre-norm blocks), context 64,
           width 128, 4 heads, 2 blocks, MLP 4x with GELU (tanh), causal
           torch.nn.MultiheadAttention, learned positions, final LayerNorm
           and the head tied to the token embedding (no bias); dropout 0
           (hputrain's runs pass -- --dropout 0); mean cross-entropy over
           every position. The model is bench/torch_parity.py's GPT, the
           one whose losses match gpt_lm's step for step.

Data, as the examples read it (loading is outside the timed region; the
batches are sliced from tensors already in memory, inside it):
  mlp, cnn  Fashion-MNIST from the .gz IDX files (/usr/share/datasets/
            fashion-mnist), x / 255 (the CNN also normalizes by the training
            set's mean 0.2860 and std 0.3530, as fmnist_cnn.c does), batches
            of a seeded shuffle, a new one per epoch
  gpt_lm    the regular files of /usr/share/common-licenses in name order
            (links skipped), vocabulary = the bytes that occur (86 on Debian
            12), as examples/common/corpus.c builds it; windows of 65
            characters at random starts in the first 90% (hputrain shuffles
            every stride-1 window)

Optimizer AdamW lr 1e-3 (torch's defaults otherwise), torch's default init.
--precision bf16 wraps forward and loss in torch.autocast("cpu",
dtype=torch.bfloat16): parameters, gradients and optimizer state stay fp32
(master weights), the autocast ops (linear, matmul, conv) compute in bf16
through oneDNN; backward runs outside the context, as torch recommends.

Threads: OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 are set before numpy
and torch are imported (Debian's torch calls the system OpenBLAS, which
reads its thread count when loaded), torch.set_num_threads(1), and the
process pins itself to --core (default 0, where hpulaunch pins rank 0).

Timing: --warmup steps untimed, then --steps timed steps (batch slicing,
forward, loss, backward, optimizer step). The last line printed is

  torch model=M precision=P samples_per_sec=... [tokens_per_sec=...]

Run with Debian's python3 (python3-torch):
  /usr/bin/python3 bench/torch_models.py --model cnn --precision bf16
"""

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse
import contextlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fmnist_ddp import blas_threads, load_split  # noqa: E402  (one reader)
from torch_parity import GPT, read_corpus  # noqa: E402  (gpt_lm's model and corpus)

FMNIST = "/usr/share/datasets/fashion-mnist"
LICENSES = "/usr/share/common-licenses"
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530  # fmnist_cnn.c


# ---- models ----


def mlp():
    return nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )


def cnn(c1=32, c2=64, hidden=256):
    return nn.Sequential(
        nn.Conv2d(1, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


# ---- data ----


def fmnist_batches(data_dir, conv, batch, seed):
    x, y = load_split(data_dir, "train")
    if conv:
        x = ((x - PIXEL_MEAN) / PIXEL_STD).view(-1, 1, 28, 28)
    gen = torch.Generator().manual_seed(seed)
    steps = len(x) // batch  # drop_last
    while True:
        perm = torch.randperm(len(x), generator=gen)
        for s in range(steps):
            idx = perm[s * batch : (s + 1) * batch]
            yield (x[idx],), y[idx]


def lm_batches(ids, ctx, batch, seed):
    """((tokens, positions), targets) of random windows, as gpt_lm's fields."""
    ntrain = len(ids) - len(ids) // 10
    gen = torch.Generator().manual_seed(seed)
    offs = torch.arange(ctx + 1)
    pos = torch.arange(ctx).expand(batch, ctx)
    while True:
        starts = torch.randint(0, ntrain - ctx, (batch, 1), generator=gen)
        w = ids[starts + offs]
        yield (w[:, :-1], pos), w[:, 1:]


# ---- main ----


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["mlp", "cnn", "gpt_lm"], required=True)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--batch", type=int, default=0,
                    help="batch size (default: 256 for mlp and cnn, 32 for gpt_lm)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps (60)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (10)")
    ap.add_argument("--core", type=int, default=0, help="pin to this core (0; -1: no pinning)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None,
                    help=f"dataset ({FMNIST}; gpt_lm: {LICENSES})")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    if a.core >= 0:
        os.sched_setaffinity(0, {a.core})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)

    lm = a.model == "gpt_lm"
    batch = a.batch or (32 if lm else 256)
    if lm:
        ids, vocab = read_corpus(a.data_dir or LICENSES)
        model = GPT(vocab, a.ctx, a.dim, a.heads, a.layers, p=0.0)
        data = lm_batches(ids, a.ctx, batch, a.seed)
    else:
        model = mlp() if a.model == "mlp" else cnn()
        data = fmnist_batches(a.data_dir or FMNIST, a.model == "cnn", batch, a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()

    def autocast():
        if a.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        with autocast():
            out = model(*x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t0

    sps = a.steps * batch / dt
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model={a.model} batch={batch} steps={a.steps} warmup={a.warmup} "
          f"seconds={dt:.3f} last_loss={loss.item():.4f} params={nparams} "
          f"{'vocab=%d ' % vocab if lm else ''}torch={torch.__version__} "
          f"torch_threads={torch.get_num_threads()} blas_threads={blas_threads()} "
          f"affinity={sorted(os.sched_getaffinity(0))}", flush=True)
    tok = f" tokens_per_sec={sps * a.ctx:.1f}" if lm else ""
    print(f"torch model={a.model} precision={a.precision} samples_per_sec={sps:.1f}{tok}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
