"""The Python API for a model of your own (the README's *Your own model*): its sites
(:mod:`autoln.api.sites`), the search (:mod:`autoln.api.searching`, on the supernet of
:mod:`autoln.api.search_model`), the derived model (:mod:`autoln.api.deriving`), the genotypes
(:mod:`autoln.api.site_genotype`), and the comparison and the race of genotypes by real
trainings (:mod:`autoln.api.comparing`, :mod:`autoln.api.racing`), and a plain model's state
dict into the model with sites and back (:mod:`autoln.api.state_dicts`).
"""

from autoln.api.comparing import Comparison, compare_genotypes
from autoln.api.deriving import derive, load_derived
from autoln.api.racing import RaceOutcome, race_genotypes
from autoln.api.search_model import SearchModel
from autoln.api.search_settings import alpha_travel_warning, default_config
from autoln.api.searching import SearchOutcome, search
from autoln.api.site_genotype import SiteGenotype, as_site_genotype, genotype_notes
from autoln.api.sites import as_number, as_pair, check_build, check_names, searchable_sites
from autoln.api.state_dicts import map_state_dict
from autoln.models.genotype import SITE_FORMAT

__all__ = [
    "SITE_FORMAT",
    "Comparison",
    "RaceOutcome",
    "SearchModel",
    "SearchOutcome",
    "SiteGenotype",
    "alpha_travel_warning",
    "as_number",
    "as_pair",
    "as_site_genotype",
    "check_build",
    "check_names",
    "compare_genotypes",
    "default_config",
    "derive",
    "genotype_notes",
    "load_derived",
    "map_state_dict",
    "race_genotypes",
    "search",
    "searchable_sites",
]
