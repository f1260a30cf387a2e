"""Hardware peaks: memory bandwidth and matmul rate, with where each figure came from.

Order of precedence (:func:`resolve_peaks`): a parameter always wins; then the device (NVML: maximum
memory clock x bus width x 2 transfers per clock); then the table of known GPUs below (each figure
with its source); then a measurement on this machine (a torch copy on CUDA, a numpy/torch copy of
host memory on a CPU, a bf16 matmul on a GPU, on a CPU the faster of bf16 and fp32). NVML does not report a
tensor-core rate, so the matmul rate goes parameter -> table -> measured.

The copy and matmul measurements here are the project's only ones: the kernel A/B harness records its
ceilings through them too (:func:`specdiag.kernels.timing.copy_bandwidth_gbps`, ``matmul_tflops``).

Units: bytes per second and FLOP per second internally; GB/s (1e9 B/s) and TFLOPS (1e12 FLOP/s) in
tables. A copy moves each byte twice (read + write): :func:`measure_copy_bandwidth` counts both, as
STREAM's "Copy" and the investigation's "device-to-device copy 4.23 TB/s (read+write)" do.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from specdiag.serving.locality import is_local_url

PeakSource = Literal["parameter", "nvml", "table", "measured", "recorded"]


@dataclass(frozen=True)
class GpuSpec:
    """One row of the table of known GPUs."""

    name: str                       # canonical name
    memory_bandwidth_gb_s: float    # peak DRAM bandwidth, GB/s (1e9 B/s)
    bf16_dense_tflops: float        # dense bf16 tensor-core rate (no 2:4 sparsity), TFLOPS
    memory_source: str              # where the bandwidth figure comes from
    matmul_source: str              # where the matmul figure comes from
    match: tuple[str, ...]          # all of these substrings (lower case) must be in the device name
    exclude: tuple[str, ...] = ()   # none of these may be


#: Known GPUs. Dense bf16 rates are the "with sparsity" datasheet figure halved where only that is given.
KNOWN_GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("NVIDIA H200", 4800, 989.4,
            "NVIDIA H200 datasheet: 4.8 TB/s HBM3e",
            "NVIDIA H200 datasheet: 1,979 TFLOPS bf16 with sparsity, halved; same SMs as H100 SXM",
            ("h200",)),
    GpuSpec("NVIDIA H100 PCIe", 2000, 756.5,
            "NVIDIA H100 datasheet (reprinted by archive-lib.hpctech.co.jp); product brief PB-11133-001: 2,000 GB/s",
            "NVIDIA H100 datasheet (same reprint): BF16 1,513 TFLOPS with sparsity, halved",
            ("h100", "pcie")),
    GpuSpec("NVIDIA H100 SXM", 3350, 989.4,
            "glennklockwood.com/garden/processors/h100: H100 SXM5 3.35 TB/s",
            "glennklockwood.com/garden/processors/h100: BF16 matrix 989.4 TFLOPS (dense)",
            ("h100",), ("pcie", "nvl")),  # NVL (3.9 TB/s) is excluded: no source checked
    GpuSpec("NVIDIA B200", 8000, 2250.0,
            "glennklockwood.com/garden/processors/B200: 8 TB/s",
            "glennklockwood.com/garden/processors/B200: HGX B200 at 1,000 W, BF16 2,250 TFLOPS dense",
            ("b200",)),
    GpuSpec("NVIDIA A100 80GB SXM", 2039, 312.0,
            "glennklockwood.com/garden/processors/A100 (NVIDIA A100 datasheet): 80 GB SXM4 2,039 GB/s",
            "NVIDIA A100 datasheet: BF16 312 TFLOPS dense",
            ("a100", "80gb"), ("pcie",)),
    GpuSpec("NVIDIA A100 80GB PCIe", 1935, 312.0,
            "NVIDIA A100 datasheet (via thundercompute.com A100 specs): 80 GB PCIe 1,935 GB/s",
            "NVIDIA A100 datasheet: BF16 312 TFLOPS dense",
            ("a100", "80gb", "pcie")),
    GpuSpec("NVIDIA A100 40GB", 1555, 312.0,
            "glennklockwood.com/garden/processors/A100 (NVIDIA A100 datasheet): 40 GB 1,555 GB/s",
            "NVIDIA A100 datasheet: BF16 312 TFLOPS dense",
            ("a100",), ("80gb",)),
    GpuSpec("NVIDIA L40S", 864, 362.05,
            "NVIDIA L40S datasheet (reprinted by mullet.se): 864 GB/s GDDR6",
            "NVIDIA L40S datasheet: BFLOAT16 Tensor Core 362.05 TFLOPS (733 with sparsity)",
            ("l40s",)),
    GpuSpec("NVIDIA GeForce RTX 4090", 1008, 165.2,
            "RTX 4090 spec (thefpsreview.com, waredb.com): 384-bit GDDR6X at 21 Gbps, 1,008 GB/s",
            "Ada whitepaper via waredb.com: BF16 tensor 165.15 TFLOPS dense (FP32 accumulate)",
            ("4090",)),
    GpuSpec("NVIDIA RTX PRO 6000 Blackwell", 1792, 503.8,
            "512-bit GDDR7 at 28 Gbps = 1,792 GB/s (gpu.name citing VideoCardz)",
            "hmc-tech.com spec aggregator, 503.8 TFLOPS bf16 dense (UNCONFIRMED against NVIDIA)",
            ("rtx pro 6000",)),
)


def nvidia_smi_gpu(index: int = 0) -> dict[str, Any]:
    """The GPU as nvidia-smi names it (a run.json ``device``): name, driver, memory; ``gpu`` None and why when
    nvidia-smi is missing or fails (a dry run on a CPU)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.splitlines()
        name, driver, mem = [x.strip() for x in out[0].split(",")]
        return {"gpu": name, "driver": driver, "memory_total": mem, "source": "nvidia-smi"}
    except Exception as exc:  # noqa: BLE001 - no GPU here: say so
        return {"gpu": None, "source": f"nvidia-smi failed: {exc}"[:200]}


