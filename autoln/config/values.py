"""A YAML value as the type of a config field (:func:`_coerce`), and the words that name a type in
messages (:func:`_type_name`): what ``--set``, config files and ``tune.space`` choices go through.
"""

from __future__ import annotations

import copy
import math
import types
import typing
from typing import Any

from autoln.core.errors import ConfigError, cut, quoted

#: Characters a string value of a config may have (Linux's PATH_MAX): every string key is a path, a
#: URL, a name or one of a few words, and a run copies the config into its ``config.yaml``,
#: checkpoints, TensorBoard text and genotype, so a longer one is refused on read, naming the key.
MAX_STRING = 4096


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, key, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e3 (YAML 1.2 reads it as a float)
            return int(value)
    elif tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
    elif tp is str:
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise ConfigError(f"'{key}' ({where}) is {quoted(value, 60)}: a string of at most {MAX_STRING:,} "
                                  "characters is expected (a path, a URL or a name)")
            return value
    elif origin is list:
        if isinstance(value, list):
            return [_coerce(v, args[0], key, where) for v in value]
    elif origin is tuple:
        if isinstance(value, (list, tuple)) and len(value) == len(args):
            return tuple(_coerce(v, a, key, where) for v, a in zip(value, args))
    elif origin is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: _coerce(v, args[1], f"{key}['{cut(k)}']", where) for k, v in value.items()}
    elif tp is dict:
        if isinstance(value, dict):
            return copy.deepcopy(value)
    raise ConfigError(f"'{key}' ({where}) must be {_type_name(tp)}, got {quoted(value)}")


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return f"a list of {_PLURAL.get(args[0], str(args[0]))}"
    if origin is dict or tp is dict:
        return "a mapping"
    if origin is tuple:
        return f"a list of {len(args)} {_PLURAL.get(args[0], str(args[0]))}"
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)][0]
        return f"{_type_name(inner)} or null"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}.get(tp, str(tp))


_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
