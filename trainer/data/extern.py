"""Objects named by verl's module paths (its load_extern_object): `pkg://pkg.module` (or pkg/module) imports an
installed module, `file://path.py` or a bare path runs a file; the object is an attribute of the module."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path

from ..errors import ConfigError

PKG, FILE = "pkg://", "file://"


def load_object(path: str, name: str | None, keys: str):
    """keys: the config keys that named it, for the error (e.g. data.custom_cls.path/name)."""
    if not name:
        raise ConfigError(f"{keys}: {path} is set and the name is not; name the object in it")
    if path.startswith(PKG):
        module_name = path[len(PKG) :].replace("/", ".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"{keys}: {path} cannot be imported ({e}); install its package") from None
    else:
        file = Path(path[len(FILE) :] if path.startswith(FILE) else path)
        if not file.is_file():
            raise ConfigError(f"{keys}: {file} does not exist (a path absolute or relative to the working directory)")
        # one module name per file, as verl's: two such files never share a module
        spec = importlib.util.spec_from_file_location(
            f"rlrig_extern_{hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]}", file
        )
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as e:
            raise ConfigError(f"{keys}: {file} imports what is not installed ({e}); install it") from None
    if not hasattr(module, name):
        raise ConfigError(f"{keys}: {path} has no {name}")
    return getattr(module, name)
