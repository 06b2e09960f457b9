"""The CUDA target: the agent's kernels are Triton, launched on an NVIDIA GPU.

What is shared with every Triton target (the kernel form, the sandboxed build, the
interpreter on machines without the device, the prompt) is `kope.targets.triton`; this module
says what is CUDA's: how to find the device, what identifies it in a key, how the timer waits
for it, and the launch options kernels may tune (`num_warps`, `num_stages`). Matmuls are
verified in full float32: TF32 (`input_precision="tf32"`) changes results beyond float32's
tolerance, so kernels use `input_precision="ieee"`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from kope.targets.device_compile import configured_architectures
from kope.targets.triton import TritonTarget
from kope.targets.triton_rules import MatmulTile, TritonRules

# A GPU's kernels: one program per tile on a grid of up to 3 dimensions, launched with warps and
# stages. The matmul tiles are inductor's mm configurations (BLOCK_M, BLOCK_N, BLOCK_K, prior,
# warps, stages), grouped by GROUP_M row tiles.
CUDA_RULES = TritonRules(
    grid_dims=3,
    num_warps=(4, 8),
    num_stages=(2, 3, 4),
    group_m=8,
    allow_tf32=False,
    pointwise_blocks=(256, 512, 1024, 2048),
    pointwise_largest=1024,
    # Blocks of 128-256 outputs keep enough programs for the multiprocessors on small feature
    # maps (two per multiprocessor) and coalesce the loads along the rows.
    loops_programs=2 * 100,
    loops_target=(32, 256),
    matmul_tiles=(
        MatmulTile(64, 64, 32, 3.0, warps=4, stages=3),
        MatmulTile(128, 64, 32, 2.8, warps=4, stages=3),
        MatmulTile(64, 128, 32, 2.6, warps=4, stages=3),
        MatmulTile(128, 128, 32, 2.4, warps=8, stages=3),
        MatmulTile(64, 64, 64, 2.0, warps=8, stages=3),
        MatmulTile(128, 128, 64, 1.8, warps=8, stages=3),
        MatmulTile(32, 32, 32, 1.5, warps=4, stages=2),
        MatmulTile(64, 32, 32, 1.2, warps=4, stages=4),
    ),
)


def _synchronize() -> None:
    if torch.cuda.is_available():  # under the interpreter the host has done the work
        torch.cuda.synchronize()


class CudaTarget(TritonTarget):
    """Triton kernels on a CUDA GPU (or under Triton's interpreter without one)."""

    name = "cuda"
    device = "cuda"
    flavour = "cuda"
    extra = "cuda"
    ray_resource = "GPU"
    check_script = "benchmarks/gpu_check.sh"
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
            found["multiprocessors"] = self._multiprocessors()
        return found

    def kernel_rules(self) -> TritonRules:
        if self.interpreting():
            return CUDA_RULES
        return replace(CUDA_RULES, loops_programs=2 * self._multiprocessors())

    def _multiprocessors(self) -> int:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(props.multi_processor_count)
