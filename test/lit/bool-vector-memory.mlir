// kope-bool-vector-memory: a memref of i1 holds one byte per element, but LLVM packs a vector
// of i1 into bits, so a vectorized isnan/comparison stored 4 bytes of bits where 32 bytes
// were meant. Vector loads and stores of i1 go through i8 vectors instead; scalar ones, other
// element types, and memory whose elements are themselves vectors are left alone.
// RUN: kope-opt --kope-bool-vector-memory %s | FileCheck %s

// CHECK-LABEL: llvm.func @store_and_load
// CHECK: %[[W:.*]] = llvm.zext %arg1 : vector<32xi1> to vector<32xi8>
// CHECK: llvm.store %[[W]], %{{.*}} {alignment = 1 : i64} : vector<32xi8>, !llvm.ptr
// CHECK: %[[B:.*]] = llvm.load %{{.*}} {alignment = 1 : i64} : !llvm.ptr -> vector<16xi8>
// CHECK: %[[N:.*]] = llvm.trunc %[[B]] : vector<16xi8> to vector<16xi1>
// CHECK: llvm.store %arg2, %{{.*}} : i1, !llvm.ptr
// CHECK: llvm.store %arg3, %{{.*}} : vector<8xf32>, !llvm.ptr
// CHECK: llvm.return %[[N]]
llvm.func @store_and_load(%base: !llvm.ptr, %v: vector<32xi1>, %s: i1, %f: vector<8xf32>, %i: i64) -> vector<16xi1> {
  %p = llvm.getelementptr %base[%i] : (!llvm.ptr, i64) -> !llvm.ptr, i1
  llvm.store %v, %p {alignment = 1 : i64} : vector<32xi1>, !llvm.ptr
  %l = llvm.load %p {alignment = 1 : i64} : !llvm.ptr -> vector<16xi1>
  llvm.store %s, %p : i1, !llvm.ptr
  llvm.store %f, %base : vector<8xf32>, !llvm.ptr
  llvm.return %l : vector<16xi1>
}

// Masked transfers of partial tiles: the pass-through is widened too.
// CHECK-LABEL: llvm.func @masked
// CHECK: %[[T:.*]] = llvm.zext %arg2 : vector<8xi1> to vector<8xi8>
// CHECK: %[[L:.*]] = llvm.intr.masked.load %arg0, %arg1, %[[T]] {alignment = 1 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xi8>) -> vector<8xi8>
// CHECK: %[[V:.*]] = llvm.trunc %[[L]] : vector<8xi8> to vector<8xi1>
// CHECK: %[[S:.*]] = llvm.zext %[[V]] : vector<8xi1> to vector<8xi8>
// CHECK: llvm.intr.masked.store %[[S]], %arg0, %arg1 {alignment = 1 : i32} : vector<8xi8>, vector<8xi1> into !llvm.ptr
llvm.func @masked(%p: !llvm.ptr, %mask: vector<8xi1>, %pass: vector<8xi1>) {
  %l = llvm.intr.masked.load %p, %mask, %pass {alignment = 1 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xi1>) -> vector<8xi1>
  llvm.intr.masked.store %l, %p, %mask {alignment = 1 : i32} : vector<8xi1>, vector<8xi1> into !llvm.ptr
  llvm.return
}

// Memory of vector elements is bit-packed on both sides: left alone.
// CHECK-LABEL: llvm.func @packed
// CHECK: llvm.store %arg1, %{{.*}} : vector<32xi1>, !llvm.ptr
llvm.func @packed(%base: !llvm.ptr, %v: vector<32xi1>, %i: i64) {
  %p = llvm.getelementptr %base[%i] : (!llvm.ptr, i64) -> !llvm.ptr, vector<32xi1>
  llvm.store %v, %p : vector<32xi1>, !llvm.ptr
  llvm.return
}
