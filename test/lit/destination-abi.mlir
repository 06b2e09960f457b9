// RUN: kope-opt --kope-destination-abi %s | FileCheck %s

// CHECK-LABEL: func.func private @main(%{{.*}}: tensor<3x5xf32>, %{{.*}}: tensor<5xf32>) -> (tensor<3x5xf32>, tensor<3xf32>)
// CHECK-LABEL: func.func @kope_kernel
// CHECK-SAME: (%[[IN0:.*]]: memref<3x5xf32>, %[[IN1:.*]]: memref<5xf32>, %[[OUT0:.*]]: memref<3x5xf32>, %[[OUT1:.*]]: memref<3xf32>)
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK: %[[T0:.*]] = bufferization.to_tensor %[[IN0]] restrict
// CHECK: %[[T1:.*]] = bufferization.to_tensor %[[IN1]] restrict
// CHECK: %[[R:.*]]:2 = call @main(%[[T0]], %[[T1]])
// CHECK: bufferization.materialize_in_destination %[[R]]#0 in restrict writable %[[OUT0]]
// CHECK: bufferization.materialize_in_destination %[[R]]#1 in restrict writable %[[OUT1]]
// CHECK: return
func.func @main(%x: tensor<3x5xf32>, %b: tensor<5xf32>) -> (tensor<3x5xf32>, tensor<3xf32>) {
  %e = tensor.empty() : tensor<3xf32>
  return %x, %e : tensor<3x5xf32>, tensor<3xf32>
}
