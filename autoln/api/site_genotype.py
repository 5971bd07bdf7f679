"""The genotype of a user's model: :class:`SiteGenotype`, one placement per site by the site's
module name (JSON format :data:`autoln.models.genotype.SITE_FORMAT`), read from what a user
passes (:func:`as_site_genotype`), and the notes on a read-off's weak answers
(:func:`genotype_notes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autoln.core.io import loads_strict
from autoln.core.errors import GenotypeError, cut, quoted
from autoln.models.genotype import FORMAT, SITE_FORMAT, finite_number
from autoln.space.placements import placement_names


@dataclass
class SiteGenotype:
    """The answer of :func:`search` for a user's model: the chosen placement of each site, by the
    site's module name, with the final probabilities (``K`` per site, ordered as
    ``candidates``) and free-form ``provenance``; where the model has :class:`autoln.QKNorm` s,
    ``qk`` (the QK-norm choice by module name, over ``qk_candidates``, with
    ``qk_probabilities``). JSON format ``autoln.site-genotype`` version 1 (:meth:`save`,
    :meth:`load`), the QK-norm choice in an optional field ``qk_norm`` (``{"candidates",
    "choices", "probabilities"}``, by module name; absent in older files: no QK-norm choice).
    """

    candidates: list[str]
    sites: dict[str, str]
    probabilities: dict[str, list[float]]
    provenance: dict[str, Any] = field(default_factory=dict)
    qk: dict[str, str] = field(default_factory=dict)
    qk_candidates: list[str] = field(default_factory=list)
    qk_probabilities: dict[str, list[float]] = field(default_factory=dict)

    def describe(self) -> str:
        """The placements in site order, e.g. ``post pre pre post``; with QK-norm somewhere the
        QK-norms' choices follow a bar: ``pre pre | qk none``."""
        text = " ".join(self.sites.values())
        return f"{text} | {' '.join(self.qk.values())}" if any(c != "none" for c in self.qk.values()) else text

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        out = {"format": SITE_FORMAT, "version": 1, "candidates": list(self.candidates), "sites": dict(self.sites),
               "probabilities": {k: list(v) for k, v in self.probabilities.items()}, "provenance": self.provenance}
        if self.qk:
            out["qk_norm"] = {"candidates": list(self.qk_candidates), "choices": dict(self.qk),
                              "probabilities": {k: list(v) for k, v in self.qk_probabilities.items()}}
        return out

    @classmethod
    def from_dict(cls, obj: Any, source: str = "site genotype") -> "SiteGenotype":
        """Validate and build.

        Raises:
            GenotypeError: naming ``source`` and the field: wrong format or version, an unknown
                candidate, a site whose placement is not a candidate, probabilities that are not
                ``K`` finite non-negative numbers summing to 1. Names and values from the file
                are quoted bounded (:func:`autoln.core.errors.quoted`), so a huge one still gives
                one short line.
        """
        def fail(key: str, why: str) -> GenotypeError:
            return GenotypeError(f"{source}: field '{cut(key)}': {why}")

        if isinstance(obj, dict) and obj.get("format") == FORMAT:
            raise GenotypeError(f"{source}: this is search.py's genotype of autoln's own model (format {FORMAT!r}), not "
                                f"autoln.search's genotype of a model of your own (format {SITE_FORMAT!r}); retrain it with "
                                "python retrain.py --genotype <its genotype.json>")
        if not isinstance(obj, dict) or obj.get("format") != SITE_FORMAT or obj.get("version") != 1:
            raise fail("format", f"expected format {SITE_FORMAT!r} version 1 (a genotype of autoln.search)")
        cands = obj.get("candidates")
        if not isinstance(cands, list) or len(cands) < 1 or any(c not in placement_names() for c in cands):
            raise fail("candidates", f"expected names of {placement_names()}, got {quoted(cands)}")
        sites, probs = obj.get("sites"), obj.get("probabilities")
        if not isinstance(sites, dict) or not sites:
            raise fail("sites", "expected an object: site module name -> placement")
        if not isinstance(probs, dict) or set(probs) != set(sites):
            raise fail("probabilities", "expected one list per site, for the same sites")
        for name, placement in sites.items():
            if placement not in cands:
                raise fail(f"sites.{name}", f"expected one of the candidates {quoted(cands)}, got {quoted(placement)}")
            row = probs[name]
            if not isinstance(row, list) or len(row) != len(cands) or not all(finite_number(v) and v >= 0 for v in row) \
                    or abs(sum(row) - 1.0) > 1e-4:
                raise fail(f"probabilities.{name}", f"expected {len(cands)} finite non-negative numbers summing to 1, got {quoted(row)}")
        provenance = obj.get("provenance", {})
        qk, qk_cands, qk_probs = check_qk_choices(obj.get("qk_norm"), fail)
        return cls(list(cands), dict(sites), {k: [float(v) for v in r] for k, r in probs.items()},
                   provenance if isinstance(provenance, dict) else {}, qk, qk_cands, qk_probs)

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (checked as :meth:`load` will first). Returns the path."""
        from autoln.core.io import json_safe, write_json_atomic

        SiteGenotype.from_dict(json_safe(self.to_dict()), source=f"the genotype to write to {path}")
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "SiteGenotype":
        """Read and validate a file written by :meth:`save`.

        Raises:
            GenotypeError: unreadable, not JSON, an object with one key twice, or a check of
                :meth:`from_dict` failing.
        """
        try:
            obj = loads_strict(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # DuplicateKey too: one key twice
            raise GenotypeError(f"cannot read site genotype {path}: {exc}") from None
        return cls.from_dict(obj, source=str(path))


def check_qk_choices(field_: Any, fail) -> tuple[dict[str, str], list[str], dict[str, list[float]]]:
    """A site genotype's optional ``qk_norm`` field checked: ``(choices, candidates,
    probabilities)``, empty when absent. ``fail(field, why)`` builds the error.

    Raises:
        GenotypeError: not an object with ``candidates`` (names of
            :data:`autoln.space.qk.QK_NORMS`), ``choices`` (module name -> candidate) and
            ``probabilities`` (module name -> finite non-negative numbers summing to 1, or none)."""
    from autoln.space.qk import QK_NORMS

    if field_ is None:
        return {}, [], {}
    if not isinstance(field_, dict) or set(field_) != {"candidates", "choices", "probabilities"}:
        raise fail("qk_norm", "expected an object with the keys 'candidates', 'choices' and 'probabilities'")
    cands, choices, probs = field_["candidates"], field_["choices"], field_["probabilities"]
    if not isinstance(cands, list) or not cands or any(not isinstance(c, str) or c not in QK_NORMS for c in cands):
        raise fail("qk_norm.candidates", f"expected names of {list(QK_NORMS)}, got {quoted(cands)}")
    if len(set(cands)) != len(cands):
        raise fail("qk_norm.candidates", f"a name given twice in {quoted(cands)}")
    if not isinstance(choices, dict) or not choices:
        raise fail("qk_norm.choices", f"expected an object: QK-norm module name -> one of {quoted(cands)}")
    for name, choice in choices.items():
        if not isinstance(choice, str) or choice not in cands:
            raise fail(f"qk_norm.choices.{name}", f"expected one of {quoted(cands)}, got {quoted(choice)}")
    if not isinstance(probs, dict) or not set(probs) <= set(choices):
        raise fail("qk_norm.probabilities", "expected an object: QK-norm module name -> probabilities")
    for name, row in probs.items():
        if not isinstance(row, list) or len(row) != len(cands) or not all(finite_number(v) and v >= 0 for v in row) \
                or abs(sum(row) - 1.0) > 1e-4:
            raise fail(f"qk_norm.probabilities.{name}", f"expected {len(cands)} finite non-negative numbers summing to 1")
    return dict(choices), list(cands), {k: [float(v) for v in r] for k, r in probs.items()}


def as_site_genotype(genotype: Any, where: str) -> SiteGenotype:
    """``genotype`` as a :class:`SiteGenotype`: one as it is, or the path of a ``genotype.json``
    that :meth:`SiteGenotype.save` wrote (read and checked).

    Raises:
        GenotypeError: naming ``where`` and what was given: a string that is no file (a
            placement name among them: the baselines put one placement at every site), search.py's
            :class:`autoln.models.genotype.Genotype` (autoln's own model: retrain.py), anything else."""
    from autoln.models.genotype import Genotype

    if isinstance(genotype, SiteGenotype):
        return genotype
    expected = "expected an autoln.SiteGenotype (autoln.search's outcome.genotype) or the path of its genotype.json"
    if isinstance(genotype, (str, Path)):
        if Path(genotype).is_file():
            return SiteGenotype.load(genotype)
        hint = (f"; {genotype!r} is a placement: for it at every site use baselines=[{genotype!r}] of autoln.compare_genotypes"
                if str(genotype) in placement_names() else "")
        raise GenotypeError(f"{where}: {expected}, got {str(genotype)!r}, which is no file{hint}")
    if isinstance(genotype, Genotype):
        raise GenotypeError(f"{where}: this is search.py's genotype of autoln's own model (autoln.genotype.Genotype, format "
                            f"{FORMAT!r}); retrain it with python retrain.py --genotype <its genotype.json>. {expected}")
    raise GenotypeError(f"{where}: {expected}, got a {type(genotype).__name__}")


def genotype_notes(genotype: SiteGenotype, seed: int = 0) -> list[str]:
    """The notes ``search.py`` prints on a read-off's weak answers
    (:func:`autoln.oneshot.selection.site_notes`: arbitrary choices, ties of the loss rises and how they
    were broken, rises or scores overruling the largest probability, no clear winner), for a
    site genotype, one line each; the no-clear-winner line says how to check across seeds."""
    from autoln.oneshot.selection import site_notes

    names = list(genotype.sites)
    rises = genotype.provenance.get("loss_rises")
    notes = []
    for kind, line in site_notes(names, genotype.candidates, [genotype.sites[n] for n in names],
                                 np.array([genotype.probabilities[n] for n in names]),
                                 [rises[n] for n in names] if rises else None, scored="search" in genotype.provenance):
        if kind == "undecided":
            line += (f"; check the answer's agreement across seeds: autoln.search(..., seed={seed + 1}) and "
                     f"seed={seed + 2} on fresh models")
        notes.append(line)
    return notes
