import triton
import triton.language as tl


@triton.jit
def exp_kernel(x, y, n: tl.constexpr):
    offsets = tl.arange(0, n)
    tl.store(y + offsets, tl.exp(tl.load(x + offsets)))


def launch(x, y):
    exp_kernel[(1,)](x, y, x.numel())
