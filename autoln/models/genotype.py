"""The genotype: the chosen placement per site, as one self-describing JSON file (docs/design.md §6).

Fields: ``format`` ("autoln.genotype"), ``version`` (1), ``candidates`` (ordered candidate
names of the search), ``granularity`` ("layer" | "sublayer"), ``placements`` (one entry per
block: a name, or ``{"attn": name, "ffn": name}``), ``probabilities`` (the final softmax
weights, same nesting as ``placements``, each a list ordered as ``candidates``), ``model``
(``n_layers, d_model, n_heads, d_ff, context, vocab_size, norm``) and ``provenance``
(resolved config, seed, data fingerprint, package versions, metrics, creation time).
Optional: ``qk_norm`` (the QK-norm choice beside the placements, :mod:`autoln.space.qk`):
``{"candidates": [...], "choices": [one per block], "probabilities": [one list per block]}``;
a file without it (every file written before it existed) has no QK-norm anywhere, as one whose
choices are all ``none``.
``provenance`` is free-form: a genotype file keeps it whole, and the copies of a genotype in a
run's outputs (a retrain's ``metrics.json`` and ``checkpoint.pt``) keep at most
:data:`PROVENANCE_LIMIT` characters of it, saying what was cut (:func:`bounded_provenance`).

Named baselines (published hand-designed genotypes): ``all-pre``, ``all-post``,
``all-deepnorm``, ``mix-ln`` (Li, Yin, Liu 2024: the first ``round(0.25 N)`` blocks
Post-LN, the rest Pre-LN; halves round up) and ``pre-post`` (the layered strategy
practitioners report for 12-block models: the lower ``round(N / 2)`` blocks Pre-LN, the rest
Post-LN; mix-ln's opposite order), and the placements of open models that pair a
placement with QK-norm (:data:`autoln.space.qk.QK_NAMED`): ``olmo2`` (output norm, QK-norm across
heads), ``gemma3`` (sandwich norm, QK-norm per head) and ``qwen3`` (Pre-LN, QK-norm per head).
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
from autoln.models.provenance import PROVENANCE_LIMIT, PROVENANCE_PREVIEW, bounded_provenance  # noqa: F401 (re-exported)
from autoln.space.placements import NORMS, PLACEMENTS, parse_name, placement_names
from autoln.space.qk import QK_NAMED, QK_NORMS, named_qk, plain_qk  # noqa: F401 (named_qk: for the race)

FORMAT = "autoln.genotype"
#: The format of :class:`autoln.api.SiteGenotype` (``autoln.search``'s genotype of a user's model).
SITE_FORMAT = "autoln.site-genotype"
VERSION = 1
MODEL_KEYS = ("n_layers", "d_model", "n_heads", "d_ff", "context", "vocab_size", "norm")
FIELDS = ("format", "version", "candidates", "granularity", "placements", "probabilities", "model", "provenance")
#: Optional fields (absent in older files): ``qk_norm`` (module docstring).
OPTIONAL_FIELDS = ("qk_norm",)
#: Named baselines offered by default (``--compare``, validation): one ``all-<name>`` per
#: placement, Mix-LN and the layered ``pre-post``. Any ``all-<candidate name>`` is a baseline
#: too, e.g. ``all-pre:fixed`` (:func:`is_baseline`).
BASELINES = ("all-pre", "all-post", "all-deepnorm", "mix-ln", "pre-post", "all-peri", "all-outnorm", "all-lns", "all-none")
#: Every name :func:`baseline` builds by name: :data:`BASELINES`, then the open models' pairings
#: with QK-norm (``olmo2``, ``gemma3``, ``qwen3``), which the race enters where QK-norm is a candidate.
NAMED = (*BASELINES, *QK_NAMED)
#: Optional keys of a genotype's ``model`` (absent in older files): ``affine`` (default learnable).
OPTIONAL_MODEL_KEYS = ("affine",)


def is_baseline(name: str) -> bool:
    """True for a named baseline: one of :data:`NAMED` or ``all-<candidate name>``
    (``all-pre:fixed``)."""
    return name in NAMED or (name.startswith("all-") and name[4:] in placement_names())
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
    #: The QK-norm choice (module docstring), None for none anywhere.
    qk_norm: Optional[dict[str, Any]] = None

    def block_placements(self) -> list[tuple[str, str]]:
        """Per block ``(attention placement, FFN placement)``; length ``model["n_layers"]``."""
        return [(p, p) if isinstance(p, str) else (p["attn"], p["ffn"]) for p in self.placements]

    def qk_choices(self) -> list[str]:
        """Per block the QK-norm choice (:mod:`autoln.space.qk`), ``none`` everywhere without ``qk_norm``."""
        if self.qk_norm is None:
            return ["none"] * len(self.placements)
        return list(self.qk_norm["choices"])

    def has_qk(self) -> bool:
        """True when some block has QK-norm."""
        return any(c != "none" for c in self.qk_choices())

    def site_probabilities(self) -> np.ndarray:
        """The probabilities as a float64 array ``(n_sites, K)``, rows in the order of
        :func:`autoln.models.supernet.site_names` (block ``i``'s attention row before its FFN row)."""
        return np.asarray(site_rows(self.probabilities, self.granularity), dtype=np.float64)

    def model_config(self, base: ModelConfig | None = None) -> ModelConfig:
        """A :class:`ModelConfig` with this genotype's dimensions, candidates and QK-norm candidates
        (``[none]`` without the field); other fields (dropout) from ``base``. Raises ConfigError if
        the dimensions are inconsistent."""
        from dataclasses import replace

        dims = {k: self.model[k] for k in MODEL_KEYS + OPTIONAL_MODEL_KEYS if k != "vocab_size" and k in self.model}
        dims.setdefault("affine", "learnable")
        qk = list(self.qk_norm["candidates"]) if self.qk_norm is not None else ["none"]  # the QK-norm its model has
        cfg = replace(base or ModelConfig(), **dims, candidates=list(self.candidates), granularity=self.granularity, qk_norm=qk)
        cfg.validate()
        return cfg

    def describe(self) -> str:
        """Compact one-line form, e.g. ``post post pre pre`` or ``post/pre pre/pre``; with QK-norm
        somewhere the per-block QK choices follow a bar: ``pre pre | qk none``."""
        text = " ".join(p if isinstance(p, str) else f"{p['attn']}/{p['ffn']}" for p in self.placements)
        return f"{text} | {' '.join(self.qk_choices())}" if self.has_qk() else text

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of docs/design.md §6."""
        out = {
            "format": FORMAT, "version": VERSION, "candidates": list(self.candidates),
            "granularity": self.granularity, "placements": self.placements,
            "probabilities": self.probabilities, "model": dict(self.model), "provenance": self.provenance,
        }
        if self.qk_norm is not None:
            out["qk_norm"] = self.qk_norm
        return out

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
            if name not in FIELDS + OPTIONAL_FIELDS:
                raise fail(name, f"unknown field; expected only {list(FIELDS + OPTIONAL_FIELDS)}")
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
                if not all(finite_number(v) and v >= 0 for v in p):
                    raise fail(qname, f"probabilities must be finite and non-negative, got {quoted(p)}")
                if abs(sum(p) - 1.0) > SUM_TOL:
                    raise fail(qname, f"probabilities sum to {sum(p):.6f}, expected 1")
        if not isinstance(obj["provenance"], dict):
            raise fail("provenance", "expected an object")
        qk = check_qk_field(obj.get("qk_norm"), model["n_layers"], fail)
        return cls(list(cands), gran, placements, probs, dict(model), obj["provenance"], qk)


def check_qk_field(qk: Any, n_layers: int, fail) -> Optional[dict[str, Any]]:
    """The ``qk_norm`` field of a genotype checked (module docstring): None stays None; else an
    object with exactly ``candidates`` (names of :data:`autoln.space.qk.QK_NORMS`, each once),
    ``choices`` (one candidate per block) and ``probabilities`` (per block one finite,
    non-negative list over the candidates summing to 1). ``fail(field, problem)`` builds the error.

    Raises:
        GenotypeError: the first failed check, naming ``qk_norm.<field>``."""
    if qk is None:
        return None
    keys = ("candidates", "choices", "probabilities")
    if not isinstance(qk, dict) or set(qk) != set(keys):
        raise fail("qk_norm", f"expected an object with exactly the keys {list(keys)}")
    cands = qk["candidates"]
    if not isinstance(cands, list) or not cands or any(c not in QK_NORMS for c in cands if isinstance(c, str)) \
            or not all(isinstance(c, str) for c in cands) or len(set(cands)) != len(cands):
        raise fail("qk_norm.candidates", f"expected distinct names of {list(QK_NORMS)}, got {quoted(cands)}")
    for name in ("choices", "probabilities"):
        if not isinstance(qk[name], list) or len(qk[name]) != n_layers:
            raise fail(f"qk_norm.{name}", f"expected a list with one entry per block ({cut(n_layers)})")
    for i, (c, p) in enumerate(zip(qk["choices"], qk["probabilities"])):
        if not isinstance(c, str) or c not in cands:
            raise fail(f"qk_norm.choices[{i}]", f"expected one of {cands}, got {quoted(c)}")
        if not isinstance(p, list) or len(p) != len(cands) or not all(finite_number(v) and v >= 0 for v in p):
            raise fail(f"qk_norm.probabilities[{i}]", f"expected {len(cands)} finite non-negative numbers, got {quoted(p)}")
        if abs(sum(p) - 1.0) > SUM_TOL:
            raise fail(f"qk_norm.probabilities[{i}]", f"probabilities sum to {sum(p):.6f}, expected 1")
    return {k: qk[k] for k in keys}


def finite_number(v: Any) -> bool:
    """True for a finite int or float (not a bool); False for an integer too large for a float."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer of hundreds of digits
        return False


def qk_field(candidates, choices, probabilities=None) -> Optional[dict[str, Any]]:
    """A genotype's ``qk_norm`` field: ``choices`` (one per block) over ``candidates``, with
    ``probabilities`` ``(n_layers, Q)`` (default one-hot on the choices); None when every choice is
    ``none`` and there are no probabilities (a genotype without QK-norm is written as before; a
    searched QK-norm is recorded with its probabilities even where it chose none everywhere)."""
    if all(c == "none" for c in choices) and probabilities is None:
        return None
    cands = list(candidates)
    for c in choices:
        if c not in cands:
            cands.append(c)
    rows = [[1.0 if c == ch else 0.0 for c in cands] for ch in choices] if probabilities is None else \
        [[float(v) for v in row / row.sum()] + [0.0] * (len(cands) - len(row))
         for row in (np.asarray(r, dtype=np.float64) for r in probabilities)]
    return {"candidates": cands, "choices": list(choices), "probabilities": rows}


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
                       choices: list[int] | None = None, qk: Optional[list[str]] = None,
                       qk_probs: Optional[np.ndarray] = None) -> Genotype:
    """Derive the genotype: per site the candidate ``choices[i]`` (perturbation-based selection,
    :mod:`autoln.oneshot.selection`) or, without ``choices``, the argmax of ``probs`` (DARTS §2.4).

    Args:
        probs: ``(n_sites, K)`` mixing probabilities, rows as :func:`autoln.models.supernet.site_names`.
        cfg: the search's model config (candidates, granularity, dimensions).
        vocab_size: vocabulary size of the data.
        provenance: stored as is.
        choices: per site a candidate index, or None for the argmax.
        qk: per block the QK-norm choice (a searched QK-norm's read-off), or None: ``cfg.qk_norm``'s
            one candidate where it has one, else none; qk_probs: its probabilities ``(n_layers, Q)``.

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
    if qk is None:
        qk, qk_probs = [plain_qk(cfg.qk_norm)] * cfg.n_layers, None
    return Genotype(cands, cfg.granularity, nest_sites(names, cfg.granularity), nest_sites(rows, cfg.granularity),
                    model_dims(cfg, vocab_size), provenance or {}, qk_field(cfg.qk_norm, qk, qk_probs))


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
    if name in QK_NAMED:
        return [QK_NAMED[name][0]] * n
    if name == "mix-ln":
        n_post = math.floor(0.25 * n + 0.5)
        return ["post"] * n_post + ["pre"] * (n - n_post)
    if name == "pre-post":
        n_pre = math.floor(0.5 * n + 0.5)
        return ["pre"] * n_pre + ["post"] * (n - n_pre)
    raise GenotypeError(f"unknown baseline {name!r}; expected a genotype file or one of {list(NAMED)}")


def baseline(name: str, cfg: ModelConfig, vocab_size: int) -> Genotype:
    """A named published genotype at ``cfg``'s size: ``all-<candidate>`` (every site that
    candidate, e.g. ``all-pre``, ``all-peri``, ``all-pre:fixed``), ``mix-ln`` (first
    ``floor(0.25 N + 0.5)`` blocks ``post``, the rest ``pre``; Li et al. 2024) or ``pre-post``
    (first ``floor(0.5 N + 0.5)`` blocks ``pre``, the rest ``post``), or an open model's pairing
    with QK-norm (``olmo2``, ``gemma3``, ``qwen3``: :data:`autoln.space.qk.QK_NAMED`; ``olmo2``'s
    across-heads QK-norm is ``qk`` where ``cfg.qk_norm`` offers only that). With ``cfg.affine ==
    "fixed"`` every placement with norms takes its ``:fixed`` form (``pre`` -> ``pre:fixed``),
    as the final norm does; ``search`` (a search option) leaves the published learnable gains.
    The others' QK-norm: ``cfg.qk_norm``'s where it is one fixed candidate, else none
    (:func:`autoln.space.qk.plain_qk`).

    Raises:
        GenotypeError: unknown name.
    """
    names = named_blocks(name, cfg.n_layers)
    if name in QK_NAMED:
        prefs = QK_NAMED[name][1]
        qk = next((c for c in prefs if c in cfg.qk_norm), prefs[0])
    else:
        qk = plain_qk(cfg.qk_norm)
    if cfg.affine == "fixed":  # every norm's gain and bias fixed, the sites' as the final norm's
        names = [n + ":fixed" if not n.endswith(":fixed") and PLACEMENTS[parse_name(n)[0]].has_norm else n for n in names]
    cands = sorted(set(names), key=placement_names().index)
    probs = [[1.0 if c == p else 0.0 for c in cands] for p in names]
    return Genotype(cands, "layer", names, probs, model_dims(cfg, vocab_size), {"baseline": name},
                    qk_field([qk], [qk] * cfg.n_layers))


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
