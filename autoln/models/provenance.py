"""A genotype's ``provenance`` as a run's outputs copy it: bounded in size, saying what was cut
(:func:`bounded_provenance`; the genotype file itself keeps it whole, docs/design.md §6)."""

from __future__ import annotations

import json
from typing import Any, Optional

from autoln.core.errors import cut, quoted

#: Characters of JSON of a genotype's ``provenance`` that a copy of it in a run's outputs keeps
#: at most (:func:`bounded_provenance`). A search's own provenance is a few KiB (6 KiB on the tiny
#: config, tens of KiB for a large sublayer search with its scored genotypes), far below it.
PROVENANCE_LIMIT = 65_536
#: Characters kept of a string field of ``provenance`` that does not fit (a long free-form note).
PROVENANCE_PREVIEW = 4_096
#: Fields that the note of a cut provenance names one by one; the rest are counted.
_NAMED_CUTS = 5


def bounded_provenance(provenance: dict[str, Any], source: str, limit: int = PROVENANCE_LIMIT) -> tuple[dict[str, Any], Optional[str]]:
    """``provenance`` as a run's outputs copy it: unchanged when its JSON is at most ``limit``
    characters; otherwise its top-level fields in order while they fit, a string field that does
    not fit as its first :data:`PROVENANCE_PREVIEW` characters (if those fit), every other field
    that does not fit (or whose name is over 200 characters) left out, and the field
    ``provenance_cut`` saying what was cut, e.g. ``"the provenance of g.json is 10,485,831
    characters of JSON, more than the 65,536 a copy keeps: field 'note' (10,485,760 characters)
    cut to its first 4,096; the whole provenance is in g.json"``.

    Why cut and not refuse: the provenance is free-form and never read to build or train a model
    (only ``data``'s fingerprint, for a note), so a genotype with a large one is still a valid
    genotype; its copies only need to say where it came from, and without a bound a 10 MB
    provenance made every ``metrics.json`` and ``checkpoint.pt`` of its retrains 10 MB larger.

    Args:
        provenance: the genotype's ``provenance`` object (JSON values).
        source: the genotype file, named in the note.
        limit: characters of JSON (indented as :func:`autoln.core.io.write_json_atomic` writes it)
            kept at most, the note included (2 KiB are kept for it).

    Returns:
        ``(provenance, note)``: ``note`` None when nothing was cut, else one sentence for stderr.
    """
    def size(value: Any) -> int:
        return len(json.dumps(value, indent=2, allow_nan=True, default=str))  # as write_json_atomic writes it

    total = size(provenance)
    if total <= limit:
        return provenance, None
    kept: dict[str, Any] = {}
    used, cuts, rest, rest_chars = 2, [], 0, 0
    budget = limit - 2048  # room for the note
    for key, value in provenance.items():
        name = str(key)
        entry = size({name: value}) - 2  # its lines in the object, indented, with the comma
        if len(name) <= 200 and used + entry <= budget:
            kept[name], used = value, used + entry
            continue
        what = "left out"
        if isinstance(value, str) and len(name) <= 200:
            head = value[:PROVENANCE_PREVIEW]
            if used + size({name: head}) - 2 <= budget:
                kept[name], used = head, used + size({name: head}) - 2
                what = f"cut to its first {len(head):,}"
        if len(cuts) < _NAMED_CUTS:
            length = f"{len(value):,} characters" if isinstance(value, str) else f"{size(value):,} characters of JSON"
            cuts.append(f"field {quoted(name, 60)} ({length}) {what}")
        else:
            rest, rest_chars = rest + 1, rest_chars + entry
    if rest:
        cuts.append(f"{rest:,} more fields ({rest_chars:,} characters) left out")
    kept["provenance_cut"] = (f"the provenance of {cut(source)} is {total:,} characters of JSON, more than the {limit:,} a copy "
                              f"keeps: {'; '.join(cuts)}; the whole provenance is in {cut(source)}")
    note = (f"{cut(source)}: field 'provenance' is {total:,} characters of JSON; the copies of the genotype in this run's "
            f"outputs keep {size(kept):,} ({'; '.join(cuts[:2])}{'; ...' if len(cuts) > 2 else ''}; their "
            "provenance.provenance_cut says so)")
    return kept, note
