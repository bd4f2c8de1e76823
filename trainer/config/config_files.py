"""`--config-path DIR --config-name NAME`: a verl YAML config read as verl's Hydra entry point composes it, turned
into overrides that go through the same parser as the command line's (config/overrides.py), so every key from a
file meets the same rules: unknown, refused and malformed values fail in one line that names the file and line.

Composition follows Hydra's defaults list as far as verl's configs use it:
- `ppo_trainer` (or `/ppo_trainer`) is verl's base config, which is rlrig's own defaults: nothing to read. It must
  come before anything that sets keys, since in Hydra it would reset them to verl's defaults.
- `_self_` is where the file's own keys go among its defaults (at the end when not listed, as in Hydra).
- any other plain name is NAME.yaml in the config folder, composed the same way, in its place.
- config groups (`group@package: option`), `override` and `optional` entries, and `ppo_megatron_trainer` are
  refused in one line naming the entry.
Nested mappings merge key by key (`a: {b: 1}` is `a.b=1`), as OmegaConf merges them. `hydra.searchpath` only
tells Hydra where verl's ppo_trainer is, so it is accepted and read no further; other `hydra.*` keys are refused.
`${...}` interpolations are resolved with the command line's (config/interpolation.py).

With `--preset`, the preset's overrides come first, then the file's, then the command line's: the later wins.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError
from .literals import as_raw, yaml_value
from .presets import with_preset
from .schema import Config, all_keys

BASE = "ppo_trainer"
SELF = "_self_"
# what Hydra's searchpath does (find verl's ppo_trainer) is built into rlrig
HYDRA_ACCEPTED = ("hydra.searchpath",)


class FileOverride(str):
    """`key=value` read from a config file; `where` is its file:line, which errors about it name."""

    where: str

    def __new__(cls, text: str, where: str) -> FileOverride:
        self = super().__new__(cls, text)
        self.where = where
        return self


def assemble(preset: str | None, config_path: str | None, config_name: str | None, overrides: list[str]) -> list[str]:
    """The trainer's overrides in the order they apply: the preset's, the config file's, the command line's."""
    if (config_path is None) != (config_name is None):
        given, missing = (
            ("--config-path", "--config-name") if config_name is None else ("--config-name", "--config-path")
        )
        raise ConfigError(
            f"{given} needs {missing}: the folder and the name of a verl config file, e.g. "
            "--config-path conf --config-name my_run"
        )
    from_file = load(config_path, config_name) if config_path is not None else []
    return with_preset(preset, [*from_file, *overrides])


def load(config_path: str, config_name: str) -> list[str]:
    """NAME.yaml in DIR (the `.yaml` may be given), composed into overrides in Hydra's order."""
    root = Path(config_path).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--config-path {config_path}: no such folder")
    out: list[str] = []
    _compose(root, config_name, out, (), f"--config-name {config_name}")
    return out


def _compose(root: Path, name: str, out: list[str], chain: tuple[Path, ...], named_by: str) -> None:
    path = root / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    if not path.is_file():
        raise ConfigError(f"{named_by}: no config file {path}")
    if path.resolve() in chain:
        raise ConfigError(f"{named_by}: {path} is already being composed (its defaults list includes itself)")
    doc = _read(path)
    defaults, own = None, []
    for key_node, value_node in doc.value:
        if key_node.value == "defaults":
            defaults = value_node
        else:
            _flatten(path, key_node.value, key_node, value_node, own)
    entries = _defaults(path, defaults)
    if SELF not in [e for e, _ in entries]:
        entries.append((SELF, f"{path}"))
    for entry, where in entries:
        if entry == SELF:
            out.extend(own)
        elif entry == BASE:
            if out:
                raise ConfigError(
                    f"{where}: defaults entry {BASE} after entries that set keys would reset them to verl's "
                    f"defaults; list {BASE} first"
                )
        else:
            _compose(root, entry, out, (*chain, path.resolve()), f"{where}: defaults entry {entry!r}")


