"""Lean dispatch (`kope.frontend.dispatch`): the rewritten aten graph computes what it did, with the
same output layouts, in fewer Python calls."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_export_joint_simple
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from kope.frontend.dispatch import (
    copy_only_where_needed,
    fold_view_chains,
    has_symbols,
    lean,
    torch_binding,
)


def _attention(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v = (x @ w.t()).split(16, dim=-1)
    q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in (q, k, v))
    y = torch.softmax(q @ k.transpose(-2, -1) / 2.0, -1) @ v
    return (y.transpose(1, 2).reshape(2, 5, 16), k)  # a view output, too


def _aten(fn, *inputs: torch.Tensor) -> fx.GraphModule:
    gm = aot_export_joint_simple(fn, inputs, trace_joint=False)
    assert isinstance(gm, fx.GraphModule)
    return gm


def test_lean_graph_matches_with_the_same_layouts_and_fewer_nodes() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 16), torch.randn(48, 16)
    gm = _aten(_attention, x, w)
    before = len(gm.graph.nodes)
    leaned = copy.deepcopy(gm)
    lean(leaned)
    leaned.recompile()
    assert len(leaned.graph.nodes) < before
    targets = [n.target for n in leaned.graph.nodes if n.op == "call_function"]
    assert torch._C._VariableFunctions.bmm in targets  # a checked binding
    assert not any(isinstance(t, torch._ops.OpOverload) for t in targets)
    for got, want in zip(leaned(x, w), gm(x, w), strict=True):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    k = leaned(x, w)[1]
    assert k.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_shapes_are_passed_as_separate_ints() -> None:
    """`x.reshape(2, 80)`, not `x.reshape([2, 80])`: the same call, parsed faster."""

    def fn(x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return ((x.sin().view(2, 80) + b.expand(2, 80)).cos(),)

    x, b = torch.randn(2, 5, 16), torch.randn(1, 80)
    gm = _aten(fn, x, b)
    want = gm(x, b)
    lean(gm)
    gm.recompile()
    shaped = [n for n in gm.graph.nodes if n.target in (torch.Tensor.reshape, torch.Tensor.expand)]
    assert len(shaped) == 2 and all(n.args[1:] == (2, 80) for n in shaped), shaped
    torch.testing.assert_close(gm(x, b), want)


def test_a_root_with_other_strides_replays_its_chain() -> None:
    """The fold rests on the root's traced layout; a root arriving otherwise (a kernel's
    contiguous output where eager's was strided) gets the chain itself, not a wrong view."""
    graph = fx.Graph()
    base = graph.placeholder("base")
    t = graph.call_function(torch.ops.aten.t.default, (base,))
    v = graph.call_function(torch.ops.aten.unsqueeze.default, (t, 0))
    s = graph.call_function(torch.ops.aten.sin.default, (v,))
    graph.output(s)
    traced_root = torch.randn(3, 4).t()  # the layout at tracing: strided
    base.meta["val"] = traced_root
    t.meta["val"] = traced_root.t()
    v.meta["val"] = traced_root.t().unsqueeze(0)
    assert fold_view_chains(graph) == 1
    gm = fx.GraphModule(torch.nn.Module(), graph)
    strided = torch.randn(3, 4).t()
    torch.testing.assert_close(gm(strided), strided.t().unsqueeze(0).sin())
    other = torch.randn(4, 3)  # contiguous: other strides than traced
    torch.testing.assert_close(gm(other), other.t().unsqueeze(0).sin())


