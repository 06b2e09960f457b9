// The passes that act on outlined operators say so when the module was not outlined, rather
// than do nothing silently; the module passes through unchanged.
// RUN: rm -rf %t && mkdir -p %t/store
// RUN: kope-opt --kope-apply-kernels=store=%t/store %s 2>&1 >/dev/null | FileCheck %s --check-prefix=APPLY
// RUN: kope-opt --kope-annotate-experience=store=%t/store %s 2>&1 >/dev/null | FileCheck %s --check-prefix=ANNOTATE
// RUN: kope-opt --kope-optimize=store=%t/store %s 2>&1 >/dev/null | FileCheck %s --check-prefix=OPTIMIZE
// RUN: kope-opt --kope-optimize=store=%t/store %s 2>/dev/null | FileCheck %s

// APPLY: warning: kope-apply-kernels: no function carries kope.key, so there is nothing to do: outline the operators first (kope-outline-operators before kope-apply-kernels in the pipeline)
// ANNOTATE: warning: kope-annotate-experience: no function carries kope.key
// OPTIMIZE: warning: kope-optimize: no function carries kope.key
// CHECK: func.func @f
// CHECK-NOT: kope.
// CHECK: linalg.matmul
func.func @f(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
