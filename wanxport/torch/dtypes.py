"""Tensors as the collective layer sees them, and torch's reduce ops with gloo's rules.

The collective layer moves numpy arrays. Every torch dtype has a numpy view except a
few (bfloat16, complex32, the float8 types): those travel as the unsigned integer of
the same width, which moves their bytes unchanged (data movement is bitwise). For
reductions the bits must be read as numbers again, so ``fold`` reduces in torch, in
the tensor's own dtype, one contribution at a time in rank order: each step rounds
to the dtype as gloo's element-wise functions do (``c10::BFloat16`` and
``c10::Half`` add in float and round per step).

Which op a dtype takes follows gloo: the bitwise ops need an integer or bool tensor,
MAX and MIN a real one, AVG (a sum divided by the member count) a floating one. An
error names the op as ``ReduceOp.MAX`` and the dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

__all__ = ["FAST", "check_op", "codec_for", "copy_exact", "fast_path", "fold", "from_wire", "op_name",
           "summable", "wire"]

_R = dist.ReduceOp
_NAMES = [(_R.SUM, "SUM"), (_R.AVG, "AVG"), (_R.PRODUCT, "PRODUCT"), (_R.MIN, "MIN"), (_R.MAX, "MAX"),
          (_R.BAND, "BAND"), (_R.BOR, "BOR"), (_R.BXOR, "BXOR"), (_R.PREMUL_SUM, "PREMUL_SUM")]
_FOLDS = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
          "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
          "BXOR": torch.bitwise_xor}
_UNSIGNED = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}

#: The reductions the collective layer runs itself (fixed-order sum, compression).
FAST = {"SUM": "sum", "AVG": "mean"}


def op_name(reduce_op: Any) -> str:
    """``"MAX"`` for ``ReduceOp.MAX`` (and for its ``RedOpType``); ValueError for anything else."""
    for value, name in _NAMES:
        if reduce_op == value:
            return name
    raise ValueError(f"unknown reduce op {reduce_op!r}; valid: "
                     + ", ".join(f"ReduceOp.{n}" for _, n in _NAMES[:-1]))


def check_op(name: str, dtype: torch.dtype, what: str) -> None:
    """ValueError (naming ``ReduceOp.<name>`` and the dtype) where gloo's rules refuse the pair."""
    integral = not dtype.is_floating_point and not dtype.is_complex
    if name not in _FOLDS:
        raise ValueError(f"{what}: ReduceOp.{name} is not supported by the wanxport backend "
                         f"(SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR are)")
    if name in ("BAND", "BOR", "BXOR") and not integral:
        raise ValueError(f"{what}: ReduceOp.{name} needs an integer or bool tensor, got {dtype}")
    if name in ("MIN", "MAX") and dtype.is_complex:
        raise ValueError(f"{what}: ReduceOp.{name} needs a real tensor, got {dtype}")
    if name == "AVG" and integral:
        raise ValueError(f"{what}: ReduceOp.AVG needs a floating tensor, got {dtype}")
    if dtype.itemsize not in _UNSIGNED and not dtype.is_complex:
        raise ValueError(f"{what}: dtype {dtype} has no element width the backend moves")


def wire(tensor: torch.Tensor) -> npt.NDArray[Any]:
    """A numpy view sharing ``tensor``'s memory (contiguous CPU): its own dtype where numpy
    has it, else the unsigned integer of its width."""
    flat = tensor.detach()
    try:
        return flat.numpy()
    except TypeError:
        return flat.view(_UNSIGNED[flat.element_size()]).numpy()


def from_wire(array: npt.NDArray[Any], dtype: torch.dtype) -> torch.Tensor:
    """``wire``'s inverse: the array's memory as a ``dtype`` tensor."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def fold(name: str, parts: list[torch.Tensor], out: torch.Tensor) -> None:
    """``out = op(op(parts[0], parts[1]), parts[2]) ...`` in rank order, rounding per step;
    AVG divides after the sum."""
    combine = _FOLDS[name]
    acc = parts[0].clone()
    for part in parts[1:]:
        acc = combine(acc, part)
    if name == "AVG":
        acc = acc / len(parts)
    out.copy_(acc.reshape(out.shape))


def summable(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The array the collective sums: bool as its bytes (uint8), as gloo adds bools, so a
    sum's bytes count the True contributions (gloo's result, bitwise)."""
    return array.view(np.uint8) if array.dtype == np.bool_ else array


def copy_exact(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, keeping a bool sum's bytes (``copy_`` would make every True a 1)."""
    if dst.dtype == torch.bool and src.dtype == torch.bool:
        dst.view(torch.uint8).copy_(src.view(torch.uint8))
    else:
        dst.copy_(src)


def codec_for(dtype: torch.dtype, compress: str | None) -> str | None:
    """The codec a SUM/AVG of ``dtype`` travels in: ``compress`` for float32 and bfloat16 (the
    codecs encode float32), none for other dtypes, which the codecs would not keep exact."""
    return compress if dtype in (torch.float32, torch.bfloat16) else None


def fast_path(name: str, dtype: torch.dtype) -> bool:
    """Whether the collective layer reduces this pair itself (in a float32 copy for bfloat16)."""
    if name not in FAST or dtype.is_complex:
        return False
    try:
        np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    except TypeError:
        return dtype == torch.bfloat16
    return True
