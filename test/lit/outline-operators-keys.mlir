// Two identical matmuls get the same key; a different shape gets another.
// RUN: kope-opt --kope-outline-operators %s | FileCheck %s

// CHECK-LABEL: func.func @two
// CHECK: call @kope_op_0
// CHECK: call @kope_op_1
// CHECK: func.func private @kope_op_0{{.*}}kope.key = "[[KEY:[0-9a-f]+]]"
// CHECK: func.func private @kope_op_1{{.*}}kope.key = "[[KEY]]"
// CHECK: func.func private @kope_op_2
// CHECK-NOT: kope.key = "[[KEY]]"
func.func @two(%a: tensor<8x8xf32>, %b: tensor<8x8xf32>, %c: tensor<8x4xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x4xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x8xf32>) -> tensor<8x8xf32>
  %0 = linalg.matmul ins(%a, %b : tensor<8x8xf32>, tensor<8x8xf32>) outs(%f : tensor<8x8xf32>) -> tensor<8x8xf32>
  %1 = linalg.matmul ins(%b, %a : tensor<8x8xf32>, tensor<8x8xf32>) outs(%f : tensor<8x8xf32>) -> tensor<8x8xf32>
  %e2 = tensor.empty() : tensor<8x4xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<8x4xf32>) -> tensor<8x4xf32>
  %2 = linalg.matmul ins(%a, %c : tensor<8x8xf32>, tensor<8x4xf32>) outs(%f2 : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0, %1, %2 : tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x4xf32>
}
