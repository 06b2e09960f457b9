// RUN: kope-opt --kope-outline-operators %s | FileCheck %s
// RUN: kope-opt --kope-outline-operators %s | kope-opt --kope-outline-operators | FileCheck %s --check-prefix=IDEMPOTENT
// RUN: kope-opt --kope-outline-operators="target=cpu" %s | FileCheck %s

#map = affine_map<(d0, d1) -> (d0, d1)>

// The matmul and the relu each move into a keyed private function with the producers of
// their init tensors; the call sites replace them.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: (%[[X:.*]]: tensor<4x16xf32>, %[[W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: linalg.
// CHECK: %[[MM:.*]] = call @kope_op_0(%[[X]], %[[W]])
// CHECK: %[[RELU:.*]] = call @kope_op_1(%[[MM]])
// CHECK: return %[[RELU]]
// CHECK-LABEL: func.func private @kope_op_0(%{{.*}}: tensor<4x16xf32>, %{{.*}}: tensor<16x8xf32>) -> tensor<4x8xf32>
// CHECK-SAME: kope.key = "{{[0-9a-f]+}}"
// CHECK-SAME: kope.label = "linalg.matmul(4x16xf32, 16x8xf32, 4x8xf32) -> 4x8xf32"
// CHECK-DAG: arith.constant 0.0
// CHECK-DAG: tensor.empty() : tensor<4x8xf32>
// CHECK: linalg.fill
// CHECK: linalg.matmul
// CHECK-LABEL: func.func private @kope_op_1(%{{.*}}: tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-SAME: kope.label = "linalg.generic(4x8xf32, 4x8xf32) -> 4x8xf32"
// CHECK: linalg.generic

// IDEMPOTENT-COUNT-2: func.func private @kope_op_
// IDEMPOTENT-NOT: @kope_op_2
func.func @mlp(%x: tensor<4x16xf32>, %w: tensor<16x8xf32>) -> tensor<4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<4x8xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<4x8xf32>) -> tensor<4x8xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x16xf32>, tensor<16x8xf32>) outs(%init : tensor<4x8xf32>) -> tensor<4x8xf32>
  %relu = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<4x8xf32>) outs(%empty : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %gt = arith.cmpf ugt, %in, %zero : f32
    %r = arith.select %gt, %in, %zero : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32>
  return %relu : tensor<4x8xf32>
}
