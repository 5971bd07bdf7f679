"""Cost of the supernet against the derived model it stands for: time, throughput, memory, FLOPs.

The floor (docs/design.md §3): at a site the candidates need only two distinct branch inputs (``LN(x)``
for Pre-LN, ``x`` for Post-LN and DeepNorm), so a supernet forward/backward costs about 2x the
derived model's and a first-order search iteration (alpha step + weight step) about 4x. A naive
supernet that calls the branch once per candidate costs about 3x and 6x.

Variants, each with its own model and optimizers, on real windows of the config's corpus:

| name | one step is |
|---|---|
| ``derived`` | a training step of the derived model (all ``model.candidates[0]``, e.g. all-pre) |
| ``supernet_weight`` | the supernet's weight step (``autoln.oneshot.architect.weight_step``) |
| ``search_order1`` | a first-order search iteration: alpha step + weight step |
| ``search_order2`` | a second-order search iteration (DARTS' unrolled step) + weight step |
| ``naive_weight`` | the weight step of a supernet that calls each branch once per candidate |
| ``naive_order1`` | a first-order iteration of that naive supernet |
| ``wide_weight`` | the weight step of the supernet over all seven placements (:data:`WIDE`: three branch inputs per site) |
| ``common_weight`` | ``supernet_weight`` with ``search.candidate_scale: common`` (each candidate at the mixture's RMS; issue 44: within 10 % of ``supernet_weight``) |
| ``qk_weight`` | ``supernet_weight`` with QK-norm searched too (``model.qk_norm: [none, qk, qk-all]``: its own alphas, three QK candidates mixed in every attention) |
| ``qk_order1`` | ``search_order1`` with QK-norm searched too |
| ``example_derived`` | a training step of ``examples/gpt.py`` (nanoGPT's model.py with the README's diff, bias-free), Pre-LN |
| ``example_weight`` | the weight step of that model searched through the public API (``autoln.SearchModel``, ``model.candidates`` at every site) |

The two ``example_`` variants measure the public API's cost on a user's model: their ratio
``example_weight / example_derived`` is printed beside ``supernet_weight / derived`` and should be
within 10 % of it (the same supernet floor, reached through ``autoln.Site`` in someone else's block).

For ``wide_weight`` the FLOP floor is printed beside its time ratio: its FLOPs per step over the
derived model's, the cost it cannot go below when every distinct branch input costs one call.

All steps run in one process, interleaved (one step of each variant per round, the order
rotating each round) after warm-up rounds, so machine noise hits every variant alike. Printed
per variant: the best and the median time per step, tokens per second (the weight batch's
``batch_size x context`` tokens per step, at the best time), peak memory of one step (parameters, gradients, optimizer states
and activations: on CUDA the caching allocator's peak, on CPU the peak of live tensor
storage seen by a ``TorchDispatchMode``), FLOPs per step (``torch.utils.flop_counter.FlopCounterMode``), and the ratios to
``derived``: time and memory. The time ratio is that of the best (fastest) steps: on a shared
machine every disturbance only adds time, so the fastest of N interleaved steps is the
least-disturbed measure of a step's cost (the rule of Python's ``timeit``); the median of the
per-round ratios is printed beside it. With ``--peak-tflops`` the model FLOPs utilisation
``FLOPs per step / best time / peak`` is printed too.

    python benchmarks/bench_step.py [--config FILE] [--set KEY=VALUE ...] [--rounds N] [--warmup N]
                                    [--variants a,b] [--scaling] [--peak-tflops X] [--json FILE]

``--scaling`` repeats the measurement at 6, 12 and 24 blocks (at the config's context) and at
context 128, 256 and 512 (at the config's depth) for ``derived``, ``supernet_weight`` and
``search_order1`` and prints the ratios as a table. Targets on CPU at the default size:
``supernet_weight`` <= 2.1x, ``search_order1`` <= 4.2x, supernet peak memory <= 2.2x.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from autoln.oneshot.architect import Architect, weight_step
from autoln.cli import guarded
from autoln.config import Config, load_config
from autoln.data import WindowSampler, check_lengths, load_corpus
from autoln.core.errors import ConfigError
from autoln.core.io import write_json_atomic
from autoln.models.model import build_derived
from autoln.space.qk import QK_NORMS
from autoln.models.supernet import Supernet, set_candidate_scale
from autoln.engine.training import prepare_model, resolve_device, train_step, weight_optimizer

VARIANTS = ("derived", "supernet_weight", "search_order1", "search_order2", "naive_weight", "naive_order1", "wide_weight",
            "example_derived", "example_weight", "common_weight", "qk_weight", "qk_order1")
#: The widened candidate list of ``wide_weight``: every registered placement.
WIDE = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]
SCALING_VARIANTS = ("derived", "supernet_weight", "search_order1")
TARGETS = {"supernet_weight": 2.1, "search_order1": 4.2}
MEMORY_TARGET = 2.2
POOL = 4  # batches cycled per role


def naive_site_forward(self, x: torch.Tensor, branch: torch.nn.Module, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference mixed site that calls the branch once per candidate: ``sum_k w_k p_k(x, F)``."""
    out = None
    for k, p in enumerate(self.placements.values()):
        term = weights[k] * p(x, branch)
        out = term if out is None else out + term
    return out


