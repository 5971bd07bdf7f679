"""autoln: differentiable search for where a Transformer's layer norms should go.

Modules, in dependency order: :mod:`errors`, :mod:`placements` (the search space),
:mod:`config`, :mod:`io`, :mod:`data`, :mod:`model`, :mod:`supernet`, :mod:`genotype`,
:mod:`training`, :mod:`architect` (the bilevel step), :mod:`tb`, :mod:`run_search`,
:mod:`run_retrain`, :mod:`cli`.
"""

__version__ = "0.1.0"
