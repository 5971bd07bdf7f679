"""The genotype: the chosen placement per site, as one self-describing JSON file (docs/design.md §6).

Fields: ``format`` ("autoln.genotype"), ``version`` (1), ``candidates`` (ordered candidate
names of the search), ``granularity`` ("layer" | "sublayer"), ``placements`` (one entry per
block: a name, or ``{"attn": name, "ffn": name}``), ``probabilities`` (the final softmax
weights, same nesting as ``placements``, each a list ordered as ``candidates``), ``model``
(``n_layers, d_model, n_heads, d_ff, context, vocab_size, norm``) and ``provenance``
(resolved config, seed, data fingerprint, package versions, metrics, creation time).
``provenance`` is free-form: a genotype file keeps it whole, and the copies of a genotype in a
run's outputs (a retrain's ``metrics.json`` and ``checkpoint.pt``) keep at most
:data:`PROVENANCE_LIMIT` characters of it, saying what was cut (:func:`bounded_provenance`).

Named baselines (published hand-designed genotypes): ``all-pre``, ``all-post``,
``all-deepnorm``, ``mix-ln`` (Li, Yin, Liu 2024: the first ``round(0.25 N)`` blocks
Post-LN, the rest Pre-LN; halves round up) and ``pre-post`` (the layered strategy
practitioners report for 12-block models: the lower ``round(N / 2)`` blocks Pre-LN, the rest
Post-LN; mix-ln's opposite order).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from autoln.config import AFFINES, GRANULARITIES, ModelConfig
from autoln.core.errors import GenotypeError, cut, quoted
from autoln.core.io import DuplicateKey, json_safe, loads_strict, write_json_atomic
from autoln.space.placements import NORMS, PLACEMENTS, parse_name, placement_names

FORMAT = "autoln.genotype"
#: The format of :class:`autoln.api.SiteGenotype` (``autoln.search``'s genotype of a user's model).
SITE_FORMAT = "autoln.site-genotype"
VERSION = 1
MODEL_KEYS = ("n_layers", "d_model", "n_heads", "d_ff", "context", "vocab_size", "norm")
FIELDS = ("format", "version", "candidates", "granularity", "placements", "probabilities", "model", "provenance")
#: Named baselines offered by default (``--compare``, validation): one ``all-<name>`` per
#: placement, Mix-LN and the layered ``pre-post``. Any ``all-<candidate name>`` is a baseline
#: too, e.g. ``all-pre:fixed`` (:func:`is_baseline`).
BASELINES = ("all-pre", "all-post", "all-deepnorm", "mix-ln", "pre-post", "all-peri", "all-outnorm", "all-lns", "all-none")
#: Optional keys of a genotype's ``model`` (absent in older files): ``affine`` (default learnable).
OPTIONAL_MODEL_KEYS = ("affine",)


def is_baseline(name: str) -> bool:
    """True for a named baseline: one of :data:`BASELINES` or ``all-<candidate name>``
    (``all-pre:fixed``)."""
    return name in BASELINES or (name.startswith("all-") and name[4:] in placement_names())
SUM_TOL = 1e-4

Entry = Union[str, dict]


@dataclass
class Genotype:
    """A validated genotype; build with :meth:`from_dict`, :meth:`load`, :func:`from_supernet`
    or :func:`baseline`. ``placements``/``probabilities`` follow the JSON nesting above."""

    candidates: list[str]
    granularity: str
    placements: list[Entry]
    probabilities: list[Any]
    model: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)

    def block_placements(self) -> list[tuple[str, str]]:
        """Per block ``(attention placement, FFN placement)``; length ``model["n_layers"]``."""
        return [(p, p) if isinstance(p, str) else (p["attn"], p["ffn"]) for p in self.placements]

    def site_probabilities(self) -> np.ndarray:
        """The probabilities as a float64 array ``(n_sites, K)``, rows in the order of
        :func:`autoln.models.supernet.site_names` (block ``i``'s attention row before its FFN row)."""
        return np.asarray(site_rows(self.probabilities, self.granularity), dtype=np.float64)

    def model_config(self, base: ModelConfig | None = None) -> ModelConfig:
        """A :class:`ModelConfig` with this genotype's dimensions; other fields (dropout) from
        ``base``. Raises ConfigError if the dimensions are inconsistent."""
        from dataclasses import replace

        dims = {k: self.model[k] for k in MODEL_KEYS + OPTIONAL_MODEL_KEYS if k != "vocab_size" and k in self.model}
        dims.setdefault("affine", "learnable")
        cfg = replace(base or ModelConfig(), **dims, candidates=list(self.candidates), granularity=self.granularity)
        cfg.validate()
        return cfg

    def describe(self) -> str:
        """Compact one-line form, e.g. ``post post pre pre`` or ``post/pre pre/pre``."""
        return " ".join(p if isinstance(p, str) else f"{p['attn']}/{p['ffn']}" for p in self.placements)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of docs/design.md §6."""
        return {
            "format": FORMAT, "version": VERSION, "candidates": list(self.candidates),
            "granularity": self.granularity, "placements": self.placements,
            "probabilities": self.probabilities, "model": dict(self.model), "provenance": self.provenance,
        }

    def record(self, source: str) -> tuple[dict[str, Any], Optional[str]]:
        """:meth:`to_dict` for a copy of this genotype in a run's outputs (a retrain's
        ``metrics.json`` as ``genotype_file`` and ``checkpoint.pt``, a comparison's reused
        runs), with ``provenance`` bounded by :func:`bounded_provenance`: a copy records which
        genotype was trained and where it came from; the genotype file ``source`` keeps the
        whole provenance. Returns ``(dict, note)``, ``note`` None when nothing was cut, else
        one sentence for the user (the copy's ``provenance.provenance_cut`` has the details)."""
        provenance, note = bounded_provenance(self.provenance, source)
        return {**self.to_dict(), "provenance": provenance}, note

    def save(self, path: str | Path) -> Path:
        """Write the genotype JSON atomically, after checking it as :meth:`load` will (so no
        file is written that its own loader refuses, e.g. NaN probabilities). Returns the path.

        Raises:
            GenotypeError: the genotype fails :meth:`from_dict`'s checks (nothing is written).
        """
        Genotype.from_dict(json_safe(self.to_dict()), source=f"the genotype to write to {path}")  # as written: NaN -> null
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Genotype":
        """Read and validate a genotype file.

        Raises:
            GenotypeError: unreadable file, invalid JSON (an integer of more than 4,300
                digits, Python's limit, included; an object with one key twice), or any check
                of :meth:`from_dict` failing; the message names the file and the field.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise GenotypeError(f"cannot read genotype file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            obj = loads_strict(text)
        except DuplicateKey as exc:
            raise GenotypeError(f"genotype file {path}: {exc}") from None
        except ValueError as exc:  # JSONDecodeError, or an integer of more than 4,300 digits (Python's limit)
            raise GenotypeError(f"genotype file {path} is not valid JSON: {cut(str(exc))}") from None
        return cls.from_dict(obj, source=str(path))

    @classmethod
    def from_dict(cls, obj: Any, source: str = "genotype") -> "Genotype":
        """Validate a genotype object (docs/design.md §6) and build a :class:`Genotype`.

        Rejects, naming the field: a non-object, missing or unknown fields, wrong format or
        version, unknown or duplicate candidates, a bad granularity, model dimensions that are
        not positive integers (or a width not divisible by the heads, or an unknown norm), a
        placement count different from ``model.n_layers``, a placement that is not one of
        ``candidates``, probabilities of the wrong shape, negative, non-finite or not summing
        to 1 (tolerance 1e-4) per site.

        A field's name and value from the file are quoted bounded (:func:`autoln.core.errors.cut`,
        :func:`autoln.core.errors.quoted`: at most about 240 characters each), so a huge value or
        unknown key gives one short line, not a 10 MB one. ``provenance`` is free-form and kept
        whole here; its copies in a run's outputs are bounded (:meth:`Genotype.record`).

        Raises:
            GenotypeError: the first failed check, as ``<source>: field '<name>': <problem>``.
        """

        def fail(name: str, problem: str) -> GenotypeError:
            return GenotypeError(f"{source}: field '{cut(name)}': {problem}")

        if not isinstance(obj, dict):
            raise GenotypeError(f"{source}: expected a JSON object with fields {list(FIELDS)}, got {type(obj).__name__}")
        check_format(obj, source)
        for name in FIELDS:
            if name not in obj:
                raise fail(name, "missing")
        for name in obj:
            if name not in FIELDS:
                raise fail(name, f"unknown field; expected only {list(FIELDS)}")
        if type(obj["version"]) is not int or obj["version"] != VERSION:
            raise fail("version", f"expected {VERSION}, got {quoted(obj['version'])}")
        cands = obj["candidates"]
        if not isinstance(cands, list) or not cands or not all(isinstance(c, str) for c in cands):
            raise fail("candidates", "expected a non-empty list of placement names")
        for c in cands:
            if c not in placement_names():
                raise fail("candidates", f"unknown candidate {quoted(c)}; known: {placement_names()}")
        if len(set(cands)) != len(cands):
            raise fail("candidates", f"duplicate names in {quoted(cands)}")
        gran = obj["granularity"]
        if gran not in GRANULARITIES:
            raise fail("granularity", f"expected one of {list(GRANULARITIES)}, got {quoted(gran)}")
        model = obj["model"]
        if not isinstance(model, dict):
            raise fail("model", "expected an object")
        for key in MODEL_KEYS:
            if key not in model:
                raise fail(f"model.{key}", "missing")
        for key in model:
            if key not in MODEL_KEYS + OPTIONAL_MODEL_KEYS:
                raise fail(f"model.{key}", f"unknown field; expected {list(MODEL_KEYS + OPTIONAL_MODEL_KEYS)}")
        if model.get("affine", "learnable") not in AFFINES:
            raise fail("model.affine", f"expected one of {list(AFFINES)}, got {quoted(model['affine'])}")
        for key in MODEL_KEYS[:-1]:
            if type(model[key]) is not int or model[key] <= 0:
                raise fail(f"model.{key}", f"expected a positive integer, got {quoted(model[key])}")
        if model["d_model"] % model["n_heads"]:
            raise fail("model.d_model", f"{cut(model['d_model'])} is not divisible by model.n_heads={cut(model['n_heads'])}")
        if not isinstance(model["norm"], str) or model["norm"] not in NORMS:
            raise fail("model.norm", f"expected one of {sorted(NORMS)}, got {quoted(model['norm'])}")
        placements, probs = obj["placements"], obj["probabilities"]
        for name, value in (("placements", placements), ("probabilities", probs)):
            if not isinstance(value, list):
                raise fail(name, "expected a list with one entry per block")
            if len(value) != model["n_layers"]:
                raise fail(name, f"has {len(value):,} entries but model.n_layers is {cut(model['n_layers'])}")
        for i, (entry, prob) in enumerate(zip(placements, probs)):
            if gran == "layer":
                sites = [(f"placements[{i}]", entry, f"probabilities[{i}]", prob)]
            else:
                for name, value in ((f"placements[{i}]", entry), (f"probabilities[{i}]", prob)):
                    if not isinstance(value, dict) or set(value) != {"attn", "ffn"}:
                        raise fail(name, "expected an object with exactly the keys 'attn' and 'ffn' (granularity 'sublayer')")
                sites = [(f"placements[{i}].{s}", entry[s], f"probabilities[{i}].{s}", prob[s]) for s in ("attn", "ffn")]
            for pname, name, qname, p in sites:
                if not isinstance(name, str) or name not in cands:
                    raise fail(pname, f"expected one of the candidates {cands}, got {quoted(name)}")
                if not isinstance(p, list) or len(p) != len(cands):
                    raise fail(qname, f"expected a list of {len(cands)} probabilities (one per candidate)")
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p):
                    raise fail(qname, "expected numbers")
                if not all(math.isfinite(v) and v >= 0 for v in p):
                    raise fail(qname, f"probabilities must be finite and non-negative, got {quoted(p)}")
                if abs(sum(p) - 1.0) > SUM_TOL:
                    raise fail(qname, f"probabilities sum to {sum(p):.6f}, expected 1")
        if not isinstance(obj["provenance"], dict):
            raise fail("provenance", "expected an object")
        return cls(list(cands), gran, placements, probs, dict(model), obj["provenance"])


#: Characters of JSON of a genotype's ``provenance`` that a copy of it in a run's outputs keeps
#: at most (:func:`bounded_provenance`). A search's own provenance is a few KiB (6 KiB on the tiny
#: config, tens of KiB for a large sublayer search with its scored genotypes), far below it.
PROVENANCE_LIMIT = 65_536
#: Characters kept of a string field of ``provenance`` that does not fit (a long free-form note).
PROVENANCE_PREVIEW = 4_096
#: Fields that the note of a cut provenance names one by one; the rest are counted.
_NAMED_CUTS = 5


def check_format(obj: dict, source: str) -> None:
    """Refuse, in one line, a JSON object that is not search.py's genotype: autoln.search's
    genotype of a user's model (format :data:`SITE_FORMAT`, with how to apply it), or another
    tool's file (no ``format``, or another one): "not an autoln genotype".

    Raises:
        GenotypeError: as above."""
    if obj.get("format") == SITE_FORMAT:
        raise GenotypeError(f"{source}: this is a genotype of autoln.search for a model of your own (format {SITE_FORMAT!r}, "
                            f"sites by module name), not search.py's genotype of autoln's own model (format {FORMAT!r}) "
                            "that retrain.py takes; apply it in Python: autoln.derive(model, autoln.SiteGenotype.load(path)), "
                            "then train the model your way, or rank it with autoln.compare_genotypes")
    if obj.get("format") != FORMAT:
        what = "no field 'format'" if "format" not in obj else f"field 'format' is {quoted(obj['format'])}"
        raise GenotypeError(f"{source}: not an autoln genotype ({what}; expected format {FORMAT!r}, the genotype.json that "
                            f"search.py writes, with fields {list(FIELDS)})")


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


def model_dims(cfg: ModelConfig, vocab_size: int) -> dict[str, Any]:
    """The genotype's ``model`` field for a model config and vocabulary size."""
    return {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_ff": cfg.d_ff,
            "context": cfg.context, "vocab_size": vocab_size, "norm": cfg.norm, "affine": cfg.affine}


