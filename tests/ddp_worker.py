"""Run by ``tests/test_distributed.py`` under ``torchrun --nproc_per_node 2``: a short search and
a retrain of its genotype through the library, counting the genotype and metrics writes; each
rank then saves its final supernet and derived-model state to ``<out>/rank<r>.pt``.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/ddp_worker.py OUT CONFIG
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The run's settings on top of the config (also used by the test's one-process reference). With
#: dropout: each process applies its rows of the mask one process draws for the whole batch.
OVERRIDES = ["model.dropout=0.2", "search.steps=12", "search.eval_every=6", "search.arch_lr=0.01", "search.arch_warmup_steps=0", "retrain.steps=12", "retrain.eval_every=6",
             "retrain.final_eval_windows=16", "logging.progress=false"]


def main(out: Path, config: str) -> None:
    import torch

    from autoln.core import distributed
    from autoln.retrain import run_retrain as rr
    from autoln.config import load_config
    from autoln.models.genotype import Genotype
    from autoln.oneshot.run_search import run_search

    writes = {"genotype": 0, "metrics": 0}
    save, write_json = Genotype.save, rr.write_json_atomic

    def counting_save(self, path):
        writes["genotype"] += 1
        return save(self, path)

    def counting_write(path, obj):
        writes["metrics"] += 1
        return write_json(path, obj)

    Genotype.save, rr.write_json_atomic = counting_save, counting_write
    cfg = load_config(config, OVERRIDES)
    searched = run_search(cfg, out / "search")
    retrained = rr.run_retrain(cfg, str(searched.path), out / "retrain")
    torch.save({"rank": distributed.rank(), "world": distributed.world_size(), "writes": writes,
                "supernet": searched.model.state_dict(), "derived": retrained.model.state_dict(),
                "search_valid": searched.valid, "retrain_valid": retrained.valid},
               out / f"rank{distributed.rank()}.pt")
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