def test_a_binding_that_dispatches_another_overload_is_not_taken() -> None:
    """`torch.add(x, 2.0)` dispatches `add.Tensor` (it wraps the scalar): an `add.Scalar`
    node keeps its own overload's raw entry; an `add.Tensor` node takes the binding."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    with FakeTensorMode():
        x.meta["val"] = torch.empty(3)
    scalar = graph.call_function(torch.ops.aten.add.Scalar, (x, 2.0))
    tensor = graph.call_function(torch.ops.aten.add.Tensor, (x, 2.0))
    assert torch_binding(scalar) is None
    assert torch_binding(tensor) is torch._C._VariableFunctions.add


def test_a_binding_that_reads_the_arguments_otherwise_is_not_taken() -> None:
    """torch's binary_cross_entropy_with_logits binding takes the graph's (x, y, None,
    pos_weight) with no reduction: a 6x5 tensor where ATen's overload means the mean."""
    graph = fx.Graph()
    x, y, pw = (graph.placeholder(n) for n in ("x", "y", "pw"))
    with FakeTensorMode():
        x.meta["val"], y.meta["val"], pw.meta["val"] = (
            torch.empty(6, 5),
            torch.empty(6, 5),
            torch.empty(5),
        )
    op = torch.ops.aten.binary_cross_entropy_with_logits.default
    assert torch_binding(graph.call_function(op, (x, y, None, pw))) is None
    full = graph.call_function(op, (x, y, None, pw, 1))
    binding = torch_binding(full)
    if binding is not None:  # taken only where it reads all five arguments as ATen does
        a, b, w = torch.randn(6, 5), torch.rand(6, 5), torch.rand(5)
        torch.testing.assert_close(binding(a, b, None, w, 1), op(a, b, None, w, 1))


def test_a_view_of_a_root_in_another_layout_is_a_reshape() -> None:
    """`view` was valid on the traced strides and is not on the root's: a kernel wrote
    contiguously what ATen wrote transposed (the ops after it follow its layout). The chain
    replays as reshapes, and so does a lone view: the same values, not an error."""
    graph = fx.Graph()
    base = graph.placeholder("base")
    t = graph.call_function(torch.ops.aten.transpose.int, (base, 1, 2))
    v = graph.call_function(torch.ops.aten.view.default, (t, [2, 3, 20]))
    s = graph.call_function(torch.ops.aten.sin.default, (v,))
    lone = graph.call_function(torch.ops.aten.view.default, (base, [2, 60]))
    c = graph.call_function(torch.ops.aten.cos.default, (lone,))
    graph.output((s, c))
    traced_root = torch.randn(2, 3, 4, 5).transpose(1, 2)  # (2, 4, 3, 5), strided
    base.meta["val"] = traced_root
    t.meta["val"] = traced_root.transpose(1, 2)
    v.meta["val"] = t.meta["val"].view(2, 3, 20)
    lone.meta["val"] = traced_root.reshape(2, 60)
    lean_graph = fx.GraphModule(torch.nn.Module(), graph)
    lean(lean_graph)
    lean_graph.recompile()
    contiguous = torch.randn(2, 4, 3, 5)  # the other layout
    got_s, got_c = lean_graph(contiguous)
    torch.testing.assert_close(got_s, contiguous.transpose(1, 2).reshape(2, 3, 20).sin())
    torch.testing.assert_close(got_c, contiguous.reshape(2, 60).cos())
    strided = torch.randn(2, 3, 4, 5).transpose(1, 2)  # a lone view of it copies
    torch.testing.assert_close(lean_graph(strided)[1], strided.reshape(2, 60).cos())


