"""KOPE's shared vocabulary: the words every room may import and none defines again.

- `specs`: tensor specs, the eager call (`OpCall`, `Program`), `TaskSpec`, the dtype table
- `kernels`: `Kernel`, its text and form (`FORM_MLIR`, `FORM_TRITON`)
- `evidence`: verdicts, sources, `Timing` and its quality, `Evaluation`
- `events`: what the loop announces (`TaskSeen`, `AttemptEvaluated`, `ChoiceMade`) to listeners
- `registry`: agents, passes, targets and target keys by name (entry points)
- `home`: where KOPE keeps its files

It imports no other room; every other room may import it. Only `specs` imports torch, so
memory and `kope-opt` stay light.
"""