def _read(path: Path) -> yaml.MappingNode:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        # the context ("while parsing a flow sequence") points at the opening line when the problem is at the end
        context = f" ({e.context} at line {e.context_mark.line + 1})" if e.context and e.context_mark else ""
        raise ConfigError(f"{path}{line}: not valid YAML: {e.problem or e.context}{context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if node is None:  # an empty file: an empty config, as in Hydra
        return yaml.MappingNode("tag:yaml.org,2002:map", [])
    if not isinstance(node, yaml.MappingNode):
        kind = "list" if isinstance(node, yaml.SequenceNode) else "single value"
        raise ConfigError(f"{path}: a config file is a mapping of keys (data:, trainer:, ...), not a {kind}")
    return node


def _defaults(path: Path, node: yaml.Node | None) -> list[tuple[str, str]]:
    """The defaults list as (entry, file:line), each entry checked."""
    if node is None:
        return []
    where = f"{path}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~"):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise ConfigError(f"{where}: defaults must be a list, e.g. [{BASE}, {SELF}]")
    entries = []
    for item in node.value:
        where = f"{path}:{item.start_mark.line + 1}"
        if isinstance(item, yaml.MappingNode):
            text = ", ".join(f"{k.value}: {_text(v)}" for k, v in item.value)
            raise ConfigError(
                f"{where}: defaults entry '{text}' chooses a config group; rlrig reads no groups (its defaults are "
                f"verl's {BASE} with dp_actor, dp_ref, dp_critic): set the keys in this file instead"
            )
        if not isinstance(item, yaml.ScalarNode):
            raise ConfigError(f"{where}: defaults entry {_text(item)} is not a config name")
        entry = item.value.strip()
        name = entry.lstrip("/").removesuffix(".yaml")
        if entry.split(" ")[0] in ("override", "optional") or "@" in entry or ":" in entry:
            raise ConfigError(
                f"{where}: defaults entry {entry!r}: rlrig composes {BASE}, {SELF} and other files of the config "
                "folder by name, not packages, overrides or optional configs"
            )
        if name == "ppo_megatron_trainer":
            raise ConfigError(
                f"{where}: defaults entry {entry!r}: Megatron is not in rlrig; its trainer is verl's {BASE} "
                "(FSDP or DDP)"
            )
        if name == SELF and SELF in [e for e, _ in entries]:
            raise ConfigError(f"{where}: {SELF} is listed twice")
        entries.append((name, where))
    return entries


def _text(node: yaml.Node) -> str:
    return node.value if isinstance(node, yaml.ScalarNode) else yaml.serialize(node).strip()


def _flatten(path: Path, key: str, key_node: yaml.Node, node: yaml.Node, out: list[str]) -> None:
    """The file's keys as `dotted.key=value`, nested mappings merged key by key as OmegaConf does."""
    where = f"{path}:{key_node.start_mark.line + 1}"
    if key == "hydra" or key.startswith("hydra."):
        if key in HYDRA_ACCEPTED:
            return
        if not (isinstance(node, yaml.MappingNode) and node.value):
            raise ConfigError(f"{where}: {key}: Hydra's own settings are not in rlrig (only hydra.searchpath is read)")
    if isinstance(node, yaml.MappingNode) and node.value:
        for k, v in node.value:
            _flatten(path, f"{key}.{k.value}", k, v, out)
        return
    if isinstance(node, yaml.MappingNode) and _is_section(key):
        return  # merging an empty mapping changes nothing
    out.append(FileOverride(f"{key}={_raw(node)}", where))


def _is_section(key: str) -> bool:
    known = all_keys(Config())
    return key in known or any(k.startswith(f"{key}.") for k in known)


def _raw(node: yaml.Node) -> str:
    """A YAML value as override text that Hydra's parser reads back as the value OmegaConf loads from the file."""
    return as_raw(_value(node))


def _value(node: yaml.Node):
    if isinstance(node, yaml.ScalarNode):
        # a plain scalar typed as OmegaConf's YAML loader types it (1e-6 a float, `~` and nothing null)
        return yaml_value(node.value) if node.style is None else node.value
    if isinstance(node, yaml.SequenceNode):
        return [_value(n) for n in node.value]
    return {k.value: _value(v) for k, v in node.value}