def nest_sites(rows: list, granularity: str) -> list:
    """Per-site values (rows of :func:`autoln.models.supernet.site_names`) in the genotype's nesting:
    one entry per block, or ``{"attn": ..., "ffn": ...}`` per block for ``sublayer``."""
    if granularity == "layer":
        return list(rows)
    return [{"attn": rows[2 * i], "ffn": rows[2 * i + 1]} for i in range(len(rows) // 2)]


def site_rows(nested: list, granularity: str) -> list:
    """Inverse of :func:`nest_sites`: the per-site rows, block ``i``'s attention before its FFN."""
    if granularity == "layer":
        return list(nested)
    return [e[s] for e in nested for s in ("attn", "ffn")]


def from_probabilities(probs: np.ndarray, cfg: ModelConfig, vocab_size: int, provenance: dict | None = None,
                       choices: list[int] | None = None) -> Genotype:
    """Derive the genotype: per site the candidate ``choices[i]`` (perturbation-based selection,
    :mod:`autoln.oneshot.selection`) or, without ``choices``, the argmax of ``probs`` (DARTS §2.4).

    Args:
        probs: ``(n_sites, K)`` mixing probabilities, rows as :func:`autoln.models.supernet.site_names`.
        cfg: the search's model config (candidates, granularity, dimensions).
        vocab_size: vocabulary size of the data.
        provenance: stored as is.
        choices: per site a candidate index, or None for the argmax.

    Raises:
        ValueError: ``choices`` of the wrong length or out of range.
    """
    cands = cfg.searched_candidates()
    rows = [[float(v) for v in row / row.sum()] for row in np.asarray(probs, dtype=np.float64)]
    if choices is None:
        choices = [int(np.argmax(r)) for r in rows]
    if len(choices) != len(rows) or not all(0 <= c < len(cands) for c in choices):
        raise ValueError(f"choices: expected {len(rows)} candidate indices in [0, {len(cands)}), got {choices}")
    names = [cands[c] for c in choices]
    return Genotype(cands, cfg.granularity, nest_sites(names, cfg.granularity), nest_sites(rows, cfg.granularity),
                    model_dims(cfg, vocab_size), provenance or {})


def named_blocks(name: str, n_layers: int) -> list[str]:
    """The placement of each of ``n_layers`` blocks in the named genotype ``name``:
    ``all-<candidate>`` (every block that candidate), ``mix-ln`` (the first ``floor(0.25 N + 0.5)``
    blocks ``post``, the rest ``pre``; Li, Yin, Liu 2024, "Mix-LN") or ``pre-post`` (the first
    ``floor(0.5 N + 0.5)`` blocks ``pre``, the rest ``post``). Halves round up.

    Raises:
        GenotypeError: unknown name."""
    n = n_layers
    if name.startswith("all-") and is_baseline(name):
        return [name[4:]] * n
    if name == "mix-ln":
        n_post = math.floor(0.25 * n + 0.5)
        return ["post"] * n_post + ["pre"] * (n - n_post)
    if name == "pre-post":
        n_pre = math.floor(0.5 * n + 0.5)
        return ["pre"] * n_pre + ["post"] * (n - n_pre)
    raise GenotypeError(f"unknown baseline {name!r}; expected a genotype file or one of {list(BASELINES)}")


def baseline(name: str, cfg: ModelConfig, vocab_size: int) -> Genotype:
    """A named published genotype at ``cfg``'s size: ``all-<candidate>`` (every site that
    candidate, e.g. ``all-pre``, ``all-peri``, ``all-pre:fixed``), ``mix-ln`` (first
    ``floor(0.25 N + 0.5)`` blocks ``post``, the rest ``pre``; Li et al. 2024) or ``pre-post``
    (first ``floor(0.5 N + 0.5)`` blocks ``pre``, the rest ``post``). With ``cfg.affine ==
    "fixed"`` every placement with norms takes its ``:fixed`` form (``pre`` -> ``pre:fixed``),
    as the final norm does; ``search`` (a search option) leaves the published learnable gains.

    Raises:
        GenotypeError: unknown name.
    """
    names = named_blocks(name, cfg.n_layers)
    if cfg.affine == "fixed":  # every norm's gain and bias fixed, the sites' as the final norm's
        names = [n + ":fixed" if not n.endswith(":fixed") and PLACEMENTS[parse_name(n)[0]].has_norm else n for n in names]
    cands = sorted(set(names), key=placement_names().index)
    probs = [[1.0 if c == p else 0.0 for c in cands] for p in names]
    return Genotype(cands, "layer", names, probs, model_dims(cfg, vocab_size), {"baseline": name})


def over_candidates(genotype: Genotype, candidates: list[str]) -> Genotype:
    """``genotype`` listing ``candidates`` (then any of its own placements they lack) as its
    ``candidates``, each site's probabilities one-hot on its placement: a named answer that
    still says what the search searched (``mix-ln`` after a search over pre, post and
    deepnorm). The placements, and so the model a retrain builds, are unchanged."""
    from dataclasses import replace

    cands = list(candidates) + [c for c in genotype.candidates if c not in candidates]
    rows = [[1.0 if c == p else 0.0 for c in cands] for p in site_rows(genotype.placements, genotype.granularity)]
    return replace(genotype, candidates=cands, probabilities=nest_sites(rows, genotype.granularity))


#: A search folder's read-off once its race began (``genotype.json`` is renamed so, and the race
#: writes its answer as ``genotype.json`` when it ends: :mod:`autoln.race.run_race`).
SUPERNET_FILE = "supernet_genotype.json"


def unfinished_race_hint(spec: str) -> str:
    """For a ``--genotype`` file that does not exist: when it is a search folder's
    ``genotype.json`` and the folder holds :data:`SUPERNET_FILE` (a race begun, not finished),
    the clause that says so, with the command that continues a stopped race and where the
    read-off is meanwhile; else ``""``."""
    from autoln.core.commands import script_line

    folder = Path(spec).parent
    if Path(spec).name != "genotype.json" or not (folder / SUPERNET_FILE).is_file():
        return ""
    again = script_line("search.py", "--resume", "--out", folder, "--config", folder / "config.yaml")
    return (f": the race of the search in {folder} has not finished, and it writes genotype.json (the answer) when it "
            f"ends; a stopped race continues with {again}; meanwhile {folder / SUPERNET_FILE} holds the supernet's read-off")
