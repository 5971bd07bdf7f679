"""autoln: differentiable search for where a Transformer's layer norms should go.

Modules, in dependency order: :mod:`errors`, :mod:`placements`, :mod:`branches` (the search space),
:mod:`config`, :mod:`io`, :mod:`data`, :mod:`model`, :mod:`supernet`, :mod:`genotype`,
:mod:`training`, :mod:`architect` (the bilevel step), :mod:`selection`, :mod:`api` (your own
model), :mod:`tb`, :mod:`run_search`, :mod:`run_retrain`, :mod:`cli`.

The public API for a model of your own (README, *Your own model*), imported on first use:
``autoln.Site``, ``autoln.SearchModel``, ``autoln.search``, ``autoln.derive``,
``autoln.SiteGenotype``, ``autoln.load_derived``, ``autoln.SearchConfig``,
``autoln.deepnorm_weights``, ``autoln.compare_genotypes`` and ``autoln.race_genotypes`` (:mod:`api_compare`).
"""

__version__ = "0.1.0"

_PUBLIC = {"Site": "model", "SearchModel": "api", "search": "api", "derive": "api", "SiteGenotype": "api",
           "load_derived": "api", "SearchOutcome": "api", "SearchConfig": "config", "deepnorm_weights": "branches",
           "compare_genotypes": "api_compare", "Comparison": "api_compare", "race_genotypes": "api_compare",
           "RaceOutcome": "api_compare"}
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
