"""`kope-opt`: run KOPE and upstream MLIR passes on `.mlir` files, with mlir-opt's conventions.

    kope-opt [options] [input.mlir | -] [-o output.mlir]

Passes come either from `--pass-pipeline='builtin.module(...)'` or from one flag per pass in
order (`--kope-outline-operators --canonicalize`); a pass with options takes them as
`--kope-apply-kernels="store=/s target=cpu"`. Like LLVM's tools, a long option may start with
one dash or two. Diagnostics print as `file:line:col: error|warning|remark|note: ...`, both
MLIR's and the warnings and remarks of KOPE passes (`kope.passes.base.emit_diagnostic`), and
`--verify-diagnostics` checks all of them against `expected-*` comments, as mlir-opt does.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from torch_mlir import ir

from kope.passes.base import PipelineElement, PipelinePass, diagnostic_handler
from kope.passes.pipeline import PipelineError, build_pass_manager, parse_pipeline, pipeline_text

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.MULTILINE)
# `{{` to the last `}}` of the line: an -re message holds its own `{{regex}}` parts.
_EXPECTED = re.compile(
    r"//\s*expected-(error|warning|note|remark)(-re)?\s*(@[+-]\d+|@above|@below)?\s*\{\{(.*)\}\}"
)
_REGEX_PART = re.compile(r"\{\{(.*?)\}\}")
_LOCATION = re.compile(r'"([^"]*)":(\d+):(\d+)')
_DRIVER_FLAGS = {
    "--split-input-file": "split",
    "--verify-diagnostics": "verify",
    "--mlir-print-ir-after-all": "print_after",
    "--mlir-print-ir-before-all": "print_before",
    "--allow-unregistered-dialect": "unregistered",
    "--dump-pass-pipeline": "dump_pipeline",
}
_SEVERITY = {
    ir.DiagnosticSeverity.ERROR: "error",
    ir.DiagnosticSeverity.WARNING: "warning",
    ir.DiagnosticSeverity.REMARK: "remark",
    ir.DiagnosticSeverity.NOTE: "note",
}

USAGE = """usage: kope-opt [options] [input.mlir | -]

Runs KOPE's MLIR passes (and upstream ones) on MLIR files, like mlir-opt.

options (a long option may start with - or --):
  -o FILE                       write the output here (default: stdout)
  --pass-pipeline=PIPELINE      a textual pipeline, e.g.
                                'builtin.module(kope-outline-operators,kope-apply-kernels{target=cpu},cse)'
  --PASS[=OPTIONS]              add one pass, in order: a KOPE pass below or any upstream MLIR
                                pass (--canonicalize); options as --PASS="key=value key=value"
  --split-input-file            treat '// -----' as separate inputs
  --verify-diagnostics          check diagnostics against expected-error/warning/remark/note[-re]
                                comments
  --mlir-print-ir-after-all     print the IR after every pass (to stderr)
  --mlir-print-ir-before-all    print the IR before every pass (to stderr)
  --allow-unregistered-dialect  accept operations of unknown dialects
  --dump-pass-pipeline          print the pipeline, KOPE pipelines expanded, to stderr
  -h, --help                    show this help

