"""autoln: differentiable search for where a Transformer's layer norms should go.

The package is one folder per job, in dependency order (docs/design.md §12): :mod:`space` (the
candidates' formulas) and :mod:`core` (errors, files, locks, torch.distributed, TensorBoard),
:mod:`config`, :mod:`data`, :mod:`models` (the Transformer, the supernet, the genotype),
:mod:`engine` (the training step, checkpoints, workers), :mod:`oneshot` (the bilevel search and the
read-off), :mod:`retrain`, :mod:`tune`, :mod:`race`, and on top the two faces, :mod:`api` (your
own model) and :mod:`cli` (``search.py``, ``retrain.py``), with :mod:`diagnose`.

The public API for a model of your own (README, *Your own model*), imported on first use:
``autoln.Site``, ``autoln.QKNorm``, ``autoln.SearchModel``, ``autoln.search``, ``autoln.derive``,
``autoln.SiteGenotype``, ``autoln.load_derived``, ``autoln.SearchConfig``,
``autoln.deepnorm_weights``, ``autoln.compare_genotypes`` (:mod:`api.comparing`),
``autoln.race_genotypes`` (:mod:`api.racing`) and ``autoln.map_state_dict`` (:mod:`api.state_dicts`).
"""

__version__ = "0.1.0"

_PUBLIC = {"Site": "models.site", "QKNorm": "models.qk_norm", "SearchModel": "api.search_model", "search": "api.searching",
           "derive": "api.deriving", "SiteGenotype": "api.site_genotype", "load_derived": "api.deriving",
           "SearchOutcome": "api.searching", "SearchConfig": "config", "deepnorm_weights": "space.branches",
           "compare_genotypes": "api.comparing", "Comparison": "api.comparing", "race_genotypes": "api.racing",
           "RaceOutcome": "api.racing", "map_state_dict": "api.state_dicts"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """The public names, imported on first use (``import autoln`` alone stays light)."""
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'autoln' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's own globals and the lazily imported public names (PEP 562), so ``dir(autoln)``
    and tab completion show ``autoln.search`` before its first use."""
    return sorted(set(globals()) | set(_PUBLIC))
