// RUN: kope-opt --kope-outline-operators %s | FileCheck %s

// A module `kope import` wrote is cut already, by the backend's partitioner: its Tasks carry
// their keys, and glue (a view, an operator the backend leaves to ATen) is no operator to
// outline. Outlining leaves it as it is, and `@main` keeps calling what it called.
// CHECK-LABEL: func.func private @glue0_aten_t_default
// CHECK-SAME: kope.glue = "aten.t.default"
// CHECK-NEXT: tensor.empty
// CHECK-NEXT: linalg.transpose
// CHECK-LABEL: func.func @main
// CHECK-SAME: kope.graph
// CHECK-NEXT: %[[T:.*]] = call @glue0_aten_t_default(%arg0)
// CHECK-NEXT: return %[[T]]
// CHECK-NOT: kope_op_
func.func private @glue0_aten_t_default(%arg0: tensor<4x8xf32>) -> tensor<8x4xf32> attributes {kope.glue = "aten.t.default"} {
  %empty = tensor.empty() : tensor<8x4xf32>
  %t = linalg.transpose ins(%arg0 : tensor<4x8xf32>) outs(%empty : tensor<8x4xf32>) permutation = [1, 0]
  return %t : tensor<8x4xf32>
}
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<8x4xf32> attributes {kope.graph} {
  %0 = call @glue0_aten_t_default(%arg0) : (tensor<4x8xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