def nvml_gpu_facts(index: int = 0) -> dict[str, Any]:
    """The GPU and driver as NVML sees them (a recorded run's provenance): ``gpu``, ``driver_version``, ``gpu_count``,
    ``gpu_memory_total_gib``; ``nvml_error`` instead where NVML is missing or fails (a CPU machine)."""
    out: dict[str, Any] = {}
    try:
        import pynvml  # noqa: PLC0415 - optional at import time

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            out["gpu"] = name.decode() if isinstance(name, bytes) else name
            drv = pynvml.nvmlSystemGetDriverVersion()
            out["driver_version"] = drv.decode() if isinstance(drv, bytes) else drv
            out["gpu_count"] = pynvml.nvmlDeviceGetCount()
            out["gpu_memory_total_gib"] = round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 1)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"
    return out


def lookup_gpu(device_name: str) -> GpuSpec | None:
    """The known GPU whose match strings all occur in ``device_name`` (case-insensitive), or None."""
    name = device_name.lower()
    for spec in KNOWN_GPUS:
        if all(m in name for m in spec.match) and not any(x in name for x in spec.exclude):
            return spec
    return None


#: What each peak source is, in the words a page shows: NVML gives clocks and a bus width, from which the
#: peak is computed (nothing is measured); the table holds published datasheet figures.
PEAK_SOURCE_LABELS: dict[str, str] = {
    "parameter": "parameter (user-supplied)",
    "nvml": "computed (NVML clocks x bus width)",
    "table": "published (table of known GPUs)",
    "measured": "measured (a copy or matmul timed here)",
    "recorded": "recorded (run.json)",
}
#: The :data:`specdiag.findings.Source` of a finding that states a peak from each source.
PEAK_FINDING_SOURCE: dict[str, str] = {"parameter": "parameter", "nvml": "computed", "table": "published",
                                       "measured": "measured"}


def gb_s(value: float) -> str:
    """A bandwidth as every page of a run writes it, so one figure reads the same everywhere: '4,800 GB/s',
    '13.1 GB/s' (three significant digits below 100)."""
    return f"{value:,.0f} GB/s" if abs(value) >= 100 else f"{value:.3g} GB/s"


