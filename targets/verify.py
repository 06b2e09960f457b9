"""Verification of a kernel against an oracle: inputs, tolerances, poisoned and guarded outputs.

Every claim that a kernel is right rests on this module:
- fresh seeded inputs per trial: random values, edge values (zeros, negative zero, large,
  tiny), and non-finite values (NaN, ±Inf) where the oracle defines a result for them;
- a tolerance per dtype, written down below, scaled to the magnitude of the expected output
  and grown with the length of the reductions the kernel computes;
- outputs poisoned before each run (a NaN payload for floats, a sentinel for integers), so an
  element the kernel never wrote cannot pass, and NaN never matches a number;
- canary bytes on both sides of every output and a check that inputs are unchanged, so a
  silent out-of-bounds write or a write into an input is caught.

Comparing in the kernel's dtype. The eager oracle runs in float64, the kernel in its own
dtype (float32, say). The expected value is first rounded to the output dtype, because that
is what an exact kernel of that dtype returns: a float64 value beyond float32's range becomes
±inf (1e4 / 4.7e-38 = 2.1e41 is -inf or +inf in float32, and a kernel that says so is right),
and the scale of the tolerance comes from the rounded, finite values only. The rules, per
output element, with `want` the float64 oracle and `w` it rounded to the output dtype:
- `w` finite: `got` must be finite and within the tolerance. NaN or ±inf never passes against
  a number, whatever the output.
- `w` ±inf because `want` overflowed the dtype (finite in float64): `got` must be the same
  ±inf, or a finite number within the tolerance of `want` (a kernel that rounds its last
  operation down to the largest finite value instead of up to inf).
- `w` NaN or ±inf in float64 already, in an elementwise output: NaN must be NaN and ±inf the
  same ±inf. An elementwise result has one formula, and IEEE arithmetic fixes its special value.
- `w` ±inf or NaN in a statistics output (an output with fewer elements than the largest
  input, each element summarizing many: a sum, a mean, a norm's mean or rstd): `got` must be
  non-finite (NaN or ±inf), never a number. Which special value a statistic over non-finite
  data reaches depends on the formula and the order of its reduction, not on correctness: a
  one-pass variance E[x²]-E[x]² of a row holding +inf is inf-inf = NaN where a two-pass one
  gives +inf; a float32 running sum that overflowed to +inf before meeting -inf gives NaN
  where float64 gives -inf; torch-mlir's native_layer_norm reports rstd = inf for a row
  holding NaN where float64 eager says NaN (issue 8). What is checked is that the kernel did not
  invent a number where none exists, and the elementwise outputs computed from such a row
  (the normalized values) are held to the strict rule above.

Beyond the dtype. An edge trial's values (±1e4 beside ±4.7e-38) can take a result where the
output's dtype cannot follow: products of 1e8 that cancel to a few units, a quotient of
2e41 that overflows on the way to a representable result. Eager ATen in the output's own
dtype misses the float64 oracle there too, and so may any correct kernel of that dtype. Where
a trial fails, eager is run in the output's dtype as well, and at the
elements where it too misses the float64 oracle beyond the tolerance (and only there) `got`
passes if it misses by at most `ILL_CONDITIONED` times as much, or, where eager's own result
is non-finite, is non-finite too or within the tolerance of float64 (what inductor's accuracy
check does with its float64 reference and `multiplier`). Where both are non-finite but differ
(an overflowed quotient meets a division by zero: NaN in float32, -inf in float64), `got`
passes with eager's special value or float64's. A random trial's values can go there too
(BERT's `(1 - mask) * finfo.min` with a mask of either sign overflows float32): it is judged
the same way.
Eager's own order may be lucky where another's is not: terms of ±5359 that cancel to 0.87 in a
product of 16 terms missed the float64 result by 1.4e-4 in eager's order and by 4.2e-4 summed
in k's order. So where the operator reduces, an element also counts as beyond the dtype by
how far the float64 result moves when each input moves within its own dtype's rounding
(`rounding_spread`): what a correct kernel's roundings can amount to there, elementwise
(Higham's backward error). Elements whose result does not depend on such movement (a clamped
one, a well-conditioned sum) are held to the tolerance as before.

Reductions. A float reduction of n terms rounds n times, each time by up to half an ulp of the
running value, so its error relative to the magnitude of the result grows with n. The errors
of independent roundings have random signs and add like a random walk: their sum grows as
sqrt(n)·eps (Higham, Accuracy and Stability of Numerical Algorithms, §4.2, the statistical
estimate), which is what float32 sums of 16M terms measured here (0.5·sqrt(n)·eps/2 of the
running magnitude). The worst-case bound n·eps is reached only by adversarial data and would
make the check empty for the long reductions it must still judge (n·eps = 32 at n = 2^28).
So both rtol and atol grow by `REDUCTION_SAFETY · eps · sqrt(n)` for a kernel whose longest
reduction has n terms; the safety factor covers the tail of that random walk and results that
cancel to a fraction of the running value. Those errors are relative to the running value,
which the terms' magnitude bounds from below, not to the result: a mean of 128 log-
probabilities among which ±1e4 cancel to -0.0107 is off by 8e-5 in any summation order, so
the scale of a statistics output's tolerance is at least the largest finite |input| (for the
sum-of-terms bound, Higham §4.2 again).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kope.vocabulary.layouts import span
from kope.vocabulary.specs import InputRef, OpCall, Program, TaskSpec, TensorSpec, dtype_name

# (rtol, atol): |got - want| <= atol * max(1, max|want|) + rtol * |want|, elementwise.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}
EXACT = (0.0, 0.0)
# Where eager in the output's dtype misses the float64 oracle on an edge trial, how many times
# its error a kernel's may be (rounding of cancelling terms is not reproducible across orders).
ILL_CONDITIONED = 4.0
# How many statistical standard deviations of a length-n reduction's rounding error (in units
# of eps·sqrt(n) of the result's magnitude) a kernel may be off by; see the module docstring.
REDUCTION_SAFETY = 8.0


def tolerance(dtype: torch.dtype, reduction: int = 1) -> tuple[float, float]:
    """(rtol, atol) for an output of `dtype` computed by reductions of up to `reduction` terms."""
    rtol, atol = TOLERANCES.get(dtype, EXACT)
    if reduction > 1 and dtype.is_floating_point:
        grow = REDUCTION_SAFETY * torch.finfo(dtype).eps * math.sqrt(reduction)
        rtol, atol = rtol + grow, atol + grow
    return rtol, atol


GUARD_BYTES = 4096
CANARY = 0xA5
_INT_POISON = 0x5A


@dataclass(frozen=True)
class Trial:
    """One set of inputs: `kind` is random, edge or nonfinite."""

    kind: str
    seed: int


def trials_for(seed: int) -> list[Trial]:
    return [
        Trial("random", seed),
        Trial("random", seed + 1),
        Trial("edge", seed + 2),
        Trial("nonfinite", seed + 3),
    ]


@dataclass(frozen=True)
class Domain:
    """The values an input may hold for its operator to be defined: integers indexing a dim of
    `high` elements, (`offsets`) EmbeddingBag's bag starts into `high` indices: sorted, from 0,
    and (`last`, include_last_offset) ending at `high`; or (`unit`) reals in [0, 1], the
    probabilities binary cross-entropy takes (it raises on any other value, NaN included)."""

    high: int
    offsets: bool = False
    last: bool = False
    unit: bool = False
    signed: bool = False  # integers in [-high, high): a dividend, whose sign floor and trunc see
    nonzero: bool = False  # integers in ±[1, high]: an integer divisor (0 raises in eager)


UNIT = Domain(1, unit=True)
DIVIDEND = Domain(8, signed=True)
DIVISOR = Domain(4, signed=True, nonzero=True)
# Integer divisions by a tensor: a divisor drawn blind held zeros, eager's oracle raised
# ZeroDivisionError on every trial, and the operator could never get a kernel.
_DIVISIONS = {
    "aten.div.Tensor_mode",
    "aten.remainder.Tensor",
    "aten.fmod.Tensor",
    "aten.floor_divide.default",
}


# Ops that index a dim of one argument with another: op -> (index argument, indexed argument,
# the indexed dim: an int, or the position of the argument that holds it).
_INDEXING: dict[str, tuple[int, int, tuple[str, int]]] = {
    "aten.embedding.default": (1, 0, ("dim", 0)),
    "aten.gather.default": (2, 0, ("arg", 1)),
    "aten.index_select.default": (2, 0, ("arg", 1)),
    "aten.index_add.default": (2, 0, ("arg", 1)),
    "aten.index_copy.default": (2, 0, ("arg", 1)),
    "aten.index_fill.int_Scalar": (2, 0, ("arg", 1)),
    "aten.scatter.src": (2, 0, ("arg", 1)),
    "aten.scatter.value": (2, 0, ("arg", 1)),
    "aten.scatter_add.default": (2, 0, ("arg", 1)),
    "aten.scatter_reduce.two": (2, 0, ("arg", 1)),
    "aten.multi_margin_loss.default": (1, 0, ("dim", -1)),
}
_BAGS = {
    "aten._embedding_bag.default",
    "aten._embedding_bag_forward_only.default",
    "aten.embedding_bag.default",
    "aten.embedding_bag.padding_idx",
}


def integer_domains(task: TaskSpec) -> tuple[Domain | None, ...]:
    """Per input of `task`, the integers its operator is defined on, where an op of its eager
    call says (an index into a dim, a class id, a bag offset); None: small non-negative
    integers, valid counts and indices for most ops. Drawn blind, [0, 4) indexed a 3-row
    tensor, a 2-row embedding (BERT's token types) and 2 classes out of range: the oracle
    itself failed and the operator could never be compiled."""
    found: dict[int, Domain] = {}
    steps = task.eager.steps if isinstance(task.eager, Program) else (task.eager,)
    for step in steps:
        if isinstance(step, OpCall):
            for index, domain in _step_domains(step, task.inputs):
                if index not in found or domain.high < found[index].high:
                    found[index] = domain
    return tuple(found.get(i) for i in range(len(task.inputs)))


def _step_domains(step: OpCall, specs: Sequence[TensorSpec]) -> list[tuple[int, Domain]]:
    args = list(step.args) + [v for _, v in step.kwargs]

    def shape(position: int) -> tuple[int, ...] | None:
        value = args[position] if position < len(args) else None
        return specs[value.index].shape if isinstance(value, InputRef) else None

    def dim_of(sizes: tuple[int, ...], dim: Any) -> int | None:
        if not isinstance(dim, int):
            return None
        if not sizes:
            return 1  # a 0-d tensor has one place
        return sizes[dim] if -len(sizes) <= dim < len(sizes) else None

    def ref(position: int) -> int | None:
        value = args[position] if position < len(args) else None
        return value.index if isinstance(value, InputRef) else None

    out: list[tuple[int, Domain]] = []
    if step.op in _INDEXING:
        index_at, self_at, (how, where) = _INDEXING[step.op]
        sizes, index = shape(self_at), ref(index_at)
        dim = where if how == "dim" else (args[where] if where < len(args) else None)
        high = dim_of(sizes, dim) if sizes is not None else None
        if index is not None and high:
            out.append((index, Domain(high)))
    elif step.op in ("aten.index.Tensor", "aten.index_put.default"):
        sizes = shape(0)
        indices = args[1] if len(args) > 1 else ()
        for dim, value in enumerate(indices if isinstance(indices, (list, tuple)) else ()):
            if isinstance(value, InputRef) and sizes is not None and dim < len(sizes):
                out.append((value.index, Domain(sizes[dim])))
    elif step.op in ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default"):
        sizes, target = shape(0), ref(1)
        if sizes and target is not None:
            out.append((target, Domain(sizes[1] if len(sizes) > 1 else sizes[0])))
    elif step.op == "aten.binary_cross_entropy.default":
        out.extend((i, UNIT) for i in (ref(0), ref(1)) if i is not None)
    elif step.op in _DIVISIONS:
        dividend, divisor = ref(0), ref(1)
        if divisor is not None and not specs[divisor].torch_dtype.is_floating_point:
            out.append((divisor, DIVISOR))
            if dividend is not None and not specs[dividend].torch_dtype.is_floating_point:
                out.append((dividend, DIVIDEND))
    elif step.op in _BAGS:
        weight, bag_indices, indices, offsets = shape(0), ref(1), shape(1), ref(2)
        if weight and bag_indices is not None:
            out.append((bag_indices, Domain(weight[0])))
        if indices is not None and offsets is not None:
            last = len(args) > 7 and args[7] is True
            out.append((offsets, Domain(math.prod(indices), offsets=True, last=last)))
    return out


def task_inputs(task: TaskSpec, trial: Trial) -> list[torch.Tensor]:
    """Inputs of `task` for one trial: `make_inputs` with its integers inside the domains its
    operator defines (`integer_domains`). Every draw for a Task goes through here."""
    return make_inputs(task.inputs, trial, integer_domains(task))


# The integers a float holds exactly: its significand's bits, the implicit one included.
_EXACT_BITS = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}
# An input element (a linalg body's `%in`) converted to a float, and a float converted back.
_INPUT_TO_FLOAT = re.compile(
    r"arith\.(sitofp|uitofp)\s+%in(?:_\d+)?\s*:\s*(?:vector<[\dx]*x)?i(\d+)>?\s+to\s+"
    r"(?:vector<[\dx]*x)?(f16|bf16|f32|f64)\b"
)
_FLOAT_TO_INT = re.compile(r"arith\.(?:fptosi|fptoui)\b")


def lossy_integers(source: str) -> str | None:
    """Why a kernel computes integers through a float too narrow for them (None: it does not).

    torch-mlir lowers an int64 negation as sitofp to f32, negf, fptosi, and an int64 floor
    division through f64: exact on the small integers verification draws (most integer inputs
    are indices, drawn in [0, 4)), wrong from 2^24 and 2^53 on (-16777217 came back as
    -16777216). Only an input's elements are judged, converted and then brought back to an
    integer: a loop index converted to compute a coordinate, or an integer input converted to
    a float result as eager converts it, stays exact or is what eager computes."""
    if not _FLOAT_TO_INT.search(source):
        return None
    for kind, bits, float_type in _INPUT_TO_FLOAT.findall(source):
        magnitude = int(bits) - (kind == "sitofp")  # a signed integer's sign bit
        if magnitude > _EXACT_BITS[float_type]:
            return (
                f"it computes i{bits} input values through {float_type} and back to an "
                f"integer, which loses digits above 2^{_EXACT_BITS[float_type]} (eager computes "
                "in the integers)"
            )
    return None


def make_inputs(
    specs: Sequence[TensorSpec], trial: Trial, domains: Sequence[Domain | None] = ()
) -> list[torch.Tensor]:
    """Inputs for one trial (integers within their `domains`, `integer_domains`). Non-finite
    values go into the first floating input only (the data operand by ATen's convention); the
    others get edge values: NaN weights or statistics say little about an operator, and the
    oracle's answer for them is an accident of its formula."""
    gen = torch.Generator().manual_seed(trial.seed)
    first_float = next((i for i, s in enumerate(specs) if s.torch_dtype.is_floating_point), -1)
    inputs = []
    for index, spec in enumerate(specs):
        kind = trial.kind
        if kind == "nonfinite" and index != first_float:
            kind = "edge"
        domain = domains[index] if index < len(domains) else None
        inputs.append(_make_one(spec, kind, gen, domain))
    return inputs


def _make_one(
    spec: TensorSpec, kind: str, gen: torch.Generator, domain: Domain | None = None
) -> torch.Tensor:
    dtype = spec.torch_dtype
    shape = spec.shape
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if domain is not None and domain.unit and dtype.is_floating_point:
        return _probabilities(shape, dtype, kind, gen)
    if not dtype.is_floating_point:
        if domain is not None and domain.offsets:
            return _offsets(shape, dtype, kind, gen, domain)
        if domain is not None and domain.signed:
            return _signed(shape, dtype, kind, gen, domain)
        if domain is None and dtype in _DATA_INTEGERS:
            return _data_integers(shape, dtype, kind, gen)
        if kind == "edge":
            return torch.zeros(shape, dtype=dtype)
        # Small non-negative integers are valid indices, counts and class ids for most ops.
        high = domain.high if domain is not None else 4
        return torch.randint(0, high, shape, generator=gen, dtype=dtype)
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind in ("edge", "nonfinite"):
        info = torch.finfo(dtype)
        large = min(1e4, info.max**0.25)
        specials = [0.0, -0.0, large, -large, info.tiny * 4, -info.tiny * 4]
        if kind == "nonfinite":
            specials += [math.nan, math.inf, -math.inf]
        values = _sprinkled(values, specials, gen)
        if kind == "nonfinite":
            values = _with_each(values, [math.nan, math.inf, -math.inf], gen)
    return values.to(dtype)


# Integers that are data, not indices: an image's bytes, quantized values. Drawn in [0, 4)
# like indices, `(img > 128).sum()` of a uint8 image was verified on inputs where no element
# passed 128, and a kernel that counted wrongly ran.
_DATA_INTEGERS = (torch.uint8, torch.int8, torch.int16)


def _data_integers(
    shape: tuple[int, ...], dtype: torch.dtype, kind: str, gen: torch.Generator
) -> torch.Tensor:
    """The whole range of the dtype; an edge trial's are its extremes and their neighbours."""
    info = torch.iinfo(dtype)
    if kind != "edge":
        return torch.randint(info.min, info.max + 1, shape, generator=gen, dtype=dtype)
    middle = (info.max + info.min + 1) // 2  # 128 for uint8, 0 for the signed ones
    specials = torch.tensor(
        [info.min, info.min + 1, middle - 1, middle, middle + 1, info.max - 1, info.max]
    )
    picks = torch.randint(0, len(specials), shape, generator=gen)
    return specials[picks].to(dtype)


def _signed(
    shape: tuple[int, ...], dtype: torch.dtype, kind: str, gen: torch.Generator, domain: Domain
) -> torch.Tensor:
    """Integers of both signs (`Domain.signed`), none zero where `domain.nonzero`; an edge
    trial's are the extremes (±1 and ±high for a divisor, zeros for the rest)."""
    low = 0 if dtype == torch.uint8 else -domain.high  # an unsigned dtype has no negatives
    if domain.nonzero:
        magnitude = torch.randint(1, domain.high + 1, shape, generator=gen)
        if kind == "edge":
            magnitude = torch.where(torch.rand(shape, generator=gen) < 0.5, 1, domain.high)
        negative = (torch.rand(shape, generator=gen) < 0.5) & (low < 0)
        return torch.where(negative, -magnitude, magnitude).to(dtype)
    if kind == "edge":
        return torch.zeros(shape, dtype=dtype)
    return torch.randint(low, domain.high, shape, generator=gen, dtype=dtype)


def _sprinkled(values: torch.Tensor, specials: list[float], gen: torch.Generator) -> torch.Tensor:
    """`values` with each element replaced by one of `specials` with probability 1/2."""
    pick = torch.randint(0, 2 * len(specials), values.shape, generator=gen)
    for i, special in enumerate(specials):
        values = torch.where(pick == i, torch.tensor(special, dtype=torch.float64), values)
    return values


def _probabilities(
    shape: tuple[int, ...], dtype: torch.dtype, kind: str, gen: torch.Generator
) -> torch.Tensor:
    """Reals in [0, 1]; an edge trial's (and a non-finite one's: NaN is outside the domain)
    are mostly its ends and their nearest neighbours, where log(p) and log(1-p) are steepest."""
    values = torch.rand(shape, generator=gen, dtype=torch.float64)
    if kind != "random":
        info = torch.finfo(dtype)
        specials = [0.0, 1.0, info.tiny * 4, 1.0 - info.eps, 0.5]
        values = _sprinkled(values, specials, gen)
    return values.to(dtype)


def _offsets(
    shape: tuple[int, ...], dtype: torch.dtype, kind: str, gen: torch.Generator, domain: Domain
) -> torch.Tensor:
    """Bag starts: sorted, the first 0, the last `high` where it ends the last bag; an edge
    trial's bags are all empty but the last."""
    count = math.prod(shape)
    if kind == "edge":
        values = torch.zeros(count, dtype=torch.int64)
    else:
        values = torch.randint(0, domain.high + 1, (count,), generator=gen).sort().values
    if count:
        values[0] = 0
        if domain.last:
            values[-1] = domain.high
    return values.to(dtype).reshape(shape)


def computed_through(
    eager: OpCall | Program | None, inputs: Sequence[torch.Tensor]
) -> torch.dtype | None:
    """The least precise floating dtype of the values a fused group computes on its way to
    its outputs (a bfloat16 product before a float32 residual add, as autocast traces it):
    eager rounds there, a kernel that keeps the product in float32 does not, and its outputs
    are judged at that dtype's tolerance (`compare`'s `precision`). None for one operator."""
    if not isinstance(eager, Program):
        return None
    values = torch.utils._pytree.tree_leaves(eager.step_values(inputs))
    return least_precise([v for v in values if isinstance(v, torch.Tensor)])


def least_precise(tensors: Sequence[torch.Tensor]) -> torch.dtype | None:
    """The floating dtype of `tensors` with the loosest tolerance; None if none is floating."""
    floats = {t.dtype for t in tensors if t.dtype.is_floating_point}
    return max(floats, key=lambda d: TOLERANCES.get(d, EXACT), default=None)


def _with_each(values: torch.Tensor, specials: list[float], gen: torch.Generator) -> torch.Tensor:
    """`values` with each of `specials` at least once (as many as it has elements), at
    consecutive places from a random start. Drawn 1 in 18 per element, a small tensor would
    often hold none: a 4-element one has no NaN 80% of the time, and a kernel that turns NaN
    into a number (torch-mlir's clamp) passed verification and ran."""
    flat = values.reshape(-1).clone()
    if flat.numel() == 0:
        return values
    start = int(torch.randint(0, flat.numel(), (1,), generator=gen))
    for offset, special in enumerate(specials[: flat.numel()]):
        flat[(start + offset) % flat.numel()] = special
    return flat.view(values.shape)


def upcast(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Float inputs in float64, for the eager oracle."""
    return [t.double() if t.is_floating_point() else t for t in inputs]


# -- guarded outputs --------------------------------------------------------------------------


class GuardedOutputs:
    """Output buffers poisoned inside, canaries outside, in `device` memory; `check` reports
    any damage."""

    def __init__(self, specs: Sequence[TensorSpec], device: str = "cpu"):
        self.specs = list(specs)
        self.buffers: list[torch.Tensor] = []
        self.views: list[torch.Tensor] = []
        for spec in self.specs:
            dtype = spec.torch_dtype
            nbytes = math.prod(spec.shape) * _itemsize(dtype)
            buf = torch.full((GUARD_BYTES * 2 + nbytes,), CANARY, dtype=torch.uint8, device=device)
            body = buf[GUARD_BYTES : GUARD_BYTES + nbytes]
            if dtype.is_floating_point:
                body.view(dtype).fill_(math.nan)
            else:
                body.fill_(_INT_POISON)
            self.buffers.append(buf)
            view = (
                body.view(dtype).view(spec.shape)
                if nbytes
                else torch.empty(spec.shape, dtype=dtype, device=device)
            )
            self.views.append(view)

    def check(self) -> str | None:
        """None if every canary is intact, else where the kernel wrote out of bounds."""
        for index, buf in enumerate(self.buffers):
            head = buf[:GUARD_BYTES]
            tail = buf[-GUARD_BYTES:]
            for side, region in (("before", head), ("after", tail)):
                bad = (region != CANARY).nonzero()
                if bad.numel():
                    offset = int(bad[0 if side == "after" else -1])
                    distance = offset + 1 if side == "after" else GUARD_BYTES - offset
                    return (
                        f"out-of-bounds write {side} output {index}: {int(bad.numel())} canary "
                        f"bytes changed, nearest {distance} bytes {side} it"
                    )
        return None


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# -- comparison -------------------------------------------------------------------------------


# Elements compared at a time: about ten float64 temporaries of this many, 80 MB in all.
COMPARE_CHUNK = 1 << 20


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    message: str = ""


def compare(
    got: torch.Tensor,
    want: torch.Tensor,
    index: int = 0,
    *,
    reduction: int = 1,
    statistic: bool = False,
    terms: float = 0.0,
    precision: torch.dtype | None = None,
    own: torch.Tensor | None = None,
    spread: torch.Tensor | None = None,
) -> Comparison:
    """Compare one output with its expected value, in the output's dtype.

    `reduction` is the length of the longest reduction behind the output (the tolerance grows
    with it); `statistic` says the output summarizes its inputs (fewer elements than the
    largest input), which relaxes what non-finite value it must hold where the oracle has one.
    `terms` is the magnitude of the terms a statistic sums (`magnitude` of the inputs): its
    rounding error is relative to them, not to a result that cancelled (see the module
    docstring). `precision`, a less precise dtype than the output's, sets the tolerance where
    the output was computed through it (a float32 softmax of bfloat16 values). `own`, for an
    edge trial against the float64 oracle, is eager's result in the output's dtype: the
    elements it misses are beyond the dtype, and so are those where `spread`
    (`rounding_spread`) exceeds the tolerance. The rules are in the module docstring."""
    if tuple(got.shape) != tuple(want.shape):
        return Comparison(
            False,
            math.inf,
            math.inf,
            f"output {index}: shape {tuple(got.shape)} != {tuple(want.shape)}",
        )
    if got.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    # Flat views, compared a chunk at a time: a float64 temporary per step of the rules, over
    # a whole 1x32x8M float16 output, took 24 GB and the user's process with it.
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    flat_own = own.reshape(-1) if own is not None else None
    flat_spread = spread.reshape(-1) if spread is not None else None
    chunks = range(0, flat_got.numel(), COMPARE_CHUNK)

    def piece(t: torch.Tensor, at: int) -> torch.Tensor:
        return t[at : at + COMPARE_CHUNK]

    if not got.dtype.is_floating_point:
        differ = 0
        where: tuple[int, ...] | None = None
        for at in chunks:
            diff = _as_int(piece(flat_got, at)) != _as_int(piece(flat_want, at))
            count = int(diff.sum())
            if count and where is None:
                where = _unravel(at + int(diff.nonzero()[0]), got.shape)
            differ += count
        if where is not None:
            return Comparison(
                False,
                math.inf,
                math.inf,
                f"output {index}: {differ} of {got.numel()} elements differ, first at "
                f"{list(where)}: got {got[where].item()}, expected {want[where].item()}",
            )
        return Comparison(True, 0.0, 0.0)
    rtol, atol = tolerance(got.dtype, reduction)
    if precision is not None and precision.is_floating_point:
        # The values' own rounding, not their reductions': those ran in the output's dtype.
        base_rtol, base_atol = TOLERANCES.get(precision, EXACT)
        rtol, atol = max(rtol, base_rtol), max(atol, base_atol)
    scale = 1.0
    for at in chunks:
        w = piece(flat_want, at).to(got.dtype).double()
        finite_w = w[torch.isfinite(w)]
        if finite_w.numel():
            scale = max(scale, float(finite_w.abs().max()))
    scale = max(scale, terms)
    max_abs = max_rel = 0.0
    bad_count = 0
    first_bad: tuple[int, float, float, float, bool] | None = None  # at, got, exact, w, overflowed
    for at in chunks:
        g = piece(flat_got, at).double()
        exact = piece(flat_want, at).double()  # the oracle as computed (float64 for eager's)
        w = piece(flat_want, at).to(got.dtype).double()  # what an exact kernel returns
        overflowed = torch.isfinite(exact) & torch.isinf(w)
        zero = torch.zeros_like(w)
        bound = atol * scale + rtol * torch.where(torch.isfinite(w), w.abs(), zero)
        abs_err = torch.where(torch.isfinite(g) & torch.isfinite(w), (g - w).abs(), math.inf)
        ok = abs_err <= bound
        # Overflow in the rounding: the dtype's inf, or a finite value close to the float64 one.
        near_exact = (g - exact).abs() <= rtol * exact.abs()
        ok |= overflowed & ((g == w) | (torch.isfinite(g) & near_exact))
        if flat_own is not None:
            spread_piece = piece(flat_spread, at) if flat_spread is not None else None
            ok |= _beyond_the_dtype(g, exact, piece(flat_own, at).double(), bound, spread_piece)
        special = ~torch.isfinite(w) & ~overflowed
        if statistic:
            ok |= special & ~torch.isfinite(g)
        else:
            ok |= special & ((torch.isnan(w) & torch.isnan(g)) | (torch.isinf(w) & (g == w)))
        abs_err = torch.where(ok & ~torch.isfinite(abs_err), zero, abs_err)
        max_abs = max(max_abs, float(abs_err.max()))
        max_rel = max(max_rel, float((abs_err / w.abs().clamp_min(atol * scale)).max()))
        bad = ~ok
        count = int(bad.sum())
        if count and first_bad is None:
            i = int(bad.nonzero()[0])
            first_bad = (at + i, g[i].item(), exact[i].item(), w[i].item(), bool(overflowed[i]))
        bad_count += count
    if first_bad is not None:
        at, got_value, exact_value, w_value, was_overflowed = first_bad
        return Comparison(
            False,
            max_abs,
            max_rel,
            f"output {index}: {bad_count} of {got.numel()} elements beyond the tolerance "
            f"(rtol {rtol:g}, atol {atol:g} x scale {scale:.3g}), first at "
            f"{list(_unravel(at, got.shape))}: got {got_value:.7g}, expected {exact_value:.7g}"
            + (f" ({w_value:.7g} in {dtype_name(got.dtype)})" if was_overflowed else ""),
        )
    return Comparison(True, max_abs, max_rel)


def _beyond_the_dtype(
    got: torch.Tensor,
    exact: torch.Tensor,
    own: torch.Tensor,
    bound: torch.Tensor,
    spread: torch.Tensor | None = None,
) -> torch.Tensor:
    """Where eager in the output's dtype (`own`) misses the float64 `exact` beyond `bound`:
    `got` is no further off than `ILL_CONDITIONED` times eager's error, or, where eager's
    result is non-finite, non-finite too or within `bound` of `exact`; where both are
    non-finite and differ, `got` is the special value of one or the other. Anywhere, `got`
    may be off by `bound` and `ILL_CONDITIONED` times the float64 result's `spread` under
    input rounding."""
    finite = torch.isfinite(exact)
    own_finite = torch.isfinite(own)
    own_err = torch.where(finite & own_finite, (own - exact).abs(), torch.zeros_like(exact))
    err = torch.where(torch.isfinite(got), (got - exact).abs(), math.inf)
    close = finite & own_finite & (own_err > bound) & (err <= ILL_CONDITIONED * own_err)
    if spread is not None:
        moved = spread.double()
        moved = torch.where(torch.isfinite(moved), moved, torch.zeros_like(moved))
        close |= finite & (err <= bound + ILL_CONDITIONED * moved)
    lost = finite & ~own_finite & (~torch.isfinite(got) | (err <= bound))
    special = ~finite & ~own_finite & ~_same_special(own, exact)
    either = special & (_same_special(got, own) | _same_special(got, exact))
    return close | lost | either


def _same_special(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where `a` and `b` are both NaN or the same infinity."""
    return (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b))


# Draws of the inputs' rounding `rounding_spread` takes the largest movement over.
SPREAD_DRAWS = 4


def rounding_spread(
    oracle: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor],
    seed: int,
    reduction: int = 1,
) -> list[torch.Tensor]:
    """How far each float64 output of `oracle` moves, elementwise, when every float input moves
    by up to its own dtype's rounding times sqrt(`reduction`) (relative, uniform:
    `SPREAD_DRAWS` seeded draws, each taken both ways); signs and zeros are kept, so
    comparisons with zero do not flip. The square root: a reduction of n terms rounds its
    running sum about sqrt(n) times as far as the terms' own rounding moves it (the module
    docstring's random walk), and the running sum is as large as the terms that cancel."""
    gen = torch.Generator().manual_seed(seed)
    grow = math.sqrt(max(1, reduction))
    wide = upcast(inputs)
    base = run_oracle(oracle, wide)
    spread = [torch.zeros_like(out, dtype=torch.float64) for out in base]
    for _ in range(SPREAD_DRAWS):
        draws = [_rounding(t, gen) * grow if t.is_floating_point() else None for t in inputs]
        for sign in (1, -1):  # both ways: a clamp or threshold may hide one of them
            moved_inputs = [
                w if d is None else w * (1 + sign * d) for w, d in zip(wide, draws, strict=True)
            ]
            outputs = run_oracle(oracle, moved_inputs)
            for index, (out, was) in enumerate(zip(outputs, base, strict=True)):
                if out.is_floating_point():
                    step = torch.nan_to_num((out.double() - was.double()).abs(), nan=0.0)
                    spread[index] = torch.maximum(spread[index], step)
    return spread


def _rounding(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Relative movements within `t`'s dtype's rounding, uniform, in float64 (1 + eps/2 must
    not round back to 1)."""
    uniform = torch.rand(t.shape, generator=gen, dtype=torch.float64)
    return torch.finfo(t.dtype).eps * (2 * uniform - 1)


def magnitude(inputs: Sequence[torch.Tensor]) -> float:
    """The largest finite absolute value among the floating-point `inputs` (0 if none)."""
    found = 0.0
    for t in inputs:
        if t.dtype.is_floating_point and t.numel():
            finite = t[torch.isfinite(t)]
            if finite.numel():
                found = max(found, float(finite.abs().max()))
    return found


def _as_int(t: torch.Tensor) -> torch.Tensor:
    # A bool byte the kernel never wrote holds the poison, which only a byte view can see.
    return t.view(torch.uint8).long() if t.dtype == torch.bool else t.long()


def _unravel(flat_index: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The multi-dimensional index of element `flat_index` of a row-major tensor of `shape`."""
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), tuple(shape)))


