"""The fabric check's GPU health: which readings fail a node or warn, and the NVML and amdsmi readers, fed stand-ins
that answer as the real libraries do (the NVML one only with names the installed pynvml has; the amdsmi one shaped
as amdsmi 7.0.2's Python interface returns, read from its wheel)."""

import enum
import sys

import pynvml
import pytest

from rlrig.entrypoint.preflight import gpu_health

GIB = 1 << 30


def gpu(**readings):
    return {"index": 3, "name": "NVIDIA H100", **readings}


@pytest.mark.parametrize(
    "readings, fails, warns",
    [
        ({}, [], []),  # nothing the library would say (a consumer GPU: no ECC, no remapper)
        (
            dict(ecc_uncorrected=None, retired_pages_pending=None, slowdowns=None, pcie_width=None, memory_total=None),
            [],
            [],
        ),
        (
            dict(
                ecc_uncorrected=0,
                retired_pages_pending=False,
                remap_pending=False,
                remap_failed=False,
                slowdowns=[],
                pcie_width=16,
                pcie_max_width=16,
                pcie_gen=5,
                pcie_max_gen=5,
                memory_total=80 * GIB,
                memory_used=GIB // 2,
            ),
            [],
            [],
        ),
        (dict(ecc_uncorrected=2), ["GPU 3 (NVIDIA H100): 2 uncorrected ECC error(s) since the driver loaded"], []),
        (
            dict(retired_pages_pending=True),
            ["GPU 3 (NVIDIA H100): a page retirement is pending (it takes effect after a GPU reset)"],
            [],
        ),
        (
            dict(remap_pending=True, remap_failed=True),
            [
                "GPU 3 (NVIDIA H100): a row remapping is pending (it takes effect after a GPU reset)",
                "GPU 3 (NVIDIA H100): a row remapping failed (the GPU needs service)",
            ],
            [],
        ),
        (
            dict(retire_failed=True),
            ["GPU 3 (NVIDIA H100): a bad memory page could not be retired (the GPU needs service)"],
            [],
        ),
        (dict(error="GPU is lost", vendor="nvidia"), ["GPU 3 (NVIDIA H100): NVML cannot read it (GPU is lost)"], []),
        (
            dict(slowdowns=["hardware slowdown", "hardware thermal slowdown"]),
            [],
            ["GPU 3 (NVIDIA H100): clocks held down (hardware slowdown, hardware thermal slowdown)"],
        ),
        (dict(pcie_width=8, pcie_max_width=16), [], ["GPU 3 (NVIDIA H100): PCIe link x8, below its x16"]),
        (dict(pcie_gen=1, pcie_max_gen=5, idle=False), [], ["GPU 3 (NVIDIA H100): PCIe gen 1, below its gen 5"]),
        (dict(pcie_gen=1, pcie_max_gen=5, idle=True), [], []),  # idle: the link steps down to save power
        # memory: 80 GiB, of which others hold 8 (exactly 90 % free: fine), 8.5 (a warning), 60 (25 % free: a warning),
        # 60.5 (below a quarter free: the node fails)
        (dict(memory_total=80 * GIB, memory_used=8 * GIB), [], []),
        (
            dict(memory_total=80 * GIB, memory_used=17 * GIB // 2),
            [],
            ["GPU 3 (NVIDIA H100): 8.5 of 80.0 GiB held by other processes"],
        ),
        (
            dict(memory_total=80 * GIB, memory_used=60 * GIB),
            [],
            ["GPU 3 (NVIDIA H100): 60.0 of 80.0 GiB held by other processes"],
        ),
        (
            dict(memory_total=80 * GIB, memory_used=121 * GIB // 2),
            ["GPU 3 (NVIDIA H100): only 19.5 GiB free, 60.5 of 80.0 GiB held by other processes (a leftover job?)"],
            [],
        ),
    ],
)
def test_what_fails_and_what_warns(readings, fails, warns):
    assert gpu_health.problems(gpu(**readings)) == (fails, warns)


@pytest.mark.parametrize(
    "bits, slowdowns, idle",
    [
        (None, None, None),
        (0x0, [], False),
        (0x1, [], True),
        (0x4 | 0x2, [], False),  # the software power cap and application clocks: normal under load
        (0x8 | 0x40 | 0x4, ["hardware slowdown", "hardware thermal slowdown"], False),
        (0x20 | 0x80 | 0x1, ["software thermal slowdown", "power brake slowdown"], True),
    ],
)
def test_nvml_clock_event_bits(bits, slowdowns, idle):
    assert gpu_health.nvml_slowdowns(bits) == (slowdowns, idle)


@pytest.mark.parametrize(
    "rate, gen",
    [
        (2.5, 1),
        (8, 3),
        (16, 4),
        (32, 5),
        (64, 6),  # GT/s
        (2500, 1),
        (5000, 2),
        (16000, 4),
        (32000, 5),  # MT/s, as amdsmi's pcie_speed (and in practice max_pcie_speed) come
        ("N/A", None),
        (0, None),
        (None, None),
    ],
)
def test_pcie_generation_from_its_rate(rate, gen):
    assert gpu_health.pcie_gen(rate) == gen


class NvmlError(Exception):
    pass


class FakeNvml:
    """pynvml over five GPUs: 0 a healthy idle H100; 1 an H100 with every fault, busy; 2 an A100 in MIG mode (its
    memory is other tenants' by design); 3 a consumer GPU that supports few queries and only the older name of the
    clocks query; 4 fallen off the bus."""

    NVMLError = NvmlError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC

    GPUS = [
        dict(
            name="NVIDIA H100 80GB HBM3",
            ecc=0,
            remap=(0, 0, 0, 0),
            pending=0,
            reasons=0x1,
            mig=0,
            mem=(80, 0.5),
            pcie=(16, 16, 1, 5),
        ),
        dict(
            name=b"NVIDIA H100 80GB HBM3",
            ecc=2,
            remap=(0, 1, 1, 1),
            pending=1,
            reasons=0x8 | 0x4,
            mig=0,
            mem=(80, 70),
            pcie=(8, 16, 4, 5),
        ),
        dict(
            name="NVIDIA A100-SXM4-40GB",
            ecc=0,
            remap=(0, 0, 0, 0),
            pending=0,
            reasons=0x0,
            mig=1,
            mem=(40, 35),
            pcie=(16, 16, 4, 4),
        ),
        dict(name="NVIDIA GeForce RTX 4090", throttle_only=0x20, mem=(24, 1), pcie=(16, 16, 4, 4)),
    ]

    def __init__(self):
        self.open = 0

    def nvmlInit(self):
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetCount(self):
        return len(self.GPUS) + 1

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= len(self.GPUS):
            raise NvmlError("GPU is lost")
        return self.GPUS[i]

    def _has(self, g, key):
        if key not in g:
            raise NvmlError("Not Supported")
        return g[key]

    def nvmlDeviceGetName(self, g):
        return g["name"]

    def nvmlDeviceGetTotalEccErrors(self, g, error_type, counter_type):
        assert (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return self._has(g, "ecc")

    def nvmlDeviceGetRemappedRows(self, g):
        return self._has(g, "remap")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, g):
        return [pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED][self._has(g, "pending")]

    def nvmlDeviceGetCurrentClocksEventReasons(self, g):
        return self._has(g, "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, g):
        return self._has(g, "throttle_only")

    def nvmlDeviceGetMigMode(self, g):
        m = self._has(g, "mig")
        return m, m

    def nvmlDeviceGetMemoryInfo(self, g):
        total, used = g["mem"]
        return type(
            "c_nvmlMemory_t",
            (),
            {"total": int(total * GIB), "used": int(used * GIB), "free": int((total - used) * GIB)},
        )

    def nvmlDeviceGetCurrPcieLinkWidth(self, g):
        return g["pcie"][0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, g):
        return g["pcie"][1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, g):
        return g["pcie"][2]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, g):
        return g["pcie"][3]


def test_the_nvml_stand_in_uses_only_names_pynvml_has():
    names = [n for n in vars(FakeNvml) if n.lower().startswith("nvml")]
    assert len(names) > 15 and [n for n in names if not hasattr(pynvml, n)] == []


def test_nvml_readings_and_their_verdicts(monkeypatch):
    nv = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gpus, library = gpu_health.read_gpus()
    assert library == "NVML" and nv.open == 0  # shut down after reading
    verdicts = [gpu_health.problems(g) for g in gpus]
    assert verdicts[0] == ([], [])  # idle at gen 1 of 5: not worth a word
    g1 = "GPU 1 (NVIDIA H100 80GB HBM3)"
    assert verdicts[1] == (
        [
            f"{g1}: 2 uncorrected ECC error(s) since the driver loaded",
            f"{g1}: a page retirement is pending (it takes effect after a GPU reset)",
            f"{g1}: a row remapping is pending (it takes effect after a GPU reset)",
            f"{g1}: a row remapping failed (the GPU needs service)",
            f"{g1}: only 10.0 GiB free, 70.0 of 80.0 GiB held by other processes (a leftover job?)",
        ],
        [
            f"{g1}: clocks held down (hardware slowdown)",
            f"{g1}: PCIe link x8, below its x16",
            f"{g1}: PCIe gen 4, below its gen 5",
        ],
    )
    assert gpus[2]["memory_total"] is None and verdicts[2] == ([], [])  # MIG: 35 of 40 GiB used by other tenants
    assert gpus[3]["ecc_uncorrected"] is None and verdicts[3] == (
        [],
        ["GPU 3 (NVIDIA GeForce RTX 4090): clocks held down (software thermal slowdown)"],
    )
    assert verdicts[4] == (["GPU 4: NVML cannot read it (GPU is lost)"], [])


class AmdSmiException(Exception):
    pass


class FakeAmdSmi:
    """amdsmi over three GPUs: 0 an idle, healthy MI300X; 1 a busy MI300X with a pending and an unreservable bad page,
    uncorrectable ECC errors, a thermal limit active, a narrowed slower link and most of its memory held; 2 an MI250X
    whose amdsmi has no violation status and reads "N/A" where a field is unfilled."""

    AmdSmiException = AmdSmiException

    class AmdSmiMemoryType(enum.IntEnum):
        VRAM = 0
        VIS_VRAM = 1
        GTT = 2

    class AmdSmiMemoryPageStatus(enum.IntEnum):
        RESERVED = 0
        PENDING = 1
        UNRESERVABLE = 2

    def __init__(self):
        self.open = 0

    def amdsmi_init(self):
        self.open += 1

    def amdsmi_shut_down(self):
        self.open -= 1

    def amdsmi_get_processor_handles(self):
        return [0, 1, 2]

    def amdsmi_get_gpu_asic_info(self, h):
        return {"market_name": ["AMD Instinct MI300X", "AMD Instinct MI300X", "AMD Instinct MI250X"][h]}

    def amdsmi_get_gpu_total_ecc_count(self, h):
        return {"correctable_count": 5, "uncorrectable_count": [0, 3, 0][h], "deferred_count": 0}

    def amdsmi_get_gpu_bad_page_info(self, h):
        return [
            [],
            [
                {"value": 0, "page_address": 4096, "page_size": 4096, "status": 1},
                {"value": 1, "page_address": 8192, "page_size": 4096, "status": 2},
            ],
            [],
        ][h]

    def amdsmi_get_violation_status(self, h):
        if h == 2:
            raise AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")
        return {
            "active_prochot_thrm": False,
            "active_ppt_pwr": True,
            "active_socket_thrm": h == 1,
            "active_vr_thrm": "N/A",
            "active_hbm_thrm": False,
        }

    def amdsmi_get_gpu_activity(self, h):
        return {"gfx_activity": [0, 97, "N/A"][h], "umc_activity": 0, "mm_activity": "N/A"}

    def amdsmi_get_pcie_info(self, h):
        return {
            "pcie_static": {
                "max_pcie_width": 16,
                "max_pcie_speed": 32000,
                "pcie_interface_version": 5,
                "slot_type": "OAM",
            },
            "pcie_metric": {
                "pcie_width": [4, 8, 16][h],
                "pcie_speed": [2500, 16000, "N/A"][h],
                "pcie_bandwidth": "N/A",
            },
        }

    def amdsmi_get_gpu_memory_total(self, h, mem_type):
        assert mem_type == self.AmdSmiMemoryType.VRAM
        return [192, 192, 64][h] * GIB

    def amdsmi_get_gpu_memory_usage(self, h, mem_type):
        return [GIB // 4, 180 * GIB, "N/A"][h]


def test_amdsmi_readings_and_their_verdicts(monkeypatch):
    amd = FakeAmdSmi()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: an AMD node
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    gpus, library = gpu_health.read_gpus()
    assert library == "amdsmi" and amd.open == 0
    verdicts = [gpu_health.problems(g) for g in gpus]
    # idle, its link narrowed to x4 gen 1 to save power: nothing to say
    assert gpus[0]["pcie_width"] is None and verdicts[0] == ([], [])
    g1 = "GPU 1 (AMD Instinct MI300X)"
    assert verdicts[1] == (
        [
            f"{g1}: 3 uncorrected ECC error(s) since the driver loaded",
            f"{g1}: a page retirement is pending (it takes effect after a GPU reset)",
            f"{g1}: a bad memory page could not be retired (the GPU needs service)",
            f"{g1}: only 12.0 GiB free, 180.0 of 192.0 GiB held by other processes (a leftover job?)",
        ],
        [
            f"{g1}: clocks held down (thermal slowdown)",
            f"{g1}: PCIe link x8, below its x16",
            f"{g1}: PCIe gen 4, below its gen 5",
        ],
    )
    assert gpus[2]["slowdowns"] is None and gpus[2]["memory_used"] is None and verdicts[2] == ([], [])


def test_a_node_without_either_library_reads_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    gpus, why = gpu_health.read_gpus()  # this machine: pynvml installed, no NVIDIA driver
    assert gpus == [] and why.startswith("NVML unavailable") and why.endswith("; amdsmi not installed")
