#!/usr/bin/python3
"""PyTorch peer for the hputrain Fashion-MNIST benchmark.

PyTorch 1.13 DistributedDataParallel, gloo backend, CPU, N processes on this
host, doing what an hputrain run of examples/fmnist_mlp does:

  model      MLP 784-1024-1024-10 with ReLU, torch's default init
  data       Fashion-MNIST read straight from the .gz IDX files (gzip +
             numpy), pixels scaled to [0, 1] (x / 255, no normalization)
  batches    global batch 256, each process takes 256/N; one epoch over the
             60000 training images, a seeded shuffle per epoch, drop_last
             (234 steps); global batch s is perm[s*256:(s+1)*256] and rank
             r takes the r-th of its N equal slices, as worker/runtime/sampler.h does
  optimizer  AdamW, lr 1e-3, torch's defaults otherwise (weight decay 0.01)
  threads    torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1 per process
             (one BLAS thread each, as our workers use)
  --bf16     forward and loss under torch.autocast("cpu", dtype=bfloat16):
             fp32 parameters, gradients (so the all-reduce too) and optimizer
             state; linear layers compute in bf16 through oneDNN
  --pin      rank r pins itself to core r mod ncpu, as hpulaunch pins workers

Throughput is measured from the first step to the end of the epoch, so
process start-up, rendezvous and data loading are excluded; a second figure
leaves out the first 10 steps as warm-up. After the epoch rank 0 evaluates
the 10000 test images. The last line printed is

  torch-ddp procs=N [precision=bf16 ]samples_per_sec=... \
samples_per_sec_after_warmup=... test_accuracy=...

Run with Debian's python3 (python3-torch):  /usr/bin/python3 bench/torch_fmnist_ddp.py --procs 2
"""

import os

# One BLAS thread per process. Debian's torch calls the system libblas
# (OpenBLAS, pthread build), which ignores torch.set_num_threads() and reads
# its thread count from the environment when it is loaded, so this must come
# before numpy and torch are imported (spawned children inherit it).
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse
import contextlib
import gzip
import socket
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

GLOBAL_BATCH = 256
WARMUP_STEPS = 10
DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """Reads a gzipped IDX file (ubyte only) into a numpy array."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: expected {dims}, got {data.size} bytes")
    return data.reshape(dims)


def load_split(data_dir, split):
    """Images as float32 [n, 784] in [0, 1] and labels as int64 [n]."""
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32))
    x /= 255.0
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_model():
    return nn.Sequential(
        nn.Linear(784, 1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    )


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blas_threads():
    """OpenBLAS's thread count as loaded in this process, or -1."""
    try:
        import ctypes

        return ctypes.CDLL("libblas.so.3").openblas_get_num_threads()
    except (OSError, AttributeError):
        return -1


def worker(rank, world, port, args):
    if args.pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    # Data loading is outside the timed region.
    x_train, y_train = load_split(args.data_dir, "train")
    per_rank = GLOBAL_BATCH // world

    torch.manual_seed(args.seed)  # same init everywhere; DDP broadcasts rank 0's anyway
    model = DDP(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # Per-epoch seeded shuffle, identical on every rank.
    epoch = 0
    gen = torch.Generator()
    gen.manual_seed(args.seed * 1000003 + epoch)
    perm = torch.randperm(len(x_train), generator=gen)
    steps = len(x_train) // GLOBAL_BATCH  # drop_last

    dist.barrier()
    model.train()
    t_start = time.perf_counter()
    t_warm = t_start
    loss = torch.zeros(())
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 \
        else contextlib.nullcontext
    for step in range(steps):
        if step == WARMUP_STEPS:
            t_warm = time.perf_counter()
        base = step * GLOBAL_BATCH + rank * per_rank
        idx = perm[base : base + per_rank]
        xb, yb = x_train[idx], y_train[idx]
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
    dist.barrier()  # the epoch ends when the slowest rank is done
    t_end = time.perf_counter()

    if rank == 0:
        x_test, y_test = load_split(args.data_dir, "t10k")
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(x_test), 1000):
                logits = model.module(x_test[i : i + 1000])
                correct += (logits.argmax(1) == y_test[i : i + 1000]).sum().item()
        acc = correct / len(x_test)
        samples = steps * GLOBAL_BATCH
        sps = samples / (t_end - t_start)
        sps_warm = (steps - WARMUP_STEPS) * GLOBAL_BATCH / (t_end - t_warm)
        print(
            f"steps={steps} samples={samples} epoch_s={t_end - t_start:.2f} "
            f"last_loss(rank0)={loss.item():.4f} torch={torch.__version__} "
            f"torch_threads={torch.get_num_threads()} blas_threads={blas_threads()}",
            flush=True,
        )
        print(
            f"torch-ddp procs={world} {'precision=bf16 ' if args.bf16 else ''}"
            f"samples_per_sec={sps:.1f} "
            f"samples_per_sec_after_warmup={sps_warm:.1f} "
            f"test_accuracy={acc:.4f}",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2, help="DDP processes (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="init and shuffle seed")
    ap.add_argument("--data-dir", default=DEFAULT_DATA, help="the .gz IDX files")
    ap.add_argument("--bf16", action="store_true",
                    help="forward and loss under torch.autocast cpu bfloat16")
    ap.add_argument("--pin", action="store_true", help="pin rank r to core r")
    args = ap.parse_args()
    if args.procs < 1 or GLOBAL_BATCH % args.procs != 0:
        ap.error(f"--procs must divide the global batch {GLOBAL_BATCH}")
    # Keep gloo on loopback: every process is on this host.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(worker, args=(args.procs, free_port(), args), nprocs=args.procs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
