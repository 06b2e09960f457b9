// RUN: kope-opt --kope-defined-padding %s | FileCheck %s

// A row of 15 floats: one 64-byte line, all of it zeroed (small), freed as allocated.
// CHECK-LABEL: func.func @temporaries
// CHECK: %[[ROW:.*]] = memref.alloc() {alignment = 64 : i64} : memref<64xi8>
// CHECK: memref.view %[[ROW]][%[[ZERO:.*]]][] : memref<64xi8> to memref<1x15xf32>
// CHECK: %[[ALL:.*]] = memref.view %[[ROW]][%[[ZERO]]][] : memref<64xi8> to memref<16xf32>
// CHECK: linalg.fill ins(%{{.*}} : f32) outs(%[[ALL]] : memref<16xf32>)
// A large buffer: only the padding of its last line is zeroed (bytes 12292 to 24576).
// CHECK: %[[BIG:.*]] = memref.alloc() {alignment = 128 : i64} : memref<24576xi8>
// CHECK: memref.view %[[BIG]][%{{.*}}][] : memref<24576xi8> to memref<1023x3xf64>
// CHECK: %[[TAIL:.*]] = memref.view %[[BIG]][%{{.*}}][] : memref<24576xi8> to memref<3xf64>
// CHECK: linalg.fill ins(%{{.*}} : f64) outs(%[[TAIL]] : memref<3xf64>)
// Whole lines and large, integers, dynamic sizes: as they were.
// CHECK: memref.alloc() : memref<1024x16xf32>
// CHECK: memref.alloc() : memref<7xi32>
// CHECK: memref.alloc(%{{.*}}) : memref<?xf32>
// CHECK: memref.dealloc %[[ROW]] : memref<64xi8>
// CHECK: memref.dealloc %[[BIG]] : memref<24576xi8>
func.func @temporaries(%n: index) {
  %row = memref.alloc() {alignment = 64 : i64} : memref<1x15xf32>
  %big = memref.alloc() {alignment = 128 : i64} : memref<1023x3xf64>
  %lines = memref.alloc() : memref<1024x16xf32>
  %ints = memref.alloc() : memref<7xi32>
  %dynamic = memref.alloc(%n) : memref<?xf32>
  memref.dealloc %row : memref<1x15xf32>
  memref.dealloc %big : memref<1023x3xf64>
  memref.dealloc %lines : memref<1024x16xf32>
  memref.dealloc %ints : memref<7xi32>
  memref.dealloc %dynamic : memref<?xf32>
  return
}
