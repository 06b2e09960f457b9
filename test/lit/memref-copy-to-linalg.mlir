// RUN: kope-opt --kope-memref-copy-to-linalg %s | FileCheck %s

// CHECK-LABEL: func.func @copy
// CHECK-NOT: memref.copy
// CHECK: linalg.copy {{.*}}ins(%{{.*}} : memref<2x3xf32, strided<[5, 1], offset: ?>>) outs(%{{.*}} : memref<2x3xf32>)
func.func @copy(%src: memref<4x5xf32>, %dst: memref<2x3xf32>) {
  %view = memref.subview %src[1, 1] [2, 3] [1, 1] : memref<4x5xf32> to memref<2x3xf32, strided<[5, 1], offset: 6>>
  %cast = memref.cast %view : memref<2x3xf32, strided<[5, 1], offset: 6>> to memref<2x3xf32, strided<[5, 1], offset: ?>>
  memref.copy %cast, %dst : memref<2x3xf32, strided<[5, 1], offset: ?>> to memref<2x3xf32>
  return
}

// Between two contiguous buffers the copy stays: it lowers to one memcpy.
// CHECK-LABEL: func.func @contiguous
// CHECK: memref.copy %{{.*}}, %{{.*}} : memref<2x3xf32> to memref<2x3xf32>
// CHECK-NOT: linalg.copy
func.func @contiguous(%src: memref<2x3xf32>, %dst: memref<2x3xf32>) {
  memref.copy %src, %dst : memref<2x3xf32> to memref<2x3xf32>
  return
}
