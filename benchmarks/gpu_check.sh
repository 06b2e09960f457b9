#!/usr/bin/env bash
# The GPU check: verify and time a kernel pack's Triton kernels on the CUDA device here.
#
# On KOPE's machine (no GPU needed), make the pack:
#   kope precompile MODEL --target cuda        # kernels verified under Triton's interpreter
#   kope export --target cuda -o gpu-pack      # kernels, inputs, reference outputs, runner
# On the GPU machine (torch and triton only; installs nothing; the pack is under 40 MiB):
#   bash benchmarks/gpu_check.sh gpu-pack
# It prints, per operator, the verdict, eager's and the best kernel's median latency and the
# speedup over eager, then the geomean; results go to gpu-pack/results.json. Back here:
#   kope memory import-results gpu-pack/results.json
# A second run's results confirm the first's figures (only confirmed figures pin a kernel).
set -euo pipefail
pack=${1:-gpu-pack}
python=${PYTHON:-python3}
if [ ! -f "$pack/manifest.json" ]; then
  echo "gpu_check: no kernel pack at '$pack' (make one with: kope export --target cuda -o $pack)" >&2
  exit 2
fi
"$python" - <<'PY'
import torch, triton
print(f"torch {torch.__version__}, triton {triton.__version__}, "
      f"cuda {torch.version.cuda}, device: "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (interpreter)'}")
PY
# Each kernel runs in a child process with this limit; the whole check stays within 8 minutes.
timeout 470 "$python" "$pack/runner.py" "$pack" --timeout-s "${KOPE_KERNEL_TIMEOUT_S:-60}"
