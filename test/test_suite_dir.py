"""The operator suite kept as files (`benchmarks/suite/`) and `kope.tools.suite.load_suite`.

Every file builds a model that runs eagerly on seeded inputs, the same on every load; the
families of issue 13 are all there; representative files trace to Tasks as `kope precompile`
traces them; a broken suite directory or file is a KopeError that names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kope.core.errors import KopeError
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace_tasks
from kope.tools.suite import Example, load_suite

SUITE = Path(__file__).resolve().parent.parent / "benchmarks" / "suite"

# Family token -> the operator names (file stem minus prefix, family and shape) it must hold.
COVERAGE = {
    "act": {
        "relu",
        "gelu_erf",
        "gelu_tanh",
        "silu",
        "sigmoid",
        "tanh",
        "hardswish",
        "leaky_relu",
        "elu",
        "softplus",
    },
    "reduce": {"sum", "mean", "amax", "argmax", "logsumexp", "norm_last", "norm_mid"},
    "softmax": {"softmax", "log_softmax"},
    "norm": {"layer_norm", "batch_norm", "group_norm", "rms_norm"},
    "matmul": {"mm", "bmm", "linear", "addmm"},
    "conv": {
        "conv1d",
        "conv2d_same",
        "conv2d_pointwise",
        "conv2d_strided",
        "conv2d_depthwise",
        "conv_transpose2d",
    },
    "pool": {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"},
    "index": {"gather", "index_select", "embedding"},
    "loss": {"cross_entropy", "mse", "hinge"},
    "fused": {"linear_gelu", "conv_bn_relu", "attention_softmax", "elementwise_chain"},
    "attention": {"sdpa_causal", "sdpa_padding_mask"},
}

# One elementwise, one reduction, one matmul, one conv and one fused chain.
REPRESENTATIVES = [
    "000_act_relu_128x256",
    "100_reduce_sum_128x256",
    "401_matmul_mm_129x65x97",
    "510_conv_conv2d_same_2x8x37x37",
    "930_fused_elementwise_chain_129x513",
    "951_attention_sdpa_padding_mask_2x4x77x64",
]

SUITE_FILE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""


def parts(stem: str) -> tuple[str, str, str]:
    """(prefix, family, operator) of a suite file's stem `NNN_<family>_<op>_<shape>`."""
    prefix, family, rest = stem.split("_", 2)
    op, _, _shape = rest.rpartition("_")
    return prefix, family, op


@pytest.fixture(scope="module")
def examples() -> dict[str, Example]:
    return {stem: factory() for stem, factory in load_suite(SUITE).items()}


def test_the_suite_is_large_and_in_sorted_order() -> None:
    stems = list(load_suite(SUITE))
    assert len(stems) >= 60
    assert stems == sorted(stems)
    prefixes = [parts(stem)[0] for stem in stems]
    assert all(len(p) == 3 and p.isdigit() for p in prefixes)
    assert len(set(prefixes)) == len(prefixes)


def test_every_family_of_the_issue_is_covered() -> None:
    found: dict[str, set[str]] = {}
    for stem in load_suite(SUITE):
        _, family, op = parts(stem)
        found.setdefault(family, set()).add(op)
    for family, ops in COVERAGE.items():
        assert ops <= found.get(family, set()), (family, ops - found.get(family, set()))


def test_families_are_contiguous_in_sorted_order() -> None:
    families = [parts(stem)[1] for stem in load_suite(SUITE)]
    runs = [f for i, f in enumerate(families) if i == 0 or families[i - 1] != f]
    assert len(runs) == len(set(runs)), runs


def test_every_model_runs_eagerly_with_finite_outputs(examples: dict[str, Example]) -> None:
    for stem, (model, inputs) in examples.items():
        assert not model.training, stem
        assert inputs and all(isinstance(t, torch.Tensor) for t in inputs), stem
        assert not any(t.requires_grad for t in inputs), stem
        with torch.no_grad():
            out = model(*inputs)
        assert isinstance(out, torch.Tensor), stem
        assert torch.isfinite(out).all(), stem


def test_two_loads_give_the_same_inputs_and_outputs(examples: dict[str, Example]) -> None:
    torch.manual_seed(1234)  # the loader seeds, whatever the global state was
    for stem, factory in load_suite(SUITE).items():
        model, inputs = factory()
        first_model, first_inputs = examples[stem]
        assert len(inputs) == len(first_inputs), stem
        for a, b in zip(inputs, first_inputs, strict=True):
            assert torch.equal(a, b), stem
        with torch.no_grad():
            assert torch.equal(model(*inputs), first_model(*first_inputs)), stem


@pytest.mark.parametrize("stem", REPRESENTATIVES)
def test_representative_files_trace_to_tasks(stem: str, examples: dict[str, Example]) -> None:
    model, inputs = examples[stem]
    assert len(trace_tasks(model, inputs, CpuTarget())) >= 1


def test_files_starting_with_an_underscore_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "010_act_b_4.py").write_text(SUITE_FILE)
    (tmp_path / "000_act_a_4.py").write_text(SUITE_FILE)
    (tmp_path / "_helpers.py").write_text("raise RuntimeError('never imported')\n")
    (tmp_path / "notes.txt").write_text("not a suite file\n")
    suite = load_suite(str(tmp_path))
    assert list(suite) == ["000_act_a_4", "010_act_b_4"]
    model, (x,) = suite["000_act_a_4"]()
    assert torch.equal(model(x), x + 1)


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KopeError, match="nowhere.*does not exist"):
        load_suite(tmp_path / "nowhere")


def test_a_directory_without_suite_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "_helpers.py").write_text(SUITE_FILE)
    with pytest.raises(KopeError, match="no suite files"):
        load_suite(tmp_path)


def test_a_file_that_fails_to_import_is_named(tmp_path: Path) -> None:
    (tmp_path / "000_act_broken_4.py").write_text("import torch\nraise ValueError('boom')\n")
    factory = load_suite(tmp_path)["000_act_broken_4"]
    with pytest.raises(
        KopeError, match=r"000_act_broken_4\.py: failed to import: ValueError: boom"
    ):
        factory()


@pytest.mark.parametrize("name", ["Model", "get_inputs"])
def test_a_file_missing_a_definition_is_named(tmp_path: Path, name: str) -> None:
    """(`get_init_inputs` may be left out: Model then takes no arguments.)"""
    text = SUITE_FILE.replace(f"class {name}", "class Other").replace(f"def {name}", "def other")
    (tmp_path / "000_act_partial_4.py").write_text(text)
    factory = load_suite(tmp_path)["000_act_partial_4"]
    with pytest.raises(KopeError, match=rf"000_act_partial_4\.py: does not define {name}"):
        factory()


def test_a_model_that_fails_to_build_is_named(tmp_path: Path) -> None:
    text = SUITE_FILE.replace("return []", "return [1, 2, 3]")
    (tmp_path / "000_act_args_4.py").write_text(text)
    with pytest.raises(KopeError, match=r"000_act_args_4\.py: building the model"):
        load_suite(tmp_path)["000_act_args_4"]()
