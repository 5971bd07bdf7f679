"""TODO face of api."""

from autoln.api._api import (  # noqa: F401
    SITE_FORMAT,
    SearchModel,
    SiteGenotype,
    alpha_travel_warning,
    as_number,
    as_pair,
    as_site_genotype,
    check_build,
    check_names,
    default_config,
    derive,
    genotype_notes,
    load_derived,
    search,
    searchable_sites,
)
