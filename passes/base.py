"""KOPE's pass model: a pass is a class with a name and dataclass-field options.

The MLIR Python bindings have no pass registry and `PassManager.add(callable)` takes no options,
so each pass instance binds its options in a closure when it is added to a pass manager.
Pipeline-valued passes (`kope-lower-cpu`) expand into upstream pipeline strings and KOPE passes.
An option's help text is the field's `metadata["help"]`; `kope-opt --help` prints it.

The bindings can emit only error diagnostics (`Location.emit_error`). Warnings and remarks of
KOPE passes go through `emit_diagnostic` to the handler installed by `diagnostic_handler`
(kope-opt prints them as `file:line:col: warning: ...` and checks them under
`--verify-diagnostics`); with no handler installed they are logged under `kope.passes`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

log = logging.getLogger("kope.passes")

WARNING = "warning"
REMARK = "remark"

DiagnosticHandler = Callable[[str, ir.Location, str], None]
_HANDLERS: contextvars.ContextVar[tuple[DiagnosticHandler, ...]] = contextvars.ContextVar(
    "kope_diagnostic_handlers", default=()
)


def nested_ops(op: ir.Operation) -> list[ir.Operation]:
    """Every op nested in `op`, in post-order (`op` itself last): collected first, so that a
    pass may then rewrite or erase them without disturbing the walk."""
    found: list[ir.Operation] = []

    def collect(inner: ir.Operation) -> ir.WalkResult:
        found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(collect)
    return found


# The two reshapes of static tensors that passes look through or rewrite.
EXPAND_SHAPE = "tensor.expand_shape"
COLLAPSE_SHAPE = "tensor.collapse_shape"


def consecutive_runs(owners: Sequence[int]) -> list[list[int]]:
    """The positions of `owners` in runs of consecutive equal owners: the reassociation of a
    reshape whose fine dim i falls in coarse dim `owners[i]`."""
    runs: list[list[int]] = []
    for position, owner in enumerate(owners):
        if runs and owners[position - 1] == owner:
            runs[-1].append(position)
        else:
            runs.append([position])
    return runs


def reassociation_attr(runs: list[list[int]]) -> ir.ArrayAttr:
    """A reshape's `reassociation` attribute of these runs of dims."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get(
        [ir.ArrayAttr.get([ir.IntegerAttr.get(i64, k) for k in run]) for run in runs]
    )


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op whose result `value` is; None for a block argument."""
    if not isinstance(value, ir.OpResult):
        return None
    owner = value.owner
    return owner.operation if isinstance(owner, ir.OpView) else owner


def emit_diagnostic(severity: str, location: ir.Location, message: str) -> None:
    """Report a warning or remark at `location` to the innermost handler, else to the log."""
    handlers = _HANDLERS.get()
    if handlers:
        handlers[-1](severity, location, message)
    elif severity == WARNING:
        log.warning("%s: %s", location, message)
    else:
        log.info("%s: %s", location, message)


@contextlib.contextmanager
def diagnostic_handler(handler: DiagnosticHandler) -> Iterator[None]:
    """Route the warnings and remarks of KOPE passes run inside this block to `handler`."""
    token = _HANDLERS.set((*_HANDLERS.get(), handler))
    try:
        yield
    finally:
        _HANDLERS.reset(token)


class PassError(Exception):
    """Raised inside a pass to fail it; the message becomes an MLIR error diagnostic."""

    def __init__(self, message: str, location: ir.Location | None = None):
        super().__init__(message)
        self.location = location


@dataclass
class ModulePass:
    """A KOPE pass over a `builtin.module`. Subclasses set `name`, `summary` and fields."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def run(self, module: ir.Operation) -> None:
        raise NotImplementedError

    def warn(self, location: ir.Location, message: str) -> None:
        """A warning diagnostic naming this pass: something was skipped that a user may want."""
        emit_diagnostic(WARNING, location, f"{self.name}: {message}")

    def remark(self, location: ir.Location, message: str) -> None:
        """A remark diagnostic naming this pass: what it did, for those who ask."""
        emit_diagnostic(REMARK, location, f"{self.name}: {message}")

    # -- options ---------------------------------------------------------------------------
    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def option_help(cls) -> list[tuple[str, str]]:
        """(`name=DEFAULT`, help text) per option, for `kope-opt --help`."""
        rows = []
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else _format(f.default)
            rows.append((f"{f.name}={default}", str(f.metadata.get("help", ""))))
        return rows

    @classmethod
    def from_options(cls, options: dict[str, str]) -> ModulePass:
        """Build from textual options (`{store=/s target=cpu}`), checking names and types."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            known = ", ".join(fields) or "none"
            raise ValueError(
                f"pass '{cls.name}' has no option {', '.join(repr(u) for u in unknown)}; "
                f"its options are: {known}"
            )
        values: dict[str, Any] = {}
        for key, text in options.items():
            values[key] = _convert(cls.name, key, text, fields[key].type)
        return cls(**values)

    def options_text(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default and value is not None:
                parts.append(f"{f.name}={_format(value)}")
        return "{" + " ".join(parts) + "}" if parts else ""

    def __str__(self) -> str:
        return self.name + self.options_text()

    # -- running ---------------------------------------------------------------------------
    def add_to(self, pm: PassManager) -> None:
        """Add this pass, options bound, to a module-level pass manager."""

        def run(op: ir.Operation, pass_: Any) -> None:
            try:
                with op.context, op.location:
                    self.run(op)
            except PassError as err:
                loc = err.location or op.location
                loc.emit_error(f"{self.name}: {err}")
                pass_.signal_pass_failure()
            except Exception as err:  # a defect in the pass: report it as a pass failure
                op.location.emit_error(f"{self.name}: internal error: {type(err).__name__}: {err}")
                pass_.signal_pass_failure()

        pm.add(run, name=type(self).__name__, argument=self.name, description=self.summary)


PipelineElement = str | ModulePass


@dataclass
class PipelinePass(ModulePass):
    """A named pipeline: expands into upstream pipeline strings and KOPE passes."""

    def expand(self) -> list[PipelineElement]:
        raise NotImplementedError

    def add_to(self, pm: PassManager) -> None:
        for element in self.expand():
            if isinstance(element, str):
                pm.add(element)
            else:
                element.add_to(pm)


def check_target(pass_name: str, target: str) -> None:
    """Raise `ValueError` naming the known targets unless `target` is one of them."""
    from kope.vocabulary.registry import target_names

    if target not in target_names():
        raise ValueError(
            f"pass '{pass_name}' option target={target!r} is not a known target; "
            f"known targets: {', '.join(target_names())}"
        )


def _convert(pass_name: str, key: str, text: str, annotation: Any) -> Any:
    kind = str(annotation)
    try:
        if "bool" in kind:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if "int" in kind:
            return int(text)
        if "float" in kind:
            return float(text)
    except ValueError:
        raise ValueError(
            f"pass '{pass_name}' option {key}={text!r} is not a valid {kind}"
        ) from None
    return text


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    # Options are read back with shlex (see `pipeline.parse_options`): quote what it would split.
    return shlex.quote(text) if any(c in text for c in " \t\"'{}") else text