def source_label(source: str | None) -> str:
    """A peak source (``Peak.source``, or a recorded ``memory_bandwidth_source``) as a page labels it."""
    return PEAK_SOURCE_LABELS.get(str(source), str(source))


@dataclass(frozen=True)
class Peak:
    """One peak figure and its provenance."""

    value: float         # bytes/s (bandwidth) or FLOP/s (matmul)
    source: PeakSource   # parameter, nvml, table, measured, recorded
    detail: str          # how it was obtained, with the numbers that went in

    @property
    def label(self) -> str:
        """The source as a page labels it (:data:`PEAK_SOURCE_LABELS`): NVML's peak is computed, not measured."""
        return source_label(self.source)

    def finding_source(self, recorded_as: str = "published") -> str:
        """The finding source of this figure; a recorded figure takes the recorded run's (``recorded_as``)."""
        return PEAK_FINDING_SOURCE.get(self.source, recorded_as)


@dataclass(frozen=True)
class HardwarePeaks:
    """Peaks of ONE device (one GPU, or the host for a CPU run)."""

    device_name: str
    memory_bandwidth: Peak           # bytes/s
    matmul: Peak | None              # FLOP/s (bf16 on a GPU; on a CPU its faster of bf16 and fp32); None when unknown

    @property
    def memory_bandwidth_gb_s(self) -> float:
        return self.memory_bandwidth.value / 1e9

    @property
    def matmul_tflops(self) -> float | None:
        return self.matmul.value / 1e12 if self.matmul else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_name": self.device_name,
            "memory_bandwidth_gb_s": self.memory_bandwidth_gb_s,
            "memory_bandwidth_source": self.memory_bandwidth.source,
            "memory_bandwidth_detail": self.memory_bandwidth.detail,
            "matmul_bf16_tflops": self.matmul_tflops,
            "matmul_source": self.matmul.source if self.matmul else None,
            "matmul_detail": self.matmul.detail if self.matmul else None,
        }


# ---------------------------------------------------------------------------------------------
# NVML
# ---------------------------------------------------------------------------------------------

def nvml_memory_bandwidth(index: int = 0) -> tuple[str, float, str] | None:
    """(device name, bytes/s, detail) from NVML, or None when NVML or the GPU is not there.

    Bandwidth = maximum memory clock (MHz) x 1e6 x 2 (double data rate, as NVML reports the memory
    clock for HBM and GDDR) x bus width (bits) / 8. For instance the project's H200 reported a
    3201 MHz maximum memory clock and a 6016-bit bus (2026-11-29): 3201e6 x 2 x 752 B = 4.81 TB/s,
    its datasheet's 4.8 TB/s; a 1 GiB device-to-device copy there moved 4.2 TB/s (read + write).
    """
    try:
        import pynvml  # noqa: PLC0415 - optional at import time
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: no NVML figure
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        if not clock_mhz or not bus_bits:
            return None
        value = clock_mhz * 1e6 * 2 * bus_bits / 8
        detail = (f"NVML on GPU {index} ({name}): max memory clock {clock_mhz} MHz x 2 (DDR) x "
                  f"{bus_bits}-bit bus / 8 = {value / 1e9:,.0f} GB/s")
        return name, value, detail
    except Exception:  # noqa: BLE001 - an NVML call this driver lacks: no NVML figure
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------------
# Measurements (raw samples; summaries are the caller's)
# ---------------------------------------------------------------------------------------------

