// kope-apply-kernels replaces an outlined operator's body by the best verified agent kernel the
// experience store holds for its key, and leaves every other operator as it is.
// RUN: rm -rf %t && mkdir -p %t
// RUN: kope-opt --kope-outline-operators %s -o %t/outlined.mlir
// RUN: %PYTHON %S/Inputs/make_store.py %t/store %t/outlined.mlir \
// RUN:   "kope_op_0 source=agent kernel=%S/Inputs/matmul-8x16x32-tiled.mlir latency_us=1 eager_us=2" \
// RUN:   "kope_op_1 source=agent kernel=%S/Inputs/kernel-with-helper.mlir latency_us=1 eager_us=3" \
// RUN:   "kope_op_2 source=eager latency_us=2 eager_us=2" \
// RUN:   "kope_op_2 source=agent kernel=payload latency_us=4 eager_us=2" \
// RUN:   "kope_op_3 source=reference latency_us=1 eager_us=2" \
// RUN:   "kope_op_4 source=agent verdict=mismatch kernel=payload latency_us=1 eager_us=2"
// RUN: kope-opt --kope-apply-kernels="store=%t/store target=cpu" %t/outlined.mlir | FileCheck %s
// RUN: env KOPE_HOME=%t/store kope-opt --kope-apply-kernels %t/outlined.mlir | FileCheck %s
// Annotating first does not change keys: KOPE's attributes are not part of them.
// RUN: kope-opt --pass-pipeline="builtin.module(kope-outline-operators,kope-annotate-experience{store=%t/store},kope-apply-kernels{store=%t/store target=cpu})" %s | FileCheck %s

// Running the passes again changes nothing: kernels are marked and neither outlined nor
// replaced again; the other operators still have no kernel.
// RUN: kope-opt --kope-apply-kernels=store=%t/store %t/outlined.mlir | kope-opt --kope-outline-operators --kope-apply-kernels=store=%t/store | FileCheck %s

// CHECK-LABEL: func.func @main
// CHECK: call @kope_op_0
// CHECK: call @kope_op_1
// CHECK-NOT: kope_op_6

// The tiled, vectorized matmul replaced the outlined one; key and label stay.
// CHECK-LABEL: func.func private @kope_op_0(%{{.*}}: tensor<8x16xf32>, %{{.*}}: tensor<16x32xf32>) -> tensor<8x32xf32>
// CHECK-SAME: kope.artifact = "{{[0-9a-f]+}}"
// CHECK-SAME: kope.attempt = "attempt-{{[0-9a-f]+}}"
// CHECK-SAME: kope.kernel = "agent"
// CHECK-SAME: kope.key = "{{[0-9a-f]+}}"
// CHECK-SAME: kope.label = "linalg.matmul(8x16xf32, 16x32xf32, 8x32xf32) -> 8x32xf32"
// CHECK-NOT: linalg.matmul
// CHECK: scf.for
// CHECK: scf.for
// CHECK: scf.for
// CHECK: vector.contract
// CHECK: return

// A kernel's helper function comes along, private, renamed after the operator, and marked
// as part of the kernel.
// CHECK-DAG: func.func private @kope_op_1_relu(%{{.*}}: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {{{.*}}kope.kernel = "agent"
// CHECK-DAG: func.func private @kope_op_1(%{{.*}}: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {{{.*}}kope.kernel = "agent"
// CHECK-DAG: call @kope_op_1_relu

// Eager ATen beat the agent; the reference lowering won; only a failed attempt; unknown key.
// CHECK-LABEL: func.func private @kope_op_2
// CHECK-NOT: kope.kernel
// CHECK: linalg.exp
// CHECK-LABEL: func.func private @kope_op_3
// CHECK-NOT: kope.kernel
// CHECK: linalg.negf
// CHECK-LABEL: func.func private @kope_op_4
// CHECK-NOT: kope.kernel
// CHECK: linalg.abs
// CHECK-LABEL: func.func private @kope_op_5
// CHECK-NOT: kope.kernel
// CHECK: linalg.floor
// CHECK-NOT: kope.kernel
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>, %y: tensor<4x8xf32>) -> (tensor<8x32xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<8x16xf32>, tensor<16x32xf32>) outs(%init : tensor<8x32xf32>) -> tensor<8x32xf32>
  %e4 = tensor.empty() : tensor<4x8xf32>
  %relu = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%y : tensor<4x8xf32>) outs(%e4 : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.maximumf %in, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x8xf32>
  %exp = linalg.exp ins(%y : tensor<4x8xf32>) outs(%e4 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %neg = linalg.negf ins(%y : tensor<4x8xf32>) outs(%e4 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %abs = linalg.abs ins(%y : tensor<4x8xf32>) outs(%e4 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %floor = linalg.floor ins(%y : tensor<4x8xf32>) outs(%e4 : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %mm, %relu, %exp, %neg, %abs, %floor : tensor<8x32xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
