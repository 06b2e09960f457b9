#!/usr/bin/env bash
# The NPU check: verify and time a kernel pack's Triton-Ascend kernels on the Ascend NPU here.
#
# On KOPE's machine (no GPU needed), make the pack:
#   kope precompile MODEL --target ascend        # kernels verified under Triton's interpreter
#   kope export --target ascend -o npu-pack      # kernels, inputs, reference outputs, runner
# On the NPU host (torch, torch_npu and triton-ascend only; installs nothing; the pack is under 40 MiB):
#   bash benchmarks/npu_check.sh npu-pack
# It prints, per operator, the verdict, eager's and the best kernel's median latency and the
# speedup over eager, then the geomean; results go to npu-pack/results.json. Back here:
#   kope memory import-results npu-pack/results.json
# A second run's results confirm the first's figures (only confirmed figures pin a kernel).
set -euo pipefail
pack=${1:-npu-pack}
python=${PYTHON:-python3}
if [ ! -f "$pack/manifest.json" ]; then
  echo "npu_check: no kernel pack at '$pack' (make one with: kope export --target ascend -o $pack)" >&2
  exit 2
fi
"$python" - <<'PY'
import torch, triton
try:
    import torch_npu  # noqa: F401  (registers torch.npu)
except ImportError:
    pass
print(f"torch {torch.__version__}, triton {triton.__version__}, "
      f"device: "
      f"{torch.npu.get_device_name(0) if getattr(torch, 'npu', None) and torch.npu.is_available() else 'none (interpreter)'}")
PY
# Each kernel runs in a child process with this limit; the whole check stays within 8 minutes.
timeout 470 "$python" "$pack/runner.py" "$pack" --timeout-s "${KOPE_KERNEL_TIMEOUT_S:-60}"