def make_naive(model: Supernet) -> Supernet:
    """Turn every site of ``model`` into :func:`naive_site_forward` (same weights, same maths)."""
    for block in model.blocks:
        for site in (block.attn_site, block.ffn_site):
            site.forward = types.MethodType(naive_site_forward, site)
    return model


@dataclass
class Runner:
    """One variant: ``step(i)`` runs its ``i``-th step; ``tracked`` are its modules and
    optimizers (for the memory tracker)."""

    step: Callable[[int], None]
    tracked: list


def build_runners(cfg: Config, vocab_size: int, batches: list, device: torch.device, names: list[str]) -> dict[str, Runner]:
    """The variants ``names`` at ``cfg``'s size; every supernet starts from the same weights and
    the derived model from the same seed. ``batches``: ``(D_w batch, D_alpha batch)`` pairs."""
    mc, sc = cfg.model, cfg.search
    torch.manual_seed(sc.seed)
    base = Supernet(mc, vocab_size, sc.arch_init_std, sc.tau_start, sc.mixing, sc.candidate_scale)
    runners: dict[str, Runner] = {}
    for name in names:
        if name.startswith("example_"):
            runners[name] = example_runner(cfg, vocab_size, batches, device, name == "example_weight")
            continue
        if name == "derived":
            model = prepare_model(build_derived(mc, vocab_size, [(mc.candidates[0],) * 2] * mc.n_layers), device, sc)
            opt, sched = weight_optimizer(list(model.named_parameters()), sc)

            def step(i, model=model, opt=opt, sched=sched):
                train_step(model, opt, sched, *batches[i % POOL][0], sc.grad_clip)
            runners[name] = Runner(step, [model, opt])
            continue
        if name == "wide_weight":
            torch.manual_seed(sc.seed)
            model = Supernet(replace(mc, candidates=WIDE), vocab_size, sc.arch_init_std, sc.tau_start, sc.mixing)
        elif name.startswith("qk_"):  # the same supernet's weights (drawn first), plus QK-norm searched
            torch.manual_seed(sc.seed)
            model = Supernet(replace(mc, qk_norm=list(QK_NORMS)), vocab_size, sc.arch_init_std, sc.tau_start, sc.mixing,
                             sc.candidate_scale)
        else:
            model = copy.deepcopy(base)
        if name.startswith("naive"):
            make_naive(model)
        if name == "common_weight":
            set_candidate_scale(model, "common")
        model = prepare_model(model, device, sc)
        opt, sched = weight_optimizer(model.named_weight_parameters(), sc)
        order = 2 if name.endswith("order2") else 1
        arch = Architect(model, replace(sc, order=order)) if "order" in name else None

        def step(i, model=model, opt=opt, sched=sched, arch=arch):
            batch_w, batch_a = batches[i % POOL]
            if arch is not None:
                arch.step(batch_w, batch_a, xi=sched.get_last_lr()[0], step=i + 1)
            weight_step(model, opt, sched, *batch_w, sc.grad_clip)
        runners[name] = Runner(step, [model, opt] + ([arch.optimizer] if arch else []))
    return runners


