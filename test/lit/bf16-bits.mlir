// kope-bf16-bits: LLVM's x86 backend has no bf16 registers without AVX512-BF16; a bfloat value
// its vectorizers keep in a register (a splat of a broadcast row statistic) is rounded with a
// call of __truncsfbf2, which the JIT cannot resolve. After kope-emulate-bf16 bf16 values only
// move, so the values that only move become i16; an op that takes or makes bf16 otherwise (a
// constant, a call, a function's arguments and results) meets them through a bitcast.
// RUN: kope-opt --kope-bf16-bits %s | FileCheck %s

// A bf16 value loaded, splatted and stored (a broadcast), and the bitcasts of the emulated
// rounding, which fold away.
// CHECK-LABEL: llvm.func @broadcast
// CHECK: %[[X:.*]] = llvm.load %arg0 : !llvm.ptr -> i16
// CHECK: %[[P:.*]] = llvm.mlir.poison : vector<8xi16>
// CHECK: %[[V:.*]] = llvm.insertelement %[[X]], %[[P]][%{{.*}} : i32] : vector<8xi16>
// CHECK: %[[S:.*]] = llvm.shufflevector %[[V]], %[[P]] [0, 0, 0, 0, 0, 0, 0, 0] : vector<8xi16>
// CHECK: llvm.store %[[S]], %arg1 : vector<8xi16>, !llvm.ptr
// CHECK: %[[W:.*]] = llvm.zext %[[X]] : i16 to i32
// CHECK: llvm.store %[[X]], %arg1 : i16, !llvm.ptr
// CHECK-NOT: bf16
llvm.func @broadcast(%from: !llvm.ptr, %to: !llvm.ptr) {
  %zero = llvm.mlir.constant(0 : i32) : i32
  %x = llvm.load %from : !llvm.ptr -> bf16
  %poison = llvm.mlir.poison : vector<8xbf16>
  %one = llvm.insertelement %x, %poison[%zero : i32] : vector<8xbf16>
  %splat = llvm.shufflevector %one, %poison [0, 0, 0, 0, 0, 0, 0, 0] : vector<8xbf16>
  llvm.store %splat, %to : vector<8xbf16>, !llvm.ptr
  %bits = llvm.bitcast %x : bf16 to i16
  %wide = llvm.zext %bits : i16 to i32
  %back = llvm.bitcast %bits : i16 to bf16
  llvm.store %back, %to : bf16, !llvm.ptr
  llvm.return
}

// Values passed to a block (phis) and selected between move too; constants, n-D vector
// constants (LLVM arrays) included, are cast where they meet them.
// CHECK-LABEL: llvm.func @branches_and_constants
// CHECK: %[[C:.*]] = llvm.mlir.constant(1.000000e+00 : bf16) : bf16
// CHECK: %[[A:.*]] = llvm.mlir.constant(dense<2.000000e+00> : vector<2x4xbf16>) : !llvm.array<2 x vector<4xbf16>>
// CHECK: %[[CB:.*]] = llvm.bitcast %[[C]] : bf16 to i16
// CHECK: llvm.cond_br %arg1, ^bb1(%[[CB]] : i16), ^bb1(%{{.*}} : i16)
// CHECK: ^bb1(%[[Y:.*]]: i16):
// CHECK: llvm.select %arg1, %[[Y]], %{{.*}} : i1, i16
// CHECK: %[[R0:.*]] = llvm.extractvalue %[[A]][0] : !llvm.array<2 x vector<4xbf16>>
// CHECK: %[[B0:.*]] = llvm.bitcast %[[R0]] : vector<4xbf16> to vector<4xi16>
// CHECK: llvm.insertvalue %[[B0]], %{{.*}}[0] : !llvm.array<2 x vector<4xi16>>
// CHECK: llvm.store %{{.*}}, %arg0 : !llvm.array<2 x vector<4xi16>>, !llvm.ptr
llvm.func @branches_and_constants(%p: !llvm.ptr, %c: i1) {
  %one = llvm.mlir.constant(1.0 : bf16) : bf16
  %twos = llvm.mlir.constant(dense<2.0> : vector<2x4xbf16>) : !llvm.array<2 x vector<4xbf16>>
  %x = llvm.load %p : !llvm.ptr -> bf16
  llvm.cond_br %c, ^next(%one : bf16), ^next(%x : bf16)
^next(%y: bf16):
  %z = llvm.select %c, %y, %x : i1, bf16
  llvm.store %z, %p : bf16, !llvm.ptr
  llvm.store %twos, %p : !llvm.array<2 x vector<4xbf16>>, !llvm.ptr
  llvm.return
}

// A function whose signature holds bf16 keeps it: its argument is cast to i16 where it meets
// a move, and a moved value back to bf16 where the function returns it.
// CHECK-LABEL: llvm.func @signature(%arg0: !llvm.ptr, %arg1: bf16) -> bf16
// CHECK: %[[I:.*]] = llvm.bitcast %arg1 : bf16 to i16
// CHECK: llvm.store %[[I]], %arg0 : i16, !llvm.ptr
// CHECK: %[[L:.*]] = llvm.load %arg0 : !llvm.ptr -> i16
// CHECK: %[[O:.*]] = llvm.bitcast %[[L]] : i16 to bf16
// CHECK: llvm.return %[[O]] : bf16
llvm.func @signature(%p: !llvm.ptr, %x: bf16) -> bf16 {
  llvm.store %x, %p : bf16, !llvm.ptr
  %y = llvm.load %p : !llvm.ptr -> bf16
  llvm.return %y : bf16
}

// Values without bf16 are left as they are.
// CHECK-LABEL: llvm.func @f32
// CHECK: llvm.load %arg0 : !llvm.ptr -> f32
llvm.func @f32(%p: !llvm.ptr) -> f32 {
  %x = llvm.load %p : !llvm.ptr -> f32
  llvm.return %x : f32
}

// Literal structs holding bf16 take i16 fields.
// CHECK-LABEL: llvm.func @structs
// CHECK: %[[S:.*]] = llvm.load %arg0 : !llvm.ptr -> !llvm.struct<(i16, f32)>
// CHECK: llvm.extractvalue %[[S]][0] : !llvm.struct<(i16, f32)>
llvm.func @structs(%p: !llvm.ptr) {
  %s = llvm.load %p : !llvm.ptr -> !llvm.struct<(bf16, f32)>
  %x = llvm.extractvalue %s[0] : !llvm.struct<(bf16, f32)>
  llvm.store %x, %p : bf16, !llvm.ptr
  llvm.return
}