class _Ops(TorchDispatchMode):
    """Records the ATen overloads a call dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[object] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_a_copy_that_nothing_else_reads_is_made_only_where_needed() -> None:
    """CPU flash attention lays its output out so that its transpose back is contiguous: the
    copy after it (as KOPE's attention rewrite leaves it) is elided. A copy of an input, or
    of a value returned besides, stays a copy."""
    aten = torch.ops.aten
    graph = fx.Graph()
    q, k, v = (graph.placeholder(name) for name in "qkv")
    attention = graph.call_function(aten.scaled_dot_product_attention.default, (q, k, v))
    back = graph.call_function(aten.transpose.int, (attention, 1, 2))
    contiguous = {"memory_format": torch.contiguous_format}
    copies = [
        graph.call_function(aten.clone.default, (back,), contiguous),
        graph.call_function(
            aten.clone.default, (graph.call_function(aten.transpose.int, (k, 1, 2)),), contiguous
        ),
    ]
    copies.append(graph.call_function(aten.clone.default, (copies[0],), contiguous))
    graph.output((copies[1], copies[2], copies[0]))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    torch.manual_seed(0)
    qkv = torch.randn(2, 5, 48).split(16, dim=-1)
    inputs = [t.view(2, 5, 2, 8).transpose(1, 2) for t in qkv]
    leaned = copy.deepcopy(gm)
    assert copy_only_where_needed(leaned.graph) == 1
    lean(leaned)
    leaned.recompile()
    with _Ops() as seen:
        got = leaned(*inputs)
    for a, b in zip(got, gm(*inputs), strict=True):
        torch.testing.assert_close(a, b)
        assert a.stride() == b.stride()
    assert seen.ops.count(aten.clone.default) == 2  # the attention's output was not copied
    assert got[1].data_ptr() != got[2].data_ptr()


def test_an_eval_dropouts_copy_of_a_fresh_value_is_not_made() -> None:
    """Eval-mode dropout traces as a copy that keeps the format; eager's returns its input.
    Of a fresh dense value nothing else reads, the copy is elided; of an input, or of a value
    also returned, it stays."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1)).eval()

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        returned = x * 3
        return model[1](torch.relu(x @ w)), model[1](x), model[1](returned) + 1, returned

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.no_grad():
        gm = _aten(fn, x, w)
    clones = sum(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)
    assert clones == 3, gm.code
    leaned = copy.deepcopy(gm)
    lean(leaned)
    leaned.recompile()
    with _Ops() as seen:
        got = leaned(x, w)
    for a, b in zip(got, gm(x, w), strict=True):
        torch.testing.assert_close(a, b)
        assert a.stride() == b.stride()
    assert seen.ops.count(torch.ops.aten.clone.default) == 2  # the input's, the returned's
    assert got[1].data_ptr() != x.data_ptr()


def _linears(x, wa, ba, wb, wc, bc) -> tuple[torch.Tensor, ...]:
    """Linears as models write them: on 3-D input with a bias, on 2-D input without one, and
    one whose product is also read flat (its reshape back is not its only reader)."""
    F = torch.nn.functional
    h = F.linear(x, wa, ba)  # (2, 5, 24)
    flat = F.linear(h.reshape(10, 24), wb)
    c = torch.addmm(bc, flat, wc.t())
    return h, flat, c.view(2, 5, 8), c.sum(0)


def test_linears_are_one_call_each_and_compute_exactly_what_eager_does() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    weights = (torch.randn(24, 16), torch.randn(24), torch.randn(8, 24))
    weights += (torch.randn(8, 8), torch.randn(8))
    gm = _aten(_linears, x, *weights)
    leaned = copy.deepcopy(gm)
    lean(leaned)
    leaned.recompile()
    targets = [n.target for n in leaned.graph.nodes if n.op == "call_function"]
    assert targets.count(torch._C._nn.linear) == 3
    assert torch.t not in targets
    for got, want in zip(leaned(x, *weights), gm(x, *weights), strict=True):
        assert torch.equal(got, want) and got.stride() == want.stride()
    # An input that arrives strided is multiplied as eager's F.linear multiplies it.
    strided = torch.randn(5, 2, 16).transpose(0, 1)
    for got, want in zip(leaned(strided, *weights), _linears(strided, *weights), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_symbols_are_looked_for_in_sizes_and_where_there_are_strides() -> None:
    """A tensor of any layout is asked only what it has: a CSR tensor has no strides (asking
    raised), a strided one's strides and offset may be symbolic too."""
    dense = torch.randn(3, 3)
    assert not has_symbols([dense, dense.to_sparse(), dense.to_sparse_csr(), 2, (1.0,)])
    gm = make_fx(lambda x: x.t()[1:], tracing_mode="symbolic")(torch.randn(4, 3))
    values = [n.meta["val"] for n in gm.graph.nodes if n.op != "output"]
    x, view = values[0], values[-1]  # the input, and its view with a symbolic offset
    assert isinstance(x.shape[0], torch.SymInt)
    assert has_symbols(x) and has_symbols([dense, (x,)]) and has_symbols(view)