def example_runner(cfg: Config, vocab_size: int, batches: list, device: torch.device, searched: bool) -> Runner:
    """``examples/gpt.py`` at ``cfg``'s size (``n_embd = d_model``, its MLP 4x wide): a Pre-LN
    training step, or (``searched``) the weight step of its supernet over ``model.candidates``
    through :class:`autoln.api.SearchModel`."""
    import importlib.util

    from autoln.api import SearchModel

    path = Path(__file__).resolve().parents[1] / "examples" / "gpt.py"
    spec = importlib.util.spec_from_file_location("example_gpt", path)
    gpt = importlib.util.module_from_spec(spec)
    sys.modules["example_gpt"] = gpt
    spec.loader.exec_module(gpt)
    mc, sc = cfg.model, cfg.search
    torch.manual_seed(sc.seed)
    conf = gpt.GPTConfig(block_size=mc.context, vocab_size=vocab_size, n_layer=mc.n_layers, n_head=mc.n_heads, n_embd=mc.d_model, bias=False,
                         norm_candidates=tuple(mc.candidates) if searched else (mc.candidates[0],))
    model = gpt.GPT(conf).to(device)
    if not searched:
        opt, sched = weight_optimizer(list(model.named_parameters()), sc)

        def step(i, model=model, opt=opt, sched=sched):
            train_step(model, opt, sched, *batches[i % POOL][0], sc.grad_clip)
        return Runner(step, [model, opt])
    net = SearchModel(model, tau=sc.tau_start, mixing=sc.mixing)
    opt, sched = weight_optimizer(net.named_weight_parameters(), sc)

    def step(i, net=net, opt=opt, sched=sched):
        weight_step(net, opt, sched, *batches[i % POOL][0], sc.grad_clip)
    return Runner(step, [net, opt])


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so a step's time is its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(runners: dict[str, Runner], rounds: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds per step of each variant in each timed round (warm-up rounds dropped)."""
    names = list(runners)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            sync(device)
            t = time.perf_counter()
            runners[name].step(r)
            sync(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - t)
    return times


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage alive while the mode is on, and their peak: the storages of
    ``state`` (counted from the start) plus every storage an operation creates inside the mode;
    a storage stops counting when it is freed (a ``weakref.finalize`` on it). Views and in-place
    results share their base's storage and count once."""

    def __init__(self, state: list[torch.Tensor]) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.alive: set[int] = set()
        for t in state:
            self._count(t)

    def _count(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key, size = st.data_ptr(), st.nbytes()
        if size == 0 or key in self.alive:
            return
        self.alive.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        if key in self.alive:
            self.alive.discard(key)
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._count(t)
        return out


def state_tensors(tracked: list) -> list[torch.Tensor]:
    """Parameters, gradients and optimizer states of the tracked modules and optimizers."""
    out = []
    for obj in tracked:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                out += [p] + ([p.grad] if p.grad is not None else [])
        else:
            out += [v for state in obj.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def peak_memory(runner: Runner, step: int, device: torch.device) -> int:
    """Peak bytes of one step: the variant's parameters, gradients and optimizer states plus
    every tensor the step allocates. CPU: :class:`LiveBytes`; CUDA: the caching allocator's
    peak (``torch.cuda.max_memory_allocated``) above what was allocated before the step, plus
    the variant's state."""
    state = state_tensors(runner.tracked)
    if device.type == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step(step)
        sync(device)
        owned = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state}.values())
        return owned + max(0, torch.cuda.max_memory_allocated(device) - before)
    tracker = LiveBytes(state)
    with tracker:
        runner.step(step)
    return tracker.peak