def cuda_available() -> bool:
    try:
        import torch  # noqa: PLC0415 - optional: the except says what happens without it
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def measure_copy_bandwidth(device: str = "cpu", n_bytes: int = 256 * 2**20, repeats: int = 5,
                           warmup: int = 2) -> list[float]:
    """Copy ``n_bytes`` from one buffer to another ``repeats`` times; return bytes/s per repeat.

    Each copy reads and writes ``n_bytes``: the rate counts 2 x n_bytes. On CUDA the copy is a torch
    device-to-device copy timed with CUDA events; on the CPU a numpy copy (one thread, host DRAM:
    pick ``n_bytes`` well above the last-level cache). Warm-up copies are not returned.
    """
    if n_bytes <= 0 or repeats < 1:
        raise ValueError("n_bytes and repeats must be positive")
    rates: list[float] = []
    if device.startswith("cuda"):
        import torch  # noqa: PLC0415 - loads torch (costly: ARCHITECTURE.md, Imports)

        src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        for i in range(warmup + repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            if i >= warmup:
                rates.append(2 * n_bytes / (start.elapsed_time(end) / 1000.0))
        return rates

    src_np = np.ones(n_bytes, dtype=np.uint8)
    dst_np = np.empty_like(src_np)
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        np.copyto(dst_np, src_np)
        dt = time.perf_counter() - t0
        if i >= warmup:
            rates.append(2 * n_bytes / dt)
    return rates


def measure_matmul_rate(device: str = "cpu", n: int = 2048, repeats: int = 5, warmup: int = 2,
                        dtype: str = "bfloat16") -> list[float]:
    """Time ``repeats`` n x n matmuls in ``dtype`` (2 n^3 FLOP each); return FLOP/s per repeat."""
    import torch  # noqa: PLC0415 - loads torch (costly: ARCHITECTURE.md, Imports)

    kind = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=kind)
    b = torch.randn(n, n, device=device, dtype=kind)
    c = torch.empty(n, n, device=device, dtype=kind)
    rates: list[float] = []
    for i in range(warmup + repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=c)
            end.record()
            torch.cuda.synchronize()
            dt = start.elapsed_time(end) / 1000.0
        else:
            t0 = time.perf_counter()
            torch.matmul(a, b, out=c)
            dt = time.perf_counter() - t0
        if i >= warmup:
            rates.append(2 * n**3 / dt)
    return rates


CPU_MATMUL_DTYPES = ("bfloat16", "float32")


def fastest_cpu_matmul_dtype(probe_n: int = 256) -> str:
    """The dtype of :data:`CPU_MATMUL_DTYPES` this CPU multiplies fastest (one small probe each). A CPU without bf16
    units emulates bf16 about 100x slower than float32 (0.9 against 152 GFLOPS on a 2-core x86 host, measured), while
    one with AMX runs bf16 faster: the compute floor takes the faster, so it stays a lower bound whichever dtype the
    server computes in (the embedded server: float32)."""
    rates = {d: max(measure_matmul_rate("cpu", n=probe_n, repeats=1, warmup=1, dtype=d)) for d in CPU_MATMUL_DTYPES}
    return max(rates, key=lambda d: rates[d])


def _cuda_name(index: int = 0) -> str:
    try:
        import torch  # noqa: PLC0415 - loads torch (costly: ARCHITECTURE.md, Imports)

        return str(torch.cuda.get_device_name(index))
    except Exception:  # noqa: BLE001 - no CUDA: a generic name
        return "GPU"


def host_name() -> str:
    return f"host CPU ({platform.processor() or platform.machine()})"


# ---------------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------------

