"""Where the next-call network runs: the Keras backend, the device and the precision.

One model for every backend (Keras 3): TensorFlow on the CPU by default, JAX on a GPU machine
(by itself where the `gpu` extra is installed, or `KERAS_BACKEND=jax`), PyTorch where it is what
a machine has. Model, data and prediction code use `keras.ops` and numpy only; this module is the
one place that asks a backend what it sees (its devices, its chip) or sets what it needs:
`configure` turns JAX's 64-bit mode on before any model is built or loaded (the n-gram keys are
62-bit), `data_parallel` spreads training over every device the backend sees, and a GPU trains in
the mixed policy its chip suits. The rules: docs/gpu.md#the-backend-module.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from typing import Any

from tasks.core.quiet import has_nvidia_gpu

BACKENDS = ("tensorflow", "jax", "torch")
DEFAULT = "tensorflow"  # on a CPU; see backend_name
# what to install when KERAS_BACKEND names a backend this environment lacks
INSTALL = {
    "tensorflow": "pip install -e . (TensorFlow, the default, comes with the project)",
    "jax": "pip install -e '.[jax]' (CPU) or -e '.[gpu]' (NVIDIA GPU: jax[cuda12])",
    "torch": "pip install torch",
}


class BackendUnavailable(RuntimeError):
    """KERAS_BACKEND names a backend that is unknown or not installed here."""


def backend_name() -> str:
    """The backend Keras will use, checked to be installed: KERAS_BACKEND; unset, JAX where this
    machine shows an NVIDIA GPU and JAX is installed (the `gpu` extra; TensorFlow's CPU build
    would leave the GPU idle), else TensorFlow. The choice is written to KERAS_BACKEND, which
    Keras reads when it is first imported."""
    name = os.environ.get("KERAS_BACKEND") or ""
    if not name:
        gpu_jax = has_nvidia_gpu() and importlib.machinery.PathFinder.find_spec("jax") is not None
        name = os.environ["KERAS_BACKEND"] = "jax" if gpu_jax else DEFAULT
    if name not in BACKENDS:
        raise BackendUnavailable(
            f"KERAS_BACKEND={name}: not a backend heapcast runs on; use one of {', '.join(BACKENDS)}"
        )
    # sys.path's finder alone: a meta-path finder's answer (tasks.core.quiet's, which wraps
    # TensorFlow's import once) is for the import itself, not for this question
    if importlib.machinery.PathFinder.find_spec(name) is None:
        raise BackendUnavailable(
            f"KERAS_BACKEND={name}: {name} is not installed in this environment; "
            f"{INSTALL[name]}, or unset KERAS_BACKEND to train with TensorFlow on the CPU"
        )
    return name


class _CheckBeforeKeras(importlib.abc.MetaPathFinder):
    """On the first `import keras`: the backend checked (one line naming what to install, not
    Keras's ModuleNotFoundError from deep inside its start-up) and JAX told to keep 64-bit
    integers before Keras imports it. Then leaves sys.meta_path; finds nothing itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != "keras":
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _CheckBeforeKeras)]
        if backend_name() == "jax":
            os.environ.setdefault("JAX_ENABLE_X64", "1")
        return None


def check_before_keras() -> None:
    """Run the backend check at the process's first `import keras` (tasks/__init__.py)."""
    if "keras" in sys.modules or any(isinstance(f, _CheckBeforeKeras) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _CheckBeforeKeras())


_configured: str | None = None


def configure() -> str:
    """Check the backend, import Keras on it, set what it needs; returns the backend's name."""
    global _configured
    if _configured is None:
        name = backend_name()
        if name == "jax":
            # before jax is first imported (keras imports it), and again below in case it was
            os.environ.setdefault("JAX_ENABLE_X64", "1")
        # deferred: the backend is imported when asked, never by importing this module
        import keras

        if keras.backend.backend() != name:  # ~/.keras/keras.json chose another
            name = keras.backend.backend()
        if name == "jax":
            # deferred: the backend is imported when asked, never by importing this module
            import jax

            jax.config.update("jax_enable_x64", True)
        _configured = name
    return _configured


