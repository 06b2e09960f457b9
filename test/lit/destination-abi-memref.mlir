// RUN: kope-opt --kope-destination-abi %s | FileCheck %s

// A hand-written memref kernel keeps its body and gains the C interface the invoker calls;
// a private one is made public, else symbol-dce would delete the entry point.
// CHECK-LABEL: func.func @kope_kernel
// CHECK-SAME: (%{{.*}}: memref<8x16xf32>, %{{.*}}: memref<8xf32>)
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NEXT: arith.constant
// CHECK-NEXT: linalg.fill
// CHECK-NOT: func.func
func.func private @kope_kernel(%in: memref<8x16xf32>, %out: memref<8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out : memref<8xf32>)
  return
}