def flops(runner: Runner, step: int) -> int:
    """Floating-point operations of one step (matmuls and attention, forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        runner.step(step)
    return int(counter.get_total_flops())


def measure(cfg: Config, names: list[str], rounds: int, warmup: int, peak_tflops: Optional[float] = None) -> dict:
    """Run every variant of ``names`` (``derived`` first) at ``cfg``'s size; returns the
    per-variant figures and their ratios to ``derived``."""
    mc, sc = cfg.model, cfg.search
    device = resolve_device(sc.device)
    corpus = load_corpus(cfg.data)
    check_lengths(corpus, mc.context)
    train = corpus.splits["train"]
    half = len(train) // 2
    sampler_w = WindowSampler(train[:half], np.array([[0, half]]), mc.context, sc.batch_size, seed=[sc.seed, 1])
    sampler_a = WindowSampler(train[half:], np.array([[0, len(train) - half]]), mc.context, sc.batch_size, seed=[sc.seed, 2])
    batches = [(tuple(t.to(device) for t in sampler_w.sample()), tuple(t.to(device) for t in sampler_a.sample())) for _ in range(POOL)]
    runners = build_runners(cfg, corpus.vocab_size, batches, device, names)
    times = time_interleaved(runners, rounds, warmup, device)
    tokens = sc.batch_size * mc.context
    out = {"model": {"n_layers": mc.n_layers, "d_model": mc.d_model, "n_heads": mc.n_heads, "d_ff": mc.d_ff,
                     "context": mc.context, "batch_size": sc.batch_size, "vocab_size": corpus.vocab_size,
                     "candidates": list(mc.candidates)},
           "device": str(device), "threads": torch.get_num_threads(), "rounds": rounds, "warmup": warmup,
           "precision": sc.precision, "compile": sc.compile, "variants": {}}
    step = warmup + rounds
    for name, runner in runners.items():
        med = statistics.median(times[name])
        best = min(times[name])
        fl = flops(runner, step)
        rec = {"ms_per_step": med * 1e3, "ms_per_step_best": best * 1e3, "tokens_per_s": tokens / best,
               "time_ratio": best / min(times["derived"]),
               "time_ratio_median": statistics.median(t / d for t, d in zip(times[name], times["derived"])),
               "peak_memory_mb": peak_memory(runner, step + 1, device) / 2**20, "gflops_per_step": fl / 1e9,
               "achieved_tflops": fl / best / 1e12}
        if peak_tflops:
            rec["mfu"] = fl / best / (peak_tflops * 1e12)
        out["variants"][name] = rec
    base_mem = out["variants"]["derived"]["peak_memory_mb"]
    for rec in out["variants"].values():
        rec["memory_ratio"] = rec["peak_memory_mb"] / base_mem
    return out


def print_result(res: dict) -> None:
    """Print :func:`measure`'s result as a table, then each target and whether it is met."""
    m = res["model"]
    print(f"model: {m['n_layers']} blocks, width {m['d_model']}, {m['n_heads']} heads, d_ff {m['d_ff']}, context {m['context']}, "
          f"batch {m['batch_size']}, vocab {m['vocab_size']}; device {res['device']}, {res['threads']} threads, "
          f"precision {res['precision']}, compile {res['compile']}; {res['rounds']} interleaved rounds after {res['warmup']} warm-up")
    mfu = any("mfu" in r for r in res["variants"].values())
    print(f"{'variant':<16} {'best ms':>8} {'median ms':>9} {'tokens/s':>9} {'x best':>7} {'x median':>8} {'peak MB':>8} {'x mem':>6} "
          f"{'GFLOP':>7} {'TFLOP/s':>8}" + ("    MFU" if mfu else ""))
    for name, r in res["variants"].items():
        line = (f"{name:<16} {r['ms_per_step_best']:8.1f} {r['ms_per_step']:9.1f} {r['tokens_per_s']:9.0f} {r['time_ratio']:7.2f} "
                f"{r['time_ratio_median']:8.2f} {r['peak_memory_mb']:8.1f} {r['memory_ratio']:6.2f} {r['gflops_per_step']:7.2f} "
                f"{r['achieved_tflops']:8.3f}")
        print(line + (f" {r['mfu']:7.2%}" if "mfu" in r else ""))
    checks = [(f"{n} time", res["variants"][n]["time_ratio"], t) for n, t in TARGETS.items() if n in res["variants"]]
    if "supernet_weight" in res["variants"]:
        checks.append(("supernet_weight memory", res["variants"]["supernet_weight"]["memory_ratio"], MEMORY_TARGET))
    for label, value, target in checks:
        print(f"target {label} <= {target}x derived: {value:.2f} {'ok' if value <= target else 'MISSED'}")
    if "wide_weight" in res["variants"]:
        v = res["variants"]
        floor = v["wide_weight"]["gflops_per_step"] / v["derived"]["gflops_per_step"]
        print(f"wide_weight ({len(WIDE)} candidates, 3 branch inputs per site): time {v['wide_weight']['time_ratio']:.2f}x, "
              f"memory {v['wide_weight']['memory_ratio']:.2f}x derived; FLOP floor {floor:.2f}x")
    for qk, plain in (("qk_weight", "supernet_weight"), ("qk_order1", "search_order1")):
        if {qk, plain} <= set(res["variants"]):  # the fastest steps, as time_ratio
            v = res["variants"]
            print(f"{qk} / {plain} (QK-norm searched beside the placements, against not): "
                  f"{v[qk]['ms_per_step_best'] / v[plain]['ms_per_step_best']:.3f}")
    if {"common_weight", "supernet_weight"} <= set(res["variants"]):
        v = res["variants"]
        ratio = v["common_weight"]["ms_per_step_best"] / v["supernet_weight"]["ms_per_step_best"]  # the fastest steps, as time_ratio
        print(f"common_weight / supernet_weight (the one-scale mixing's step cost, target <= 1.10): {ratio:.3f} "
              f"{'ok' if ratio <= 1.10 else 'MISSED'}")
    if {"search_order1", "search_order2"} <= set(res["variants"]):
        v = res["variants"]
        print(f"order 2 / order 1 iteration: {v['search_order2']['ms_per_step'] / v['search_order1']['ms_per_step']:.2f}")
    if {"example_derived", "example_weight", "supernet_weight"} <= set(res["variants"]):
        v = res["variants"]
        example = v["example_weight"]["ms_per_step_best"] / v["example_derived"]["ms_per_step_best"]
        own = v["supernet_weight"]["time_ratio"]
        gap = example / own - 1
        print(f"public API on examples/gpt.py: supernet weight step {example:.2f}x its derived model, autoln's own "
              f"{own:.2f}x ({gap:+.1%}): {'within' if abs(gap) <= 0.10 else 'OUTSIDE'} 10 %")


