"""The spaces of kernels, per target family: what can be written for an operator, never which.

A space generator lists an operator's configurations of one kernel family with a prior score
each and renders a configuration as a kernel; it knows no search (the heuristic agent hands its
space to `kope.agents.search`) and no target by name: it reads what the target supplies.

- `cpu` (with `schedules`, which writes them, `im2col`, a convolution rewritten as copies and
  a product, and `kernels`, which assembles a configuration's kernel): transform-dialect
  schedules of the linalg payload, for MLIR targets, from the target's capabilities (vector
  width, threads, OpenMP).
- `triton_kernels` (with a module per family, `triton_pointwise`, `triton_rows`,
  `triton_matmul`, on `triton_family` and the IR half `triton_lowering`): Triton kernels
  translated from the payload, for Triton targets, under the rules the target supplies
  (`kope.targets.triton_rules.TritonRules`).
"""
