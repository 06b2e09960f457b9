"""The Ascend target: the agent's kernels are Triton-Ascend, launched on a Huawei NPU.

Triton-Ascend compiles the same `@triton.jit` language for the NPU's cores, under other rules
than a GPU's, and those rules are part of the kernels KOPE writes and of the prompt: a 1-D grid
no larger than the core count (vector cores for vector kernels, AI cores for `tl.dot`), so a
kernel loops over its tiles inside a program; a block footprint within the 192 KB unified
buffer (doubled when multibuffering, which is on by default); rows aligned to 32 bytes; no
`num_warps` or `num_stages` (block sizes and `multibuffer` are what tunes).

Tensors live on `npu` through `torch_npu`, whose PyPI builds pair with another torch than the
one torch-mlir needs here, and `triton-ascend` replaces community triton's package: the NPU's
toolchain and the reference lowering cannot share one environment. Here (no NPU) the target
verifies kernels under community triton's interpreter, which runs the same language on the
host; on an NPU host, kernels run there from an exported kernel pack.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from kope.targets.triton import TritonTarget
from kope.targets.triton_rules import MatmulTile, TritonRules

# Ascend 910B's cores (the 910B3: 20 AI cores, each with 2 vector cores) and unified buffer;
# a present device reports its own.
AI_CORES = 20
VECTOR_CORES = 40
UNIFIED_BUFFER_BYTES = 192 * 1024

# An NPU's kernels: a 1-D grid of at most the core count, each program looping over its tiles;
# blocks within the unified buffer, multibuffered by preference; no warps or stages. Larger
# blocks than a GPU's: a few programs carry all the work.
ASCEND_RULES = TritonRules(
    grid_dims=1,
    programs=VECTOR_CORES,
    dot_programs=AI_CORES,
    multibuffer=(True, False),
    ub_bytes=UNIFIED_BUFFER_BYTES,
    pointwise_blocks=(256, 512, 1024, 2048, 4096, 8192, 16384),
    pointwise_largest=8192,
    loops_programs=VECTOR_CORES,
    loops_target=(16, 1024),
    matmul_tiles=(
        MatmulTile(128, 128, 64, 3.0),
        MatmulTile(128, 128, 32, 2.8),
        MatmulTile(128, 64, 64, 2.5),
        MatmulTile(64, 128, 64, 2.5),
        MatmulTile(64, 64, 64, 2.0),
        MatmulTile(64, 64, 128, 1.5),
        MatmulTile(32, 32, 64, 1.0),
    ),
)


def _npu() -> Any:
    return getattr(torch, "npu", None)  # registered by `import torch_npu`


def _synchronize() -> None:
    npu = _npu()
    if npu is not None and npu.is_available():
        npu.synchronize()


class AscendTarget(TritonTarget):
    """Triton-Ascend kernels on an Ascend NPU (or under Triton's interpreter without one)."""

    name = "ascend"
    device = "npu"
    flavour = "ascend"
    extra = "ascend"
    ray_resource = "NPU"  # the resource Ascend hosts declare: `ray start --resources '{"NPU": 8}'`
    check_script = "benchmarks/npu_check.sh"
    synchronize: ClassVar[Any] = staticmethod(_synchronize)
    constraints = (
        f"Ascend rules: a 1-D grid of at most {VECTOR_CORES} programs for vector kernels and "
        f"{AI_CORES} for kernels using tl.dot: loop over tiles inside a program "
        "(`for tile in range(tl.program_id(0), num_tiles, NUM_PROGRAMS)`). The blocks live "
        f"in a {UNIFIED_BUFFER_BYTES // 1024} KB unified buffer, doubled by multibuffering: "
        "keep twice the bytes of the live blocks within it. Align block rows to 32 bytes. "
        "No num_warps or num_stages."
    )

    @classmethod
    def device_present(cls) -> bool:
        npu = _npu()
        return bool(npu is not None and npu.is_available())

    @classmethod
    def device_absent_reason(cls) -> str:
        if _npu() is None:
            return "no Ascend NPU: torch_npu is not installed in this environment"
        return "no Ascend NPU: torch.npu.is_available() is False"

    def device_name(self) -> str:
        npu = _npu()
        assert npu is not None
        return f"{npu.get_device_name(npu.current_device())}"

    def capabilities(self) -> dict[str, Any]:
        return {
            "flavour": self.flavour,
            "grid_dims": 1,
            "max_programs": VECTOR_CORES,
            "ai_cores": AI_CORES,
            "ub_bytes": UNIFIED_BUFFER_BYTES,
            "multibuffer": True,
            "interpreter": self.interpreting(),
        }

    def kernel_rules(self) -> TritonRules:
        return ASCEND_RULES
