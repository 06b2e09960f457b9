// A kernel that cannot replace its operator leaves it untouched, with a warning at the operator.
// RUN: rm -rf %t && mkdir -p %t
// RUN: kope-opt --kope-outline-operators %s -o %t/outlined.mlir
// RUN: %PYTHON %S/Inputs/make_store.py %t/store %t/outlined.mlir \
// RUN:   "kope_op_0 kernel=%S/Inputs/kernel-wrong-signature.mlir" \
// RUN:   "kope_op_1 kernel=%S/Inputs/kernel-memref.mlir" \
// RUN:   "kope_op_2 kernel=%S/Inputs/kernel-bad-schedule.mlir" \
// RUN:   "kope_op_3 kernel=%S/Inputs/kernel-does-not-parse.mlir" \
// RUN:   "kope_op_4 kernel=%S/Inputs/kernel-no-main.mlir" \
// RUN:   "kope_op_5 kernel=missing" \
// RUN:   "kope_op_6"
// RUN: kope-opt --verify-diagnostics --kope-outline-operators --kope-apply-kernels=store=%t/store %s | FileCheck %s
// RUN: kope-opt --kope-outline-operators --kope-apply-kernels=store=%t/store %s 2>&1 >/dev/null | FileCheck %s --check-prefix=STDERR

// CHECK-NOT: kope.kernel
func.func @f(%a44: tensor<4x4xf32>, %b44: tensor<4x4xf32>, %a23: tensor<2x3xf32>, %b34: tensor<3x4xf32>,
             %a35: tensor<3x5xf32>, %b57: tensor<5x7xf32>, %a55: tensor<5x5xf32>,
             %a12: tensor<1x2xf32>, %b23: tensor<2x3xf32>, %a66: tensor<6x6xf32>,
             %a77: tensor<7x7xf32>) {
  %zero = arith.constant 0.0 : f32
  %e44 = tensor.empty() : tensor<4x4xf32>
  %f44 = linalg.fill ins(%zero : f32) outs(%e44 : tensor<4x4xf32>) -> tensor<4x4xf32>
  // Without --verify-diagnostics, warnings print as file:line:col: warning: and do not fail.
  // STDERR-DAG: apply-kernels-warnings.mlir:[[# @LINE + 2]]:8: warning: kope-apply-kernels: @kope_op_0 left untouched
  // expected-warning-re @+1 {{kope-apply-kernels: @kope_op_0 left untouched: attempt attempt-{{[0-9a-f]+}}'s @main has type (tensor<4x4xf32>) -> tensor<4x4xf32>, the function has (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>}}
  %0 = linalg.matmul ins(%a44, %b44 : tensor<4x4xf32>, tensor<4x4xf32>) outs(%f44 : tensor<4x4xf32>) -> tensor<4x4xf32>
  %e24 = tensor.empty() : tensor<2x4xf32>
  %f24 = linalg.fill ins(%zero : f32) outs(%e24 : tensor<2x4xf32>) -> tensor<2x4xf32>
  // expected-warning @+1 {{is a memref-level @kope_kernel in destination-passing form, which cannot replace a function on tensors}}
  %1 = linalg.matmul ins(%a23, %b34 : tensor<2x3xf32>, tensor<3x4xf32>) outs(%f24 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %e37 = tensor.empty() : tensor<3x7xf32>
  %f37 = linalg.fill ins(%zero : f32) outs(%e37 : tensor<3x7xf32>) -> tensor<3x7xf32>
  // expected-warning @+1 {{the schedule failed: only ops implementing TilingInterface are supported}}
  %2 = linalg.matmul ins(%a35, %b57 : tensor<3x5xf32>, tensor<5x7xf32>) outs(%f37 : tensor<3x7xf32>) -> tensor<3x7xf32>
  // expected-warning @+1 {{does not parse}}
  %3 = linalg.exp ins(%a55 : tensor<5x5xf32>) outs(%a55 : tensor<5x5xf32>) -> tensor<5x5xf32>
  %e13 = tensor.empty() : tensor<1x3xf32>
  %f13 = linalg.fill ins(%zero : f32) outs(%e13 : tensor<1x3xf32>) -> tensor<1x3xf32>
  // expected-warning @+1 {{has no @main}}
  %4 = linalg.matmul ins(%a12, %b23 : tensor<1x2xf32>, tensor<2x3xf32>) outs(%f13 : tensor<1x3xf32>) -> tensor<1x3xf32>
  // expected-warning @+1 {{is missing or damaged}}
  %5 = linalg.exp ins(%a66 : tensor<6x6xf32>) outs(%a66 : tensor<6x6xf32>) -> tensor<6x6xf32>
  // expected-warning @+1 {{won but recorded no kernel text}}
  %6 = linalg.exp ins(%a77 : tensor<7x7xf32>) outs(%a77 : tensor<7x7xf32>) -> tensor<7x7xf32>
  return
}

// A kope.key that is not the key of the function's body (edited after outlining, or outlined
// for another target) is not trusted.
// STDERR-DAG: apply-kernels-warnings.mlir:[[# @LINE + 2]]:1: warning: kope-apply-kernels: @stale left untouched
// expected-warning @+1 {{@stale left untouched: its kope.key 000000000000... is not the key of its body on target 'cpu'}}
func.func private @stale(%a: tensor<4xf32>) -> tensor<4xf32> attributes {kope.key = "0000000000000000000000000000000000000000000000000000000000000000"} {
  return %a : tensor<4xf32>
}
