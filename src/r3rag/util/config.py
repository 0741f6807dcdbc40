"""Typed stage configs from YAML, overridable on the command line.

Usage:
    cfg = build_config(WorldConfig, section=yaml_dict.get("world", {}), overrides=["seed=7"],
                       where="pipelines/demo.yaml: world")

Every stage declares a dataclass; unknown keys and wrong types are `UserError`s that
name the key and where it came from. Override values are parsed as YAML scalars
(`--set lr=1e-4`, `--set layers=[q_proj,v_proj]`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from r3rag.util.errors import UserError

MAX_CONFIG_BYTES = 1 << 20  # configs are a few KB; PyYAML takes minutes over a 10 MB line


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping, with errors naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: config file not found")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise UserError(f"{path}: {size} bytes is too large for a config file (limit {MAX_CONFIG_BYTES})")
    import yaml  # here and below, not at the top: `r3rag <stage> --help` imports this module

    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{line} invalid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def key_location(path: str | Path, key: Any) -> str:
    """`path:line` of a top-level `key` of a YAML file, else `path`. Only errors call it: the
    loaded mapping keeps no line numbers, so the file is composed again (pure-Python loader)."""
    import yaml

    try:
        loader = yaml.SafeLoader(Path(path).read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
            keys = node.value if isinstance(node, yaml.MappingNode) else []
            line = next((k.start_mark.line + 1 for k, _ in keys if loader.construct_object(k) == key), None)
        finally:
            loader.dispose()
    except (OSError, ValueError, yaml.YAMLError):
        return str(path)
    return f"{path}:{line}" if line else str(path)


def parse_overrides(overrides: list[str] | None) -> dict[str, Any]:
    """Turn ["a.b=1", "c=x"] into {"a.b": 1, "c": "x"} (values parsed as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected key=value")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def apply_overrides(section: dict, overrides: dict[str, Any]) -> dict:
    """Return a copy of `section` with dotted keys set (nested dicts created as needed)."""
    merged = _deep_copy(section)
    for dotted, value in overrides.items():
        node = merged
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {dotted}: {p!r} is not a section")
        node[leaf] = value
    return merged


def build_config(cls, section: dict | None, overrides: dict[str, Any] | None = None, where: str = "config"):
    """Instantiate dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    data = apply_overrides(section or {}, overrides or {})
    return _from_dict(cls, data, where)


def unhashed(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING):
    """A dataclass field for a setting that says how to run, not what is made (threads, batch
    sizes, resuming, logging): it stays out of the artifact's config hash, so a rerun with another
    value reuses (or resumes) the same artifact (`unhashed_since_built`: the same for a setting that
    was hashed once). The manifest's config.yaml still records it."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"hashed": False})


def hashed_when_set(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, silent=False):
    """A dataclass field for a setting added after artifacts were built without it: while it holds
    its default it stays out of the config hash, so those artifacts keep their ids (a long
    replication resumes across code changes); set to anything else, it enters the hash as usual.
    `silent`: at its default it is not written to the artifact's config.yaml either
    (`recorded_settings`), so the artifact's files, its content hash and every id downstream of it
    stay byte for byte what they were (the fields added before this existed stay recorded)."""
    meta = {"hashed": "when_set", **({"silent": True} if silent else {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def recorded_settings(cfg) -> dict:
    """`dataclasses.asdict(cfg)` as the artifact's config.yaml records it: without the `silent`
    settings that hold their defaults."""
    out = dataclasses.asdict(cfg)
    for f in dataclasses.fields(cfg):
        if f.metadata.get("silent") and getattr(cfg, f.name) == _default(f):
            out.pop(f.name)
    return out


def unhashed_since_built(default: Any):
    """A dataclass field that entered the config hash (artifacts were built with it) and was then
    found to say how to run, not what is made (a server's address): it enters the hash at its
    default whatever its value, so those artifacts keep their ids and a rerun with another value
    reuses (or resumes) the same artifact."""
    return dataclasses.field(default=default, metadata={"hashed": "as_default"})


def hashed_settings(cfg) -> dict:
    """`cfg` as a dict (like `dataclasses.asdict`) without its `unhashed` fields (nor its
    `hashed_when_set` fields at their defaults), nested settings' included: what enters the
    artifact's config hash."""
    return {f.name: _hashed(_hash_value(cfg, f)) for f in dataclasses.fields(cfg) if _enters_hash(cfg, f)}


def _hash_value(cfg, f: dataclasses.Field) -> Any:
    return f.default if f.metadata.get("hashed") == "as_default" else getattr(cfg, f.name)


def _enters_hash(cfg, f: dataclasses.Field) -> bool:
    mark = f.metadata.get("hashed", True)
    return mark in (True, "as_default") or (mark == "when_set" and getattr(cfg, f.name) != _default(f))


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _hashed(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return hashed_settings(value)
    if isinstance(value, dict):
        return {k: _hashed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_hashed(v) for v in value)
    return value


def _from_dict(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} ({_known_keys(unknown[0], sorted(fields))})")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def _known_keys(key: str, known: list[str]) -> str:
    """The keys a section knows, all of them while the list is short; else the ones closest to
    `key` and where the rest are listed (one line a reader takes in)."""
    if len(known) <= 40:
        return f"known: {', '.join(known)}"
    import difflib

    close = difflib.get_close_matches(key, known, n=5, cutoff=0.6)
    hint = f"closest: {', '.join(close)}; " if close else ""
    return f"{hint}{len(known)} known keys: the stage's --help lists them"


def _coerce(tp, value: Any, where: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, where)
            except UserError as e:
                errors.append(str(e))
        raise UserError(errors[0])
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, where)
    if tp is Any:
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_coerce(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {value!r}")
        args = typing.get_args(tp)
        if len(args) == 2:  # dict[str, X]: each value typed too (e.g. named system specs)
            return {str(k): _coerce(args[1], v, f"{where}.{k}") for k, v in value.items()}
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UserError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-4 as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise UserError(f"{where}: expected a string, got {value!r}")
    if typing.get_origin(tp) is typing.Literal:
        return _literal(typing.get_args(tp), value, where)
    return value


def check_literals(obj, where: str) -> None:
    """Every Literal field of dataclass `obj` holds one of its values: for settings built in code
    (`__post_init__`), which skip `build_config`'s check; the same one-line error."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if typing.get_origin(hints[f.name]) is typing.Literal:
            _literal(typing.get_args(hints[f.name]), getattr(obj, f.name), f"{where}.{f.name}")


def _literal(allowed: tuple, value: Any, where: str):
    """One of a Literal's values; the type counts too (YAML's `true` is not the choice 1)."""
    if any(value == a and type(value) is type(a) for a in allowed):
        return value
    raise UserError(f"{where}: unknown value {value!r} (allowed: {', '.join(map(str, allowed))})")


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}
