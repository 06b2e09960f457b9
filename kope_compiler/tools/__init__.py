"""The tools: the `kope` command line and what it drives.

`cli` (the `kope` script), `precompile` (offline, `cluster` for Ray), `optimize_pass` (the
same loop inside a `kope-opt` pipeline), `bench` over the operator `suite` with its `plots`,
the model loaders (`models`, `zoo`), kernel packs for a device's machine (`kernel_pack`) and
stored tasks made runnable again (`eager_json`). The tools may import every room.
"""
