"""What the trainer benchmark measures with: the device's matmul peak and a mode's memory.

:func:`matmul_peaks`: FLOP/s of large matmul loops (the MFU's denominator);
:class:`MemoryMeter`: a mode's peak memory (the GPU allocator's, or on CPU the growth of
the resident set, sampled by a thread); :func:`release_memory` between modes and
:func:`synchronize` around a timed step. Used by ``benchmarks/bench_trainer.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
from typing import Any


def matmul_peaks(device: Any) -> dict[str, float]:
    """FLOP/s of large matmul loops, best of three: bf16 on a GPU; fp32 (the MFU's peak)
    and bf16 (for reference: AMX or AVX-512 BF16 where the CPU has them) on CPU."""
    import torch

    if device.type == "cuda":
        return {"bf16": max(_matmul_flops(device, torch.bfloat16, n, 20) for n in (8192, 16384))}
    return {
        "fp32": _matmul_flops(device, torch.float32, 1024, 8),
        "bf16": _matmul_flops(device, torch.bfloat16, 1024, 8),
    }


def _matmul_flops(device: Any, dtype: Any, n: int, iters: int) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    for _ in range(3):
        a @ b  # warm-up (kernel choice, clocks)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        synchronize(device)
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - t0))
    return best


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryMeter:
    """Peak memory of one mode: the GPU's allocator peak, or on CPU the growth of the
    process's resident set over its size at the start, sampled by a thread."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        release_memory(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            return
        self._base = self._peak = _rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self._peak = max(self._peak, _rss())

    def stop(self) -> float:
        """Bytes: the peak (GPU) or the peak growth (CPU)."""
        import torch

        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device))
        self._done.set()
        self._thread.join()
        return float(max(self._peak, _rss()) - self._base)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release_memory(device: Any) -> None:
    """Return the memory of the previous mode, so that the next one starts clean."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
