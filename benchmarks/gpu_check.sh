#!/usr/bin/env bash
# The GPU check: a kernel pack's Triton kernels verified and timed on the CUDA device here.
#   bash benchmarks/gpu_check.sh [PACK]        (default: gpu-pack; see device_check.sh)
exec bash "$(dirname "$0")/device_check.sh" cuda "${1:-gpu-pack}"
