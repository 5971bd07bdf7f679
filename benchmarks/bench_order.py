"""Wall time of one second-order search iteration divided by one first-order iteration.

An iteration is what the search loop does per step: one alpha step (Architect.step) and one
weight step, on random token batches of the config's size. The two orders run interleaved
(A B A B ...) in one process after warm-up, so machine noise hits both alike; the ratio of
the medians is printed. Target (issue 3): at most 3.0, since order 2 adds one virtual
forward/backward and two finite-difference backward passes.

    python benchmarks/bench_order.py [--config FILE] [--set KEY=VALUE ...] [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import replace

import torch

from autoln.architect import Architect, weight_step
from autoln.cli import guarded
from autoln.config import load_config
from autoln.supernet import Supernet
from autoln.training import weight_optimizer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--repeats", type=int, default=10, help="timed iterations per order (after 2 warm-up each)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    result = {}

    def body() -> None:
        cfg = load_config(args.config, args.overrides)
        mc, sc = cfg.model, cfg.search
        torch.manual_seed(0)
        base = Supernet(mc, 256, sc.arch_init_std, sc.tau_start, sc.mixing)
        runners = {}
        for order in (1, 2):
            model = copy.deepcopy(base)
            scfg = replace(sc, order=order)
            opt, sched = weight_optimizer(model.named_weight_parameters(), scfg)
            runners[order] = (model, opt, sched, Architect(model, scfg))
        shape = (sc.batch_size, mc.context)
        batches = [tuple(torch.randint(0, 256, shape) for _ in range(2)) for _ in range(4)]

        def iteration(order: int, i: int) -> float:
            model, opt, sched, arch = runners[order]
            bw, ba = batches[i % 4], batches[(i + 1) % 4]
            t = time.perf_counter()
            arch.step(bw, ba, xi=sched.get_last_lr()[0], step=i + 1)
            weight_step(model, opt, sched, *bw, sc.grad_clip)
            return time.perf_counter() - t

        times = {1: [], 2: []}
        for i in range(args.repeats + 2):
            for order in (1, 2):
                dt = iteration(order, i)
                if i >= 2:
                    times[order].append(dt)
        med = {o: statistics.median(v) for o, v in times.items()}
        result.update({"order1_s": med[1], "order2_s": med[2], "ratio": med[2] / med[1], "repeats": args.repeats,
                       "model": {"n_layers": mc.n_layers, "d_model": mc.d_model, "context": mc.context, "batch_size": sc.batch_size},
                       "threads": torch.get_num_threads()})
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"model: {mc.n_layers} blocks, width {mc.d_model}, context {mc.context}, batch {sc.batch_size}; "
                  f"{torch.get_num_threads()} threads; median of {args.repeats} interleaved iterations")
            print(f"order 1: {med[1] * 1e3:8.1f} ms/iteration")
            print(f"order 2: {med[2] * 1e3:8.1f} ms/iteration")
            print(f"ratio order2/order1: {result['ratio']:.2f} (target <= 3.0)")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
