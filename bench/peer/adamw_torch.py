#!/usr/bin/env python3
"""The PyTorch peer of bench/adamw_bench.cc: torch.optim.AdamW(foreach=True) on the CPU over N
fp32 parameters with fp32 gradients, ms per step and GB/s by adamw_bench's byte count (read p, m,
v, g; write p, m, v: 28 bytes per element, whatever torch itself moves), best of R steps after one
warm-up step (which allocates the state), at each thread count (torch.set_num_threads).

    /usr/bin/python3 bench/peer/adamw_torch.py [--n ELEMENTS] [--reps R] [--threads N ...]
                                               [--tensors K]

Exits 0 with a message when torch cannot be imported.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64 << 20, help="elements (default 64 Mi)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps, the best kept")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tensors", type=int, default=1,
                    help="split the N elements into this many parameter tensors")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("adamw_torch: torch is missing (python3 cannot import it); skipped")
        return 0

    print(f"adamw_torch: torch {torch.__version__}, N = {args.n} elements in {args.tensors} "
          f"tensor(s), torch.optim.AdamW(foreach=True), best of {args.reps} steps after 1 warm-up")
    print(f"{'threads':<8} {'pass':<34} {'ms':>10} {'GB/s':>10}")
    sizes = [args.n // args.tensors + (1 if k < args.n % args.tensors else 0)
             for k in range(args.tensors)]
    torch.manual_seed(0)
    for threads in args.threads:
        torch.set_num_threads(threads)
        params = [torch.nn.Parameter(torch.empty(s).uniform_(-1, 1)) for s in sizes]
        for p in params:
            p.grad = torch.empty(p.shape).uniform_(-1e-3, 1e-3)
        opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, foreach=True)
        best = float("inf")
        for r in range(args.reps + 1):
            t0 = time.perf_counter()
            opt.step()
            dt = time.perf_counter() - t0
            if r > 0:
                best = min(best, dt)
        gbs = 28.0 * args.n / best / 1e9
        print(f"{threads:<8} {'torch AdamW foreach, fp32 grads':<34} {best * 1e3:>10.2f} "
              f"{gbs:>10.2f}")
        del opt, params
    return 0


if __name__ == "__main__":
    sys.exit(main())
