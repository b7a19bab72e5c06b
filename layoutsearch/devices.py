"""The JAX devices a mesh runs on: accelerators when there are enough, else simulated CPU devices.

JAX is imported only when :func:`jax_devices` is called, after it has asked for the CPU device count.
"""

from __future__ import annotations

import os
from typing import Any

from layoutsearch.errors import LayoutSearchError


MAX_SIMULATED_DEVICES = 4096
"""The most simulated CPU devices asked for: XLA's CPU client starts every one (threads and buffers, about
0.1 MB each, and a program compiled for each), so a mesh of millions never starts; larger meshes need as many
accelerators."""


def jax_devices(n: int) -> list[Any]:
    """``n`` JAX devices: the accelerators if there are enough, else CPU devices,
    asking for ``n`` simulated ones if JAX has not started yet (``XLA_FLAGS=
    --xla_force_host_platform_device_count=n``; at most :data:`MAX_SIMULATED_DEVICES`). LayoutSearchError
    otherwise."""
    if n > MAX_SIMULATED_DEVICES:
        import jax

        devices = jax.devices()
        if len(devices) >= n and devices[0].platform != "cpu":
            return devices[:n]
        raise LayoutSearchError(f"a mesh of {n:,} devices needs {n:,} accelerators (JAX has {len(devices)} "
                                f"{devices[0].platform} devices): at most {MAX_SIMULATED_DEVICES} simulated CPU "
                                "devices are started")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    import jax

    try:
        if jax.config.jax_num_cpu_devices < n:
            jax.config.update("jax_num_cpu_devices", n)
    except (AttributeError, RuntimeError):  # an older JAX, or its backend already started
        pass
    devices = jax.devices()
    if len(devices) >= n:
        return devices[:n]
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise LayoutSearchError(f"the compiled program needs {n} devices and JAX started with {len(devices)}: "
                                f"set XLA_FLAGS=--xla_force_host_platform_device_count={n} before JAX starts")
    return devices[:n]


_KINDS = (("h200", "h200"), ("h100", "h100"), ("a100", "a100"), ("v100", "v100"), ("v5p", "tpu-v5p"),
          ("v5 lite", "tpu-v5e"), ("v5e", "tpu-v5e"), ("v4", "tpu-v4"), ("v3", "tpu-v3"), ("v2", "tpu-v2"))
"""Substrings of ``jax.Device.device_kind`` (lower case) and the hardware preset they are."""


def present_hardware(devices: list[Any]) -> str | None:
    """The hardware preset of ``devices`` (``cpu-sim`` for CPU devices), or None when no preset matches."""
    if not devices:
        return None
    if devices[0].platform == "cpu":
        return "cpu-sim"
    kind = devices[0].device_kind.lower()
    return next((preset for key, preset in _KINDS if key in kind), None)
