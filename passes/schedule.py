"""`kope-apply-schedule`: apply a kernel's transform-dialect schedule to its payload, then drop it.

A scheduled kernel is one MLIR module: the payload (`func.func @main` on tensors) and a
`transform.named_sequence @__transform_main` beside it (module attribute
`transform.with_named_sequence`). The schedule is interpreted on the module — every op it
matches is in the payload — and then erased, so the rest of a pipeline sees the payload only.
A module without a schedule is left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects.transform import interpreter

from kope.passes.base import ModulePass, PassError

ENTRY_POINT = "__transform_main"
WITH_NAMED_SEQUENCE = "transform.with_named_sequence"
_MESSAGE_AT = re.compile(r"^(Diagnostic message )?at loc\(.*?\):\s*")


def find_schedule(module: ir.Operation) -> ir.Operation | None:
    """The module's `transform.named_sequence @__transform_main`, if it has one."""
    for view in module.regions[0].blocks[0].operations:
        op = view.operation
        if op.name != "transform.named_sequence":
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value == ENTRY_POINT:
            return op
    return None


def strip_transforms(module: ir.Operation) -> None:
    """Erase every transform op at the top of `module` and its named-sequence attribute."""
    for op in list(module.regions[0].blocks[0].operations):
        if op.operation.name.startswith("transform."):
            op.operation.erase()
    if WITH_NAMED_SEQUENCE in module.attributes:
        del module.attributes[WITH_NAMED_SEQUENCE]


@dataclass
class ApplySchedule(ModulePass):
    """Interpret `@__transform_main` on the module, then erase the transform ops."""

    name = "kope-apply-schedule"
    summary = "Apply the module's transform schedule (@__transform_main) to its payload and drop it"

    def run(self, module: ir.Operation) -> None:
        schedule = find_schedule(module)
        if schedule is None:
            return
        try:
            interpreter.apply_named_sequence(module, schedule, module)
        except ir.MLIRError as err:
            detail = "; ".join(d.message for d in err.error_diagnostics) or str(err)
            raise PassError(f"the schedule failed: {detail}", schedule.location) from None
        except ValueError as err:
            # The interpreter reports a failed transform as a ValueError whose text holds the
            # diagnostics, one per line after a headline.
            lines = str(err).splitlines()[1:] or [str(err)]
            detail = "; ".join(_MESSAGE_AT.sub("", line) for line in lines)
            raise PassError(f"the schedule failed: {detail}", schedule.location) from None
        strip_transforms(module)
