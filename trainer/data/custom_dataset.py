"""A data set class of the user's own (data.custom_cls.path and .name, verl's): built as verl builds it,
cls(data_files=..., tokenizer=..., processor=None, config=<the data config>, max_samples=...), and read item by item.

verl's data set gives each prompt as its row with the chat messages under `raw_prompt` (verl's agent loop applies the
chat template, as rlrig does); rlrig takes every item's fields as the row, the messages as its prompt column, and
tokenizes it as any other row. A class made for verl (a subclass of verl's RLHFDataset) needs verl installed."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from .extern import load_object

KEYS = "data.custom_cls.path/name"


class Section(dict):
    """The data config as a verl data set reads it (config.get("key", default), config.key) where OmegaConf is not
    installed; with it, the config is OmegaConf's DictConfig, as verl hands over."""

    def __getattr__(self, key):
        try:
            value = self[key]
        except KeyError:
            raise AttributeError(key) from None
        return Section(value) if isinstance(value, dict) else value


def data_section(data_cfg):
    d = dataclasses.asdict(data_cfg)
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return Section(d)
    return OmegaConf.create(d)


def dataset_class(data_cfg) -> type:
    import torch.utils.data

    cls = load_object(data_cfg.custom_cls.path, data_cfg.custom_cls.name, KEYS)
    if not isinstance(cls, type) or not issubclass(cls, torch.utils.data.Dataset):
        raise ConfigError(
            f"{KEYS}: {data_cfg.custom_cls.name} must be a subclass of torch.utils.data.Dataset, as verl asks"
        )
    return cls


def as_row(item, prompt_key: str, where: str) -> dict:
    """An item as an rlrig row: its fields (tensors dropped: verl's placeholder), the messages as the prompt."""
    import torch

    if not isinstance(item, dict):
        raise ConfigError(f"{where}: items must be dicts (verl's rows), not {type(item).__name__}")
    row = {k: v for k, v in item.items() if not isinstance(v, torch.Tensor)}
    messages = row.pop("raw_prompt", None)
    if messages is None and prompt_key not in row:
        raise ConfigError(
            f"{where}: an item has neither raw_prompt (verl's messages) nor {prompt_key} (data.prompt_key)"
        )
    if messages is not None:
        row[prompt_key] = list(messages)
    return row


def custom_rows(data_cfg, files, tokenizer, max_samples: int = -1) -> list[dict]:
    """The rows of `files` (one path or a list) through the class."""
    cls = dataset_class(data_cfg)
    paths = list(files) if isinstance(files, (list, tuple)) else [files]
    config = data_section(data_cfg)
    ds = cls(data_files=paths, tokenizer=tokenizer, processor=None, config=config, max_samples=max_samples)
    where = f"{KEYS}: {cls.__name__}"
    rows = [as_row(ds[i], data_cfg.prompt_key, where) for i in range(len(ds))]
    if not rows:
        raise ConfigError(f"{where} holds no rows for {files}")
    return rows
