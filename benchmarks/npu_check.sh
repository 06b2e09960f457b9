#!/usr/bin/env bash
# The NPU check: a kernel pack's Triton-Ascend kernels verified and timed on the Ascend NPU here.
#   bash benchmarks/npu_check.sh [PACK]        (default: npu-pack; see device_check.sh)
exec bash "$(dirname "$0")/device_check.sh" ascend "${1:-npu-pack}"
