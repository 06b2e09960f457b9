"""Options: every unknown name or bad value is an error that names it and the valid choices."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
import torch

from kope.core.errors import OptionError
from kope.core.options import Options


def test_defaults() -> None:
    opts = Options.parse(None)
    assert opts.target == "cpu" and opts.kernels == "auto" and opts.store is None


def test_unknown_option_names_it_and_the_valid_ones() -> None:
    with pytest.raises(OptionError) as err:
        Options.parse({"kernel": "auto"})
    message = str(err.value)
    assert "'kernel' (did you mean 'kernels'?)" in message
    for name in ("kernels", "store", "target"):
        assert name in message
    with pytest.raises(OptionError, match=r"'xyzzy'; valid options"):
        Options.parse({"xyzzy": 1})  # nothing close: no guess


@pytest.mark.parametrize(
    "given, fragment",
    [
        ({"kernels": "fastest"}, "kernels='fastest'"),
        ({"target": "tpu"}, "target='tpu'"),
        ({"workers": 0}, "workers=0"),
        ({"timeout_s": -1}, "timeout_s=-1"),
        ({"store": 3}, "store=3"),
    ],
)
def test_bad_values_are_named(given: dict, fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment.replace("(", r"\(")):
        Options.parse(given)


def test_error_survives_dynamo_wrapping() -> None:
    model = torch.nn.Linear(4, 4).eval()
    compiled = torch.compile(model, backend="kope", options={"kernels": "nope"})
    with torch.no_grad(), pytest.raises(Exception) as err:
        compiled(torch.randn(2, 4))
    message = str(err.value)
    assert "kernels='nope'" in message and "auto, reference, eager" in message


def test_store_accepts_a_path(tmp_path) -> None:
    assert Options.parse({"store": tmp_path}).store_path == tmp_path


def test_check_options_fails_fast_with_the_backends_error() -> None:
    import kope

    assert kope.check_options({"budget": 3}).budget == 3
    with pytest.raises(OptionError) as err:
        kope.check_options({"fusion": False})
    assert "'fusion'" in str(err.value) and "fuse" in str(err.value)
    with pytest.raises(OptionError, match="kernels='nope'"):
        kope.check_options({"kernels": "nope"})
    assert kope.check_options({"prior": "flat"}).prior == "flat"
    with pytest.raises(OptionError, match="prior='uniform' is not valid"):
        kope.check_options({"prior": "uniform"})
    with pytest.raises(OptionError, match="the llm agent has no hand-written prior"):
        kope.check_options({"agent": "llm", "prior": "flat"})


README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_option_table() -> dict[str, str]:
    """{option: values cell} of the README's option table."""
    lines = README.read_text().splitlines()
    start = lines.index("| option | values | meaning |")
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, values = (cell.strip() for cell in line.strip("|").split("|")[:2])
        rows[name.strip("`")] = values
    return rows


def _readme_default(values: str) -> str:
    """The default a values cell states: "`auto` (default), ..." or "... (default 16)"."""
    match = re.search(r"`([^`]+)` \(default\)", values) or re.search(r"\(default ([^),]+)", values)
    assert match, f"no default stated in {values!r}"
    return match.group(1).strip("`")


def test_readme_option_table_lists_exactly_the_options_with_their_defaults() -> None:
    table = _readme_option_table()
    assert sorted(table) == Options.names()
    for field in dataclasses.fields(Options):
        stated = _readme_default(table[field.name])
        default = getattr(Options(), field.name)
        if default is None:  # the store: $KOPE_HOME, else ~/.cache/kope
            assert stated == "$KOPE_HOME", field.name
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            assert float(stated) == default, field.name
        else:
            assert stated == str(default), field.name


def _cli_actions(
    parser: argparse.ArgumentParser | None = None, prefix: str = ""
) -> list[tuple[str, argparse.Action]]:
    """(command, action) of every argument of every `kope` subcommand, nested ones too."""
    from kope.tools.cli import build_parser

    found = []
    for action in (parser or build_parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                found += _cli_actions(sub, f"{prefix} {command}".strip())
        elif prefix:
            found.append((prefix, action))
    return found


def test_every_cli_default_is_the_options_default() -> None:
    checked = 0
    for command, action in _cli_actions():
        # `memory context --budget` is a token budget, not an option; the rest are options.
        if action.dest not in Options.names() or command.startswith("memory"):
            continue
        default = Options.default(action.dest)
        if action.required:  # `kope export --target cuda|ascend`: no default to drift
            assert action.default is None, (command, action.dest)
            continue
        if command == "bench" and action.dest == "budget":
            assert action.default is None  # resolved per mode; the suite's is Options().budget
            assert f"(default: {default};" in action.help
            continue
        assert action.default == default, (command, action.dest)
        if action.help and "(default: " in action.help and default is not None:
            stated = action.help.split("(default: ", 1)[1].split(")")[0]
            assert stated == f"{default:g}" if isinstance(default, float) else str(default)
        checked += 1
    assert checked >= 10  # compile, precompile and bench all take option-backed flags


def test_every_pass_option_named_like_an_option_defaults_to_the_option() -> None:
    """The passes' `target` (and `kope-optimize`'s agent and budget) default to what
    `torch.compile` and the CLI default to: one default, read everywhere."""
    from kope.passes.apply_kernels import ApplyKernels
    from kope.passes.outline import OutlineOperators
    from kope.tools.optimize_pass import OptimizeOperators

    checked = 0
    for cls in (ApplyKernels, OutlineOperators, OptimizeOperators):
        for f in dataclasses.fields(cls):
            if f.name in Options.names() and f.name != "store":
                assert f.default == Options.default(f.name), (cls.name, f.name)
                checked += 1
    assert checked >= 5


def test_every_cli_argument_has_help() -> None:
    for command, action in _cli_actions():
        if not isinstance(action, argparse._HelpAction):
            assert action.help, f"kope {command} {action.option_strings or action.dest}"