def scaling(cfg: Config, rounds: int, warmup: int) -> list[dict]:
    """:func:`measure` of :data:`SCALING_VARIANTS` at 6/12/24 blocks and context 128/256/512."""
    points = [("n_layers", n) for n in (6, 12, 24)] + [("context", c) for c in (128, 256, 512) if c != cfg.model.context]
    rows = []
    for key, value in points:
        point = replace(cfg, model=replace(cfg.model, **{key: value}))
        res = measure(point, list(SCALING_VARIANTS), rounds, warmup)
        v = res["variants"]
        row = {"n_layers": point.model.n_layers, "context": point.model.context,
               "derived_ms": v["derived"]["ms_per_step_best"],
               "supernet_weight_x": v["supernet_weight"]["time_ratio"], "search_order1_x": v["search_order1"]["time_ratio"],
               "supernet_weight_x_median": v["supernet_weight"]["time_ratio_median"],
               "search_order1_x_median": v["search_order1"]["time_ratio_median"],
               "supernet_memory_x": v["supernet_weight"]["memory_ratio"], "search_order1_memory_x": v["search_order1"]["memory_ratio"]}
        rows.append(row)
        print(f"  {row['n_layers']:>2} blocks, context {row['context']:>3} (best steps): weight step {row['supernet_weight_x']:.2f}x, "
              f"order-1 iteration {row['search_order1_x']:.2f}x, memory {row['supernet_memory_x']:.2f}x", file=sys.stderr)
    rows.sort(key=lambda r: (r["context"], r["n_layers"]))
    return rows


def print_scaling(rows: list[dict]) -> None:
    """Print :func:`scaling`'s rows as a Markdown table."""
    print("| blocks | context | derived ms/step (best) | supernet weight step | first-order iteration | supernet memory | first-order memory |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n_layers']} | {r['context']} | {r['derived_ms']:.1f} | {r['supernet_weight_x']:.2f}x ({r['supernet_weight_x_median']:.2f}x) | "
              f"{r['search_order1_x']:.2f}x ({r['search_order1_x_median']:.2f}x) | {r['supernet_memory_x']:.2f}x | {r['search_order1_memory_x']:.2f}x |")
    print("time ratios of the best steps (median of the per-round ratios in brackets)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", metavar="FILE", help="YAML config (model size from 'model', batch and device from 'search')")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[])
    p.add_argument("--rounds", type=int, default=30, help="timed rounds (one step of each variant per round; default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--scaling", action="store_true", help="also the ratio table at 6/12/24 blocks and context 128/256/512")
    p.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s in the run's precision, for MFU")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected names from {list(VARIANTS)}")
    if args.rounds < 1 or args.warmup < 0:
        p.error("--rounds must be >= 1 and --warmup >= 0")
    names = ["derived"] + [n for n in names if n != "derived"]

    def body() -> None:
        cfg = load_config(args.config, args.overrides)
        if args.peak_tflops is not None and args.peak_tflops <= 0:
            raise ConfigError(f"--peak-tflops must be positive, got {args.peak_tflops}")
        result = {"default": measure(cfg, names, args.rounds, args.warmup, args.peak_tflops)}
        print_result(result["default"])
        if args.scaling:
            print("\nscaling (ratios to the derived model; weight step, first-order iteration, peak memory):")
            result["scaling"] = scaling(cfg, args.rounds, args.warmup)
            print_scaling(result["scaling"])
        if args.json:
            write_json_atomic(Path(args.json), result)
            print(f"wrote {args.json}")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
