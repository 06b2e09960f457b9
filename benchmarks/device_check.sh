#!/usr/bin/env bash
# The device check: verify and time a kernel pack's Triton kernels on the device here.
#   bash benchmarks/device_check.sh cuda|ascend PACK      (gpu_check.sh and npu_check.sh call it)
#
# On KOPE's machine (no device needed), make the pack:
#   kope precompile MODEL --target cuda        # verified under Triton's interpreter, compiled
#                                              # for sm_80 and sm_90 by Triton's compiler
#   kope export --target cuda -o gpu-pack      # kernels, inputs, reference outputs, runner
# or the prepared one of the e2e models, each operator's best-estimated kernel, rehearsed:
#   python benchmarks/gpu_pack.py --out gpu-pack --store gpu-store --rehearse
# On the device's machine (torch and triton only, with torch_npu and triton-ascend for
# ascend; installs nothing; the pack is under 40 MiB):
#   bash benchmarks/gpu_check.sh gpu-pack
# It prints, per operator, the verdict, eager's and the best kernel's median latency and the
# speedup over eager, then the geomean; results go to PACK/results.json. Back here:
#   kope memory import-results gpu-pack/results.json
# A second run's results confirm the first's figures (only confirmed figures pin a kernel).
set -euo pipefail
target=${1:?"usage: device_check.sh cuda|ascend PACK"}
pack=${2:?"usage: device_check.sh cuda|ascend PACK"}
python=${PYTHON:-python3}
if [ ! -f "$pack/manifest.json" ]; then
  echo "device_check: no kernel pack at '$pack' (make one with: kope export --target $target -o $pack)" >&2
  exit 2
fi
"$python" - "$target" <<'PY'
import sys
import torch, triton
if sys.argv[1] == "ascend":
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        pass
    npu = getattr(torch, "npu", None)
    device = npu.get_device_name(0) if npu is not None and npu.is_available() else None
else:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(f"torch {torch.__version__}, triton {triton.__version__}, "
      f"device: {device or 'none (the kernels run under the interpreter, untimed)'}")
PY
# Each kernel runs with this limit (in a child process, replaced after a crash, a hang or an
# error); the whole check stays within 8 minutes.
timeout 470 "$python" "$pack/runner.py" "$pack" --timeout-s "${KOPE_KERNEL_TIMEOUT_S:-60}"
