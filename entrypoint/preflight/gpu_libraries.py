"""NVML and amdsmi opened for one reading and closed after it: `with nvml() as (pynvml, why)` gives the initialised
module, or None and why it is not there (a CPU node, no driver loaded, the Python package missing). Errors of the
queries themselves are the caller's to catch (pynvml.NVMLError, amdsmi.AmdSmiException)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def nvml():
    try:
        import pynvml
    except ImportError:
        yield None, "pynvml not installed"
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:  # LibraryNotFound / DriverNotLoaded on machines without NVIDIA GPUs
        yield None, f"NVML unavailable ({e})"
        return
    try:
        yield pynvml, ""
    finally:
        pynvml.nvmlShutdown()


@contextmanager
def amdsmi():
    try:
        import amdsmi as lib
    except ImportError:
        yield None, "amdsmi not installed"
        return
    except OSError as e:  # the Python package is there but libamd_smi.so is not
        yield None, f"amdsmi unavailable ({e})"
        return
    try:
        lib.amdsmi_init()
    except lib.AmdSmiException as e:  # no amdgpu driver loaded
        yield None, f"amdsmi unavailable ({e})"
        return
    try:
        yield lib, ""
    finally:
        try:
            lib.amdsmi_shut_down()
        except lib.AmdSmiException:
            pass  # the readings are taken; a failed release changes nothing for this process
