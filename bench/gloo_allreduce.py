#!/usr/bin/python3
"""torch.distributed (gloo) all_reduce, float sum, timed as hpucoll-bench
times its all_reduce: the peer training jobs use today.

    /usr/bin/python3 bench/gloo_allreduce.py [--procs 2] [-b 8] [-e 128M]
        [-f 2] [-n 20] [-w 5] [-c 0|1]

Starts --procs processes on this machine (gloo over loopback TCP). For each
size: -w warm-up all-reduces, a barrier, -n timed ones; time(us) is the mean
per iteration, the maximum over ranks (an all_reduce MAX of each rank's
mean). torch.distributed.all_reduce works in place, so only the in-place
group is printed. busbw = algbw * 2(n-1)/n. With -c 1 one further untimed
all-reduce on fresh small-integer inputs is checked element by element.
Every process uses one intra-op thread, as each rank of the others does.
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s)


def sizes(args):
    n = args.minbytes
    while n <= args.maxbytes:
        yield n
        n *= args.factor


def timed(t, args):
    for _ in range(args.warmup):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(t)
    us = torch.tensor([(time.perf_counter() - t0) / args.iters * 1e6],
                      dtype=torch.float64)
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def checked(count, rank, world):
    i = torch.arange(count, dtype=torch.int64)
    t = (((i * 7 + rank * 3) % 11) - 5).to(torch.float32)
    want = sum(((i * 7 + r * 3) % 11) - 5 for r in range(world)).to(torch.float32)
    dist.all_reduce(t)
    wrong = torch.tensor([int((t != want).sum().item())], dtype=torch.int64)
    dist.all_reduce(wrong)
    return wrong.item()


def worker(rank, args, init):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=args.procs)
    world = args.procs
    factor = 2.0 * (world - 1) / world
    buf = torch.zeros(args.maxbytes // 4 + 1, dtype=torch.float32)
    out = sys.stdout if rank == 0 else open(os.devnull, "w")
    print(f"# gloo_allreduce: torch {torch.__version__} torch.distributed "
          f"gloo all_reduce float sum, {world} ranks", file=out)
    print(f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: "
          f"{args.factor}(factor) warmup iters: {args.warmup} iters: "
          f"{args.iters} validation: {args.check}", file=out)
    print("#", file=out)
    print("#%47s%34s" % ("", "in-place"), file=out)
    print("# %10s %12s %8s %6s %6s %10s %7s %7s %6s" % (
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
        "#wrong"), file=out)
    print("# %10s %12s %8s %6s %6s %10s %7s %7s %6s" % (
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""),
        file=out)
    total_bw, rows, bad = 0.0, 0, 0
    for n in sizes(args):
        count = n // 4
        t = buf[:count]
        us = timed(t, args)
        wrong = checked(count, rank, world) if args.check else -1
        bad += max(wrong, 0)
        algbw = count * 4 / us / 1e3 if us > 0 else 0.0
        total_bw += algbw * factor
        rows += 1
        print("  %10d %12d %8s %6s %6d %10.2f %7.3f %7.3f %6s" % (
            count * 4, count, "float", "sum", -1, us, algbw, algbw * factor,
            "N/A" if wrong < 0 else wrong), file=out, flush=True)
    print("# Out of bounds values : %d %s" % (bad, "FAILED" if bad else "OK"),
          file=out)
    print("# Avg bus bandwidth    : %g" % (total_bw / rows if rows else 0.0),
          file=out, flush=True)
    dist.destroy_process_group()
    if bad:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("-b", dest="minbytes", type=parse_size, default=8)
    p.add_argument("-e", dest="maxbytes", type=parse_size,
                   default=128 << 20)
    p.add_argument("-f", dest="factor", type=int, default=2)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-c", dest="check", type=int, default=1, choices=(0, 1))
    args = p.parse_args()
    if args.factor < 2 or args.iters < 1 or args.maxbytes < args.minbytes:
        p.error("need -f >= 2, -n >= 1 and -e >= -b")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        mp.spawn(worker, args=(args, init), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