@dataclass(frozen=True)
class Placement:
    """Where training runs: what the run logs (`backend`, `device`, `precision`)."""

    backend: str
    device: str  # "cpu", or "gpu: <chip name>"
    devices: int  # accelerators visible (0 on a CPU)
    precision: str  # Keras's dtype policy: float32, mixed_bfloat16 or mixed_float16
    replicas: int = 1  # devices a training step is split over (data_parallel)

    @property
    def on_gpu(self) -> bool:
        return self.devices > 0

    def line(self) -> str:
        n = f" x{self.replicas}" if self.replicas > 1 else ""
        return f"{self.backend} on {self.device}{n}, {self.precision}"


def _gpus(name: str) -> list[tuple[str, float]]:
    """(chip name, compute capability) of each GPU the backend sees."""
    if name == "tensorflow":
        # deferred: the backend is imported when asked, never by importing this module
        import tensorflow as tf

        out = []
        for d in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(d)
            cc = details.get("compute_capability") or (0, 0)
            out.append((details.get("device_name", d.name), cc[0] + cc[1] / 10))
        return out
    if name == "jax":
        # deferred: the backend is imported when asked, never by importing this module
        import jax

        return [
            (d.device_kind, float(getattr(d, "compute_capability", 0) or 0))
            for d in jax.devices()
            if d.platform in ("gpu", "cuda", "rocm")
        ]
    if name == "torch":
        # deferred: the backend is imported when asked, never by importing this module
        import torch

        if not torch.cuda.is_available():
            return []
        return [
            (
                torch.cuda.get_device_name(i),
                float("{}.{}".format(*torch.cuda.get_device_capability(i))),
            )
            for i in range(torch.cuda.device_count())
        ]
    return []


def precision_for(gpus: list[tuple[str, float]]) -> str:
    """The dtype policy for these GPUs: bf16 from compute capability 8.0, fp16 below, fp32 on CPU."""
    if not gpus:
        return "float32"
    return "mixed_bfloat16" if min(cc for _, cc in gpus) >= 8.0 else "mixed_float16"


def placement() -> Placement:
    """Where a model built now would train, and in which precision."""
    name = configure()
    gpus = _gpus(name)
    device = f"gpu: {gpus[0][0]}" if gpus else "cpu"
    return Placement(name, device, len(gpus), precision_for(gpus), len(_parallel_devices(name)))


def _parallel_devices(name: str) -> list[str]:
    """The devices Keras's distribution API can spread a step over (JAX only; else one)."""
    if name != "jax":
        return ["default"]
    # deferred: the backend is imported when asked, never by importing this module
    import keras

    return keras.distribution.list_devices()


def data_parallel(where: Placement, batch_size: int):
    """A context in which models built and trained are data-parallel over where.replicas devices.

    The batch is split evenly: one not divisible by the devices is refused with the sizes that
    are. Outside the context Keras runs on one device again (prediction and saving need no
    distribution)."""
    if where.replicas <= 1:
        return contextlib.nullcontext()
    if batch_size % where.replicas:
        lo = batch_size - batch_size % where.replicas
        raise ValueError(
            f"batch size {batch_size} does not split over {where.replicas} devices: "
            f"use {lo} or {lo + where.replicas} (batch_size / gpu_batch_size in the training config)"
        )
    # deferred: the backend is imported when asked, never by importing this module
    import keras

    devices = _parallel_devices(where.backend)
    return keras.distribution.DataParallel(devices=devices).scope()


def use_placement(where: Placement) -> None:
    """Set Keras's dtype policy for `where` (models built afterwards take it)."""
    # deferred: the backend is imported when asked, never by importing this module
    import keras

    keras.mixed_precision.set_dtype_policy(where.precision)


def out_of_memory(error: BaseException) -> bool:
    """Whether a backend's error is an accelerator out of memory (each words it its own way)."""
    text = f"{type(error).__name__}: {error}"
    return any(
        s in text
        for s in ("RESOURCE_EXHAUSTED", "ResourceExhausted", "OutOfMemory", "out of memory", "OOM")
    )
