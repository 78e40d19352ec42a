"""In-place views of what callers pass: numpy arrays and CPU torch tensors.

torch is optional: a tensor is recognised by its type's module name and viewed
through ``.detach().numpy()`` (which shares its storage), so nothing imports torch
unless the caller already did.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def as_array(obj: Any, what: str = "array") -> npt.NDArray[Any]:
    """A numpy view sharing memory with ``obj`` (ValueError, one line, when there is none)."""
    if isinstance(obj, np.ndarray):
        return obj
    if type(obj).__module__.startswith("torch"):
        device = getattr(obj, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise ValueError(f"{what}: a {device} tensor; stage it through host memory first")
        try:
            return obj.detach().numpy()  # type: ignore[no-any-return]
        except (TypeError, RuntimeError) as exc:
            raise ValueError(f"{what}: this tensor has no numpy view ({exc})") from None
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        raise ValueError(f"{what}: need a numpy array, a CPU torch tensor or a writable buffer, "
                         f"got {type(obj).__name__}") from None


def flat_work(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A contiguous 1-D array to compute in: a view when possible, else a copy (``write_back``)."""
    if array.flags.c_contiguous:
        return array.reshape(-1)
    return np.ascontiguousarray(array).reshape(-1)


def write_back(array: npt.NDArray[Any], flat: npt.NDArray[Any]) -> None:
    """Make ``array`` hold ``flat``'s values (a no-op when ``flat`` is a view of it)."""
    if not np.shares_memory(array, flat):
        array[...] = flat.reshape(array.shape)
