"""Loading a model named on the command line.

Three forms are accepted:
- `path/to/file.py`: defines `Model`, `get_inputs()` and `get_init_inputs()` (the convention of
  public kernel benchmark suites; `get_init_inputs` may be left out when `Model()` takes no
  arguments); the model is `Model(*get_init_inputs())`.
- `package.module:factory`: `factory()` returns `(model, example_inputs)`; the module is
  looked up from the current directory too, as `python -m` does.
- a zoo name (`kope.tools.zoo.ZOO`): `mlp`, `cnn`, `transformer_block`, `encoder_layer`,
  `odd_shapes`.

A file's or a factory's model is run once, eagerly, on its example inputs: a model that fails
there is reported in one line, before any compiler's traceback could bury it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from kope.core.errors import ModelLoadError
from kope.tools.zoo import ZOO


def load_model(spec: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The model and example inputs named by `spec`; ModelLoadError says what went wrong."""
    if spec in ZOO:
        return ZOO[spec]()
    if spec.endswith(".py") or Path(spec).is_file():
        return _from_file(Path(spec))
    if ":" in spec:
        return _from_factory(spec)
    raise ModelLoadError(
        f"cannot tell what model {spec!r} is: give a file.py defining Model, get_inputs() and "
        f"(if Model takes arguments) get_init_inputs(), a module:factory, or one of the "
        f"examples: {', '.join(ZOO)}"
    )


def _from_file(path: Path, seed: int | None = None) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The Model and inputs a file defines; with `seed`, torch is seeded with it before the
    model is built and again before its inputs are made (the operator suite's files)."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    name = f"kope_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise ModelLoadError(f"{path}: failed to import: {_where(err)}") from err
    missing = [n for n in ("Model", "get_inputs") if not hasattr(module, n)]
    if missing:
        raise ModelLoadError(
            f"{path}: does not define {', '.join(missing)} "
            "(expected Model, get_inputs() and, if Model takes arguments, get_init_inputs())"
        )
    init = getattr(module, "get_init_inputs", None)
    try:
        if seed is not None:
            torch.manual_seed(seed)
        model = module.Model(*_arguments(path, "get_init_inputs", init() if init else []))
    except ModelLoadError:
        raise
    except Exception as err:
        hint = (
            "; Model takes arguments? define get_init_inputs() returning them as a list"
            if init is None and isinstance(err, TypeError)
            else ""
        )
        raise ModelLoadError(f"{path}: building the model failed: {_where(err)}{hint}") from err
    try:
        if seed is not None:
            torch.manual_seed(seed)
        inputs = _arguments(path, "get_inputs", module.get_inputs())
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"{path}: get_inputs() failed: {_where(err)}") from err
    return _checked(str(path), model, inputs)


def _arguments(path: Path, function: str, value: Any) -> tuple[Any, ...]:
    """The list or tuple `function` returned, as a tuple; anything else is refused (a tensor
    would be split along its first dimension into as many arguments)."""
    if not isinstance(value, (list, tuple)):
        raise ModelLoadError(
            f"{path}: {function}() must return a list of the arguments, not a "
            f"{type(value).__name__}: return [x] for one argument"
        )
    return tuple(value)


def _from_factory(spec: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # a console script's path lacks it
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ModelLoadError(f"{spec}: cannot import {module_name}: {_where(err)}") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelLoadError(f"{spec}: {module_name} has no callable {attr!r}")
    try:
        result = factory()
        model, inputs = result
    except Exception as err:
        raise ModelLoadError(
            f"{spec}: the factory must return (model, example_inputs); "
            f"calling it failed: {_where(err)}"
        ) from err
    return _checked(spec, model, tuple(inputs))


def _checked(
    name: str, model: Any, inputs: tuple[Any, ...]
) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"{name}: the model is a {type(model).__name__}, not a torch.nn.Module"
        )
    model.eval()
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as err:
        raise ModelLoadError(
            f"{name}: the model fails in eager PyTorch on its example inputs, before KOPE "
            f"compiles anything: {_where(err)}"
        ) from err
    return model, inputs


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    location = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{location}"