KOPE passes (options with their defaults):
"""


class UsageError(Exception):
    """The command line itself is wrong (exit status 2)."""


@dataclass
class Invocation:
    """One kope-opt command line, parsed."""

    input: str = "-"
    output: str | None = None
    pipeline: list[PipelineElement] | None = None
    split: bool = False
    verify: bool = False
    print_after: bool = False
    print_before: bool = False
    unregistered: bool = False
    dump_pipeline: bool = False


def parse_args(argv: list[str]) -> Invocation:
    """Options, input and pipeline of a kope-opt command line (`UsageError` if malformed)."""
    inv = Invocation()
    flags: list[str] = []
    pipeline_text: str | None = None
    inputs: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "-" or not arg.startswith("-"):
            inputs.append(arg)
            continue
        if not arg.startswith("--"):
            arg = "-" + arg  # LLVM's tools take -split-input-file as well as --split-input-file
        name, eq, value = arg.partition("=")
        if name in ("--o", "--pass-pipeline"):
            if not eq:
                if not args:
                    raise UsageError(f"{name[1:] if name == '--o' else name} needs a value")
                value = args.pop(0)
            if name == "--o":
                inv.output = value
            else:
                pipeline_text = value
        elif arg in _DRIVER_FLAGS:
            setattr(inv, _DRIVER_FLAGS[arg], True)
        else:
            flags.append(f"{name[2:]}{{{value}}}" if eq and value else name[2:])
    if len(inputs) > 1:
        raise UsageError(f"one input file at a time, got {len(inputs)}: {' '.join(inputs)}")
    if inputs:
        inv.input = inputs[0]
    if pipeline_text is not None and flags:
        raise UsageError("give passes either with --pass-pipeline or as flags, not both")
    text = pipeline_text if pipeline_text is not None else ",".join(flags)
    inv.pipeline = parse_pipeline(text) if text.strip() else []
    return inv


@dataclass
class Diagnostic:
    severity: str
    line: int
    col: int
    message: str

    @classmethod
    def at(cls, severity: str, location: ir.Location, message: str) -> Diagnostic:
        match = _LOCATION.search(str(location))
        line, col = (int(match.group(2)), int(match.group(3))) if match else (0, 0)
        return cls(severity, line, col, message)

    def render(self, name: str, offset: int) -> str:
        """`file:line:col: severity: message`, the line counted in the whole input file."""
        where = f"{name}:{self.line + offset}:{self.col}" if self.line else name
        return f"{where}: {self.severity}: {self.message}"


def _chunks(text: str, split: bool) -> list[tuple[int, str]]:
    """(first line number - 1, text) of each input chunk."""
    if not split:
        return [(0, text)]
    chunks, offset, last = [], 0, 0
    for match in SPLIT_MARKER.finditer(text):
        chunks.append((offset, text[last : match.start()]))
        offset += text[last : match.end()].count("\n")
        last = match.end()
    chunks.append((offset, text[last:]))
    return chunks


def _collect(err: ir.MLIRError) -> list[Diagnostic]:
    found = []
    for diag in err.error_diagnostics:
        found.append(Diagnostic.at("error", diag.location, diag.message))
        found += [Diagnostic.at("note", n.location, n.message) for n in diag.notes]
    if not found:
        found.append(Diagnostic("error", 0, 0, err.message))
    return found


@dataclass
class Expected:
    """An `expected-<severity>[-re] [@where] {{message}}` comment: a substring, or with -re a
    text whose `{{...}}` parts are regular expressions (as in mlir-opt)."""

    severity: str
    line: int
    message: str
    pattern: re.Pattern[str]


def _expected(text: str) -> list[Expected]:
    wanted = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for match in _EXPECTED.finditer(line):
            severity, is_re, where, message = match.groups()
            target = lineno
            if where in ("@above",):
                target = lineno - 1
            elif where in ("@below",):
                target = lineno + 1
            elif where:
                target = lineno + int(where[1:])
            if is_re:
                parts = _REGEX_PART.split(message)  # literal, regex, literal, regex, ...
                pattern = "".join(p if i % 2 else re.escape(p) for i, p in enumerate(parts))
            else:
                pattern = re.escape(message)
            wanted.append(Expected(severity, target, message, re.compile(pattern)))
    return wanted


def _verify(
    name: str, offset: int, got: list[Diagnostic], wanted: list[Expected], err: TextIO
) -> bool:
    """Match produced diagnostics to expected ones, reporting misses and surprises on `err`."""
    ok = True
    unmatched = list(got)
    for want in wanted:
        hit = next(
            (
                g
                for g in unmatched
                if g.severity == want.severity
                and g.line == want.line
                and want.pattern.search(g.message)
            ),
            None,
        )
        if hit is None:
            err.write(
                f"{name}:{want.line + offset}: error: expected {want.severity} "
                f'"{want.message}" was not produced\n'
            )
            ok = False
        else:
            unmatched.remove(hit)
    for g in unmatched:
        if g.severity != "note":  # as in mlir-opt, a note may go unmentioned
            where = f"{name}:{g.line + offset}:{g.col}"
            err.write(f"{where}: error: unexpected {g.severity}: {g.message}\n")
            ok = False
    return ok


def run(inv: Invocation, out: TextIO, err: TextIO) -> int:
    """Run the pipeline on each input chunk; the exit status (1 on any error)."""
    name = "<stdin>" if inv.input == "-" else inv.input
    try:
        text = sys.stdin.read() if inv.input == "-" else Path(inv.input).read_text()
    except OSError as e:
        err.write(f"kope-opt: cannot read {name}: {e.strerror}\n")
        return 1
    except UnicodeDecodeError as e:
        err.write(f"kope-opt: {name} is not MLIR text (not UTF-8 at byte {e.start})\n")
        return 1
    if inv.dump_pipeline:
        err.write(pipeline_text(_expanded(inv.pipeline or [])) + "\n")
    results: list[str] = []
    status = 0
    for offset, chunk in _chunks(text, inv.split):
        diagnostics, produced = _run_chunk(inv, chunk)
        if inv.verify:
            if not _verify(name, offset, diagnostics, _expected(chunk), err):
                status = 1
        else:
            for diagnostic in diagnostics:
                err.write(diagnostic.render(name, offset) + "\n")
            if produced is None:
                status = 1
        if produced is not None:
            results.append(produced)
    output = "// -----\n".join(results)
    if inv.output and inv.output != "-":
        try:
            Path(inv.output).write_text(output)
        except OSError as e:
            err.write(f"kope-opt: cannot write {inv.output}: {e.strerror}\n")
            return 1
    else:
        out.write(output)
    return status


def _run_chunk(inv: Invocation, chunk: str) -> tuple[list[Diagnostic], str | None]:
    """Parse and run one input; its diagnostics in the order they came, and the output IR."""
    context = ir.Context()
    context.enable_multithreading(False)
    context.allow_unregistered_dialects = inv.unregistered
    diagnostics: list[Diagnostic] = []

    def on_mlir(diag: ir.Diagnostic) -> bool:
        # Errors stay with the MLIRError that parsing or the pass manager raises.
        if diag.severity == ir.DiagnosticSeverity.ERROR:
            return False
        diagnostics.append(Diagnostic.at(_SEVERITY[diag.severity], diag.location, diag.message))
        diagnostics.extend(Diagnostic.at("note", n.location, n.message) for n in diag.notes)
        return True

    def on_kope(severity: str, location: ir.Location, message: str) -> None:
        diagnostics.append(Diagnostic.at(severity, location, message))

    context.attach_diagnostic_handler(on_mlir)
    try:
        with diagnostic_handler(on_kope):
            module = ir.Module.parse(chunk, context)
            pm = build_pass_manager(inv.pipeline or [], context)
            if inv.print_after or inv.print_before:
                pm.enable_ir_printing(
                    print_before_all=inv.print_before, print_after_all=inv.print_after
                )
            with context:
                pm.run(module.operation)
    except ir.MLIRError as e:
        return diagnostics + _collect(e), None
    return diagnostics, str(module)


def _expanded(elements: list[PipelineElement]) -> list[PipelineElement]:
    """The pipeline with KOPE's named pipelines (kope-lower-cpu) replaced by their passes."""
    flat: list[PipelineElement] = []
    for element in elements:
        flat += _expanded(element.expand()) if isinstance(element, PipelinePass) else [element]
    return flat


def usage() -> str:
    """The --help text: driver options, then every KOPE pass with its options and defaults."""
    from kope.passes import pass_class, pass_names

    lines = [USAGE]
    for pass_name in pass_names():
        cls = pass_class(pass_name)
        lines.append(f"  --{pass_name:<30} {cls.summary}")
        for option, text in cls.option_help():
            lines.append(f"      {option:<28} {text}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The `kope-opt` entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "-help") for a in argv):
        sys.stdout.write(usage())
        return 0
    try:
        inv = parse_args(argv)
    except (UsageError, PipelineError) as e:
        sys.stderr.write(f"kope-opt: {e}\n")
        return 2
    try:
        return run(inv, sys.stdout, sys.stderr)
    except PipelineError as e:
        sys.stderr.write(f"kope-opt: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