def inputs_unchanged(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> str | None:
    for index, (b, a) in enumerate(zip(before, after, strict=True)):
        if not torch.equal(_bytes(b), _bytes(a)):
            return f"the kernel wrote into its input {index}"
    return None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def run_oracle(
    oracle: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor],
) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach() for t in oracle(inputs))


# Timing input sets draw seeds this far from the job's seed, clear of the verification trials.
TIMING_SEED_OFFSET = 100


def timing_inputs(task: TaskSpec, seed: int, count: int) -> list[list[torch.Tensor]]:
    """`count` input sets of `task` for timing (`task_inputs`), drawn with seeds apart from
    the verification trials'.

    The data operand (input 0, by ATen's convention) is fresh in each set; the other inputs
    (weights, biases, statistics) are the same tensors in all, as they are between the calls
    of a model, and parameters, as a model's weights are (a kernel keeps what it derives from
    a parameter, a packed copy: `kope.targets.jit`). A kernel timed on rotating sets cannot
    return a result it kept from the call before, and its outputs on each set are checked
    after timing."""
    draws = [
        task_inputs(task, Trial("random", seed + TIMING_SEED_OFFSET + k))
        for k in range(max(1, count))
    ]
    strides = task.strides
    if len(strides) != len(draws[0]):  # unknown (a stored task, IR alone): as drawn
        strides = tuple(tuple(t.stride()) for t in draws[0])
    shared = [
        _laid_out(torch.nn.Parameter(t, requires_grad=False), s)
        for t, s in zip(draws[0][1:], strides[1:], strict=True)
    ]
    return [[_laid_out(draw[0], strides[0]), *shared] if draw else [] for draw in draws]


