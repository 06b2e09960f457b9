// A Triton kernel wins on a Triton target, but it is Python that the target's launcher runs on
// the device: no MLIR body stands for it, so the operator keeps its body and the warning says
// where the kernel runs instead.
// RUN: rm -rf %t && mkdir -p %t
// RUN: kope-opt --kope-outline-operators=target=cuda %s -o %t/outlined.mlir
// RUN: %PYTHON %S/Inputs/make_store.py %t/store %t/outlined.mlir \
// RUN:   "kope_op_0 kernel=%S/Inputs/kernel-triton.py form=triton target=cuda"
// RUN: kope-opt --verify-diagnostics --kope-outline-operators=target=cuda --kope-apply-kernels="store=%t/store target=cuda" %s | FileCheck %s

// CHECK-NOT: kope.kernel
// CHECK: linalg.exp
func.func @f(%a: tensor<8xf32>) -> tensor<8xf32> {
  %e = tensor.empty() : tensor<8xf32>
  // expected-warning-re @+1 {{kope-apply-kernels: @kope_op_0 left untouched: its winner, attempt attempt-{{[0-9a-f]+}}, is a triton kernel, which runs through the cuda target's launcher (torch.compile(backend='kope') with target='cuda', or a kernel pack: `kope export --target cuda`), not as an MLIR body}}
  %0 = linalg.exp ins(%a : tensor<8xf32>) outs(%e : tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