def resolve_peaks(memory_bandwidth_gb_s: float | None = None, matmul_tflops: float | None = None,
                  device_name: str | None = None, device: str = "auto", allow_nvml: bool = True,
                  allow_measure: bool = True, gpu_index: int = 0) -> HardwarePeaks:
    """Peaks of one device: parameter > NVML > table > measured (matmul: parameter > table > measured).

    ``device``: ``auto`` (CUDA when available, else the CPU), ``cuda`` or ``cpu``. ``device_name``
    names the GPU for the table when it is not this machine's (a remote server's GPU). On a CPU the
    memory peak is the host DRAM bandwidth: pass it, or it is measured with a numpy copy.
    Raises ValueError, naming the parameter to pass, when nothing gives a figure.
    """
    for label, v in (("memory_bandwidth_gb_s", memory_bandwidth_gb_s), ("matmul_tflops", matmul_tflops)):
        if v is not None and not v > 0:
            raise ValueError(f"{label} must be a positive number or unset; got {v!r}")
    if device == "auto":
        device = "cuda" if (device_name is None and cuda_available()) else "cpu"
    nvml = nvml_memory_bandwidth(gpu_index) if (allow_nvml and device_name is None and device == "cuda") else None
    name = device_name or (nvml[0] if nvml else (host_name() if device == "cpu" else _cuda_name(gpu_index)))
    spec = lookup_gpu(name)

    mem: Peak | None = None
    if memory_bandwidth_gb_s:
        mem = Peak(memory_bandwidth_gb_s * 1e9, "parameter", f"given as a parameter: {memory_bandwidth_gb_s:g} GB/s")
    elif nvml:
        mem = Peak(nvml[1], "nvml", nvml[2])
    elif spec:
        mem = Peak(spec.memory_bandwidth_gb_s * 1e9, "table", f"{spec.name}: {spec.memory_source}")
    elif allow_measure and (device == "cpu" or device_name is None):
        n_bytes = (1 << 30) if device == "cuda" else (256 << 20)
        rates = measure_copy_bandwidth(device if device == "cuda" else "cpu", n_bytes=n_bytes)
        med = statistics.median(rates)
        what = "torch device-to-device copy" if device == "cuda" else "numpy copy of host memory (one thread)"
        mem = Peak(med, "measured", f"{what}: median of {len(rates)} copies of {n_bytes >> 20} MiB, read + write counted, "
                                    f"{med / 1e9:,.1f} GB/s (a lower bound on the peak)")
    if mem is None:
        raise ValueError(f"no memory bandwidth for {name!r}: it is not in the table of known GPUs and this "
                         f"machine cannot measure it; pass memory_bandwidth_gb_s (GB/s per device)")

    mm: Peak | None = None
    if matmul_tflops:
        mm = Peak(matmul_tflops * 1e12, "parameter", f"given as a parameter: {matmul_tflops:g} TFLOPS")
    elif spec:
        mm = Peak(spec.bf16_dense_tflops * 1e12, "table", f"{spec.name}: {spec.matmul_source}")
    elif allow_measure and (device == "cpu" or device_name is None):
        try:
            if device == "cuda":
                dtype, why = "bfloat16", ""
            else:
                dtype, why = fastest_cpu_matmul_dtype(), " (the faster of bfloat16 and float32 on this CPU)"
            n = 8192 if device == "cuda" else 1024
            rates = measure_matmul_rate(device if device == "cuda" else "cpu", n=n, dtype=dtype)
            med = statistics.median(rates)
            mm = Peak(med, "measured", f"{dtype} {n} x {n} matmul on {device}{why}: median of {len(rates)}, "
                                       f"{med / 1e12:.3g} TFLOPS")
        except Exception:  # noqa: BLE001 - no torch: the compute floor is left out, not faked
            mm = None
    return HardwarePeaks(device_name=name, memory_bandwidth=mem, matmul=mm)


