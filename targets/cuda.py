"""The CUDA target: the agent's kernels are Triton, launched on an NVIDIA GPU.

What is shared with every Triton target (the kernel form, the sandboxed build, the
interpreter on machines without the device, the prompt) is `kope.targets.triton`; this module
says what is CUDA's: how to find the device, what identifies it in a key, how the timer waits
for it, and the launch options kernels may tune (`num_warps`, `num_stages`). Matmuls are
verified in full float32: TF32 (`input_precision="tf32"`) changes results beyond float32's
tolerance, so kernels use `input_precision="ieee"`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from kope.targets.device_compile import configured_architectures
from kope.targets.triton import TritonTarget


def _synchronize() -> None:
    if torch.cuda.is_available():  # under the interpreter the host has done the work
        torch.cuda.synchronize()


class CudaTarget(TritonTarget):
    """Triton kernels on a CUDA GPU (or under Triton's interpreter without one)."""

    name = "cuda"
    device = "cuda"
    flavour = "cuda"
    extra = "cuda"
    synchronize: ClassVar[Any] = staticmethod(_synchronize)
    constraints = (
        "The grid may have up to 3 dimensions. Launch options: num_warps (4 or 8) and "
        'num_stages (2 to 4). Write `tl.dot(a, b, input_precision="ieee")`: TF32 is off; '
        "each dimension of a tl.dot block is at least 16."
    )

    @classmethod
    def default_architectures(cls) -> tuple[str, ...]:
        return configured_architectures()

    @classmethod
    def device_present(cls) -> bool:
        return torch.cuda.is_available()

    @classmethod
    def device_absent_reason(cls) -> str:
        if torch.version.cuda is None:
            return f"no CUDA device: this torch ({torch.__version__}) is a CPU-only build"
        return "no CUDA device: torch.cuda.is_available() is False (no GPU, or no driver)"

    @classmethod
    def prepare_worker(cls, eager_threads: int) -> None:
        super().prepare_worker(eager_threads)
        if cls.device_present():
            torch.backends.cuda.matmul.allow_tf32 = False  # eager's figures in float32, too

    def device_name(self) -> str:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{props.name}|sm{props.major}{props.minor}|cuda-{torch.version.cuda}"

    def capabilities(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "flavour": self.flavour,
            "grid_dims": 3,
            "num_warps": [4, 8],
            "num_stages": [2, 3, 4],
            "allow_tf32": False,
            "interpreter": self.interpreting(),
        }
        if not self.interpreting():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            found["multiprocessors"] = props.multi_processor_count
        return found