def _laid_out(tensor: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """`tensor`'s values in a view with `strides`, as the model passes that input (a head of
    q permuted out of one projection; one half of a chunked projection), in zeroed memory
    whose gaps hold no subnormals; `tensor` itself where it has them already, or where they
    broadcast or overlap (no view can hold distinct values there). The view of a parameter
    is a view of a parameter, as a transposed weight is: what a kernel derives from it is
    kept between calls as it is in the model (`kope.targets.jit.prepared_input`)."""
    shape = tuple(tensor.shape)
    if tuple(tensor.stride()) == strides or not _distinct(shape, strides):
        return tensor
    memory = torch.zeros(span(shape, strides), dtype=tensor.dtype, device=tensor.device)
    if isinstance(tensor, torch.nn.Parameter):
        memory = torch.nn.Parameter(memory, requires_grad=False)
    view = memory.as_strided(shape, strides)
    with torch.no_grad():
        view.copy_(tensor)
    return view


def _distinct(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether `strides` give every element of `shape` a place of its own."""
    if len(shape) != len(strides) or 0 in shape:
        return False
    dims = sorted((s, n) for n, s in zip(shape, strides, strict=True) if n > 1)
    reach = 1  # elements the inner dims span
    for stride, size in dims:
        if stride < reach:
            return False
        reach = stride * (size - 1) + reach
    return True
