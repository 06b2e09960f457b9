"""KOPE's pass model: a pass is a class with a name and dataclass-field options.

The MLIR Python bindings have no pass registry and `PassManager.add(callable)` takes no options,
so each pass instance binds its options in a closure when it is added to a pass manager.
Pipeline-valued passes (`kope-lower-cpu`) expand into upstream pipeline strings and KOPE passes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from torch_mlir import ir
from torch_mlir.passmanager import PassManager


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

    # -- options ---------------------------------------------------------------------------
    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "ModulePass":
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


PipelineElement = Union[str, ModulePass]


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
    return str(value)
