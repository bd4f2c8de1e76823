"""The trainer's one error for bad input (config, data, files): main prints its message as one line
and exits 2. Anything else is a bug and shows its traceback."""


class ConfigError(ValueError):
    pass