def peaks_from_record(record: dict[str, Any], keep_source: bool = False) -> HardwarePeaks:
    """Peaks recorded in a run's run.json ``hardware`` section (a reference run's, or what 00_snapshot
    wrote: :meth:`HardwarePeaks.as_dict` plus context), for replay and for later notebooks of a run.

    ``keep_source``: each figure keeps the source it was resolved from (this run's own record, read back by a later
    notebook of the run); otherwise it is ``recorded`` (another run's record, replayed)."""
    try:
        bw = float(record["memory_bandwidth_gb_s"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("the recorded run's hardware section has no memory_bandwidth_gb_s: pass "
                         "memory_bandwidth_gb_s as a parameter") from None
    mm = record.get("matmul_bf16_tflops")

    def detail(prefix: str) -> str:
        parts = [str(record[k]) for k in (f"{prefix}_source", f"{prefix}_detail") if record.get(k)]
        return "run.json: " + ("; ".join(parts) if parts else "no source recorded")

    def peak(value: float, prefix: str) -> Peak:
        source = record.get(f"{prefix}_source")
        if keep_source and source in PEAK_SOURCE_LABELS:
            return Peak(value, source, str(record.get(f"{prefix}_detail") or ""))
        return Peak(value, "recorded", detail(prefix))

    return HardwarePeaks(
        device_name=str(record.get("gpu") or record.get("device_name") or "recorded device"),
        memory_bandwidth=peak(bw * 1e9, "memory_bandwidth"),
        matmul=peak(float(mm) * 1e12, "matmul") if mm else None,
    )


def peaks_for_run(memory_bandwidth_gb_s: float | None = None, matmul_tflops: float | None = None,
                  gpu_name: str = "", recorded: dict[str, Any] | None = None,
                  server_info: dict[str, Any] | None = None, server_url: str = "") -> HardwarePeaks:
    """Peaks for a notebook, each figure by its own precedence: parameters > ``gpu_name`` in the table >
    the run's recorded hardware (a replayed run's, or 00_snapshot's of the same run) > this machine
    (NVML, table, measured) when the server runs here > an error naming the parameters to pass."""
    bw = memory_bandwidth_gb_s or None
    mm = matmul_tflops or None
    if gpu_name:
        return resolve_peaks(bw, mm, device_name=gpu_name, allow_measure=False)
    if recorded and recorded.get("memory_bandwidth_gb_s"):
        base = peaks_from_record(recorded)
        return HardwarePeaks(
            device_name=base.device_name,
            memory_bandwidth=(Peak(bw * 1e9, "parameter", f"given as a parameter: {bw:g} GB/s") if bw
                              else base.memory_bandwidth),
            matmul=Peak(mm * 1e12, "parameter", f"given as a parameter: {mm:g} TFLOPS") if mm else base.matmul)
    if is_local_url(server_url):
        device = str((server_info or {}).get("device") or "auto")
        device = "cuda" if device.startswith("cuda") else ("cpu" if device == "cpu" else "auto")
        return resolve_peaks(bw, mm, device=device)
    if bw:
        return resolve_peaks(bw, mm, device_name="the server's GPU (unnamed)", allow_measure=False)
    raise ValueError(f"the server at {server_url} is not on this machine, so its GPU cannot be read here: pass "
                     f"gpu_name (e.g. 'NVIDIA H200'; known: {', '.join(s.name for s in KNOWN_GPUS)}) or "
                     f"memory_bandwidth_gb_s (and matmul_tflops)")


# ---------------------------------------------------------------------------------------------
# One peak per run
# ---------------------------------------------------------------------------------------------

def run_peaks(run: Any, memory_bandwidth_gb_s: float | None = 0.0, matmul_tflops: float | None = 0.0,
              gpu_name: str = "", recorded: dict[str, Any] | None = None, server_info: dict[str, Any] | None = None,
              server_url: str = "", device_name: str = "") -> HardwarePeaks:
    """The run's one set of peaks, which every notebook of the run uses: resolved once, by the first notebook that
    needs them (:func:`peaks_for_run`, so a copy is measured at most once per run), kept in run.json's ``hardware``
    (:meth:`HardwarePeaks.as_dict`), and read back from there by every later notebook with the source each figure
    was resolved from.

    ``run``: the run folder (:class:`specdiag.runs.Run`: ``.meta``, ``.update``). Parameters (``memory_bandwidth_gb_s``,
    ``matmul_tflops``, ``gpu_name``) that give other figures than the recorded ones win, and become the run's
    figures from then on. ``recorded``: a replayed run's ``hardware``. ``device_name``: the server's GPU as a
    measurement saw it (02's telemetry of a remote GPU), looked up in the table only when the run has no peaks yet
    and nothing else gives them. Raises ValueError, naming the parameters to pass, when nothing does.
    """
    own = dict(run.meta.get("hardware") or {})
    have = peaks_from_record(own, keep_source=True) if own.get("memory_bandwidth_gb_s") else None
    if have is not None and not (memory_bandwidth_gb_s or matmul_tflops or gpu_name):
        return have
    try:
        peaks = peaks_for_run(memory_bandwidth_gb_s, matmul_tflops, gpu_name, recorded, server_info, server_url)
    except ValueError:
        if not device_name:
            raise
        peaks = peaks_for_run(memory_bandwidth_gb_s, matmul_tflops, device_name)
    if have is not None and (have.memory_bandwidth_gb_s, have.matmul_tflops) == (peaks.memory_bandwidth_gb_s,
                                                                                 peaks.matmul_tflops):
        return have
    run.update(hardware=peaks.as_dict())
    return peaks
