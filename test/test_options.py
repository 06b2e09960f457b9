"""Options: every unknown name or bad value is an error that names it and the valid choices."""

from __future__ import annotations

import pytest
import torch

from kope.errors import OptionError
from kope.options import Options


def test_defaults() -> None:
    opts = Options.parse(None)
    assert opts.target == "cpu" and opts.kernels == "auto" and opts.store is None


def test_unknown_option_names_it_and_the_valid_ones() -> None:
    with pytest.raises(OptionError) as err:
        Options.parse({"kernel": "auto"})
    message = str(err.value)
    assert "'kernel'" in message
    for name in ("kernels", "store", "target"):
        assert name in message


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
