"""What the tool and interaction config files share: a YAML (or JSON) list under one key, entries naming a class by
its module path."""

from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import ConfigError


def read_entries(path: str, key: str) -> list[dict]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such file (a path absolute or relative to the working directory)")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML or JSON ({str(e).splitlines()[0]})") from None
    entries = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{path}: expected a list of entries under `{key}:`")
    return entries


def import_class(name, where: str, base: type) -> type:
    """The class at module path `name` (pkg.module.Class), a subclass of `base`'s interface."""
    if not isinstance(name, str) or "." not in name:
        raise ConfigError(f"{where}: class_name must be a module path such as pkg.module.Class, not {name!r}")
    module, _, attr = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"{where}: class_name={name} cannot be imported ({e}); install its package") from None
    except AttributeError:
        raise ConfigError(f"{where}: module {module} has no class {attr}") from None
    # verl's own classes (installed verl) follow the same interface without subclassing rlrig's
    needed = [m for m in vars(base) if not m.startswith("_") and callable(getattr(base, m))]
    missing = [m for m in needed if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ConfigError(f"{where}: {name} is not a {base.__name__} (it lacks {', '.join(missing) or 'a class'})")
    return cls
