// kope-expand-powers rewrites integer powers: by a constant exponent (scalar, splat or
// broadcast) into multiplications by repeated squaring, lowest bit first; a negative exponent
// takes the reciprocal (floats only); a vector fpowi by a variable exponent becomes powf.
// RUN: kope-opt --kope-expand-powers %s | FileCheck %s

// x^2 on a vector: the exponent a splat constant, as the vectorizer leaves it. Before this
// pass it lowered to an invalid llvm.intr.powi with a vector<8xi64> exponent.
// CHECK-LABEL: func.func @square_vector
// CHECK-NOT: math.fpowi
// CHECK: %[[S:.*]] = arith.mulf %arg0, %arg0 : vector<8xf32>
// CHECK: return %[[S]]
func.func @square_vector(%x: vector<8xf32>) -> vector<8xf32> {
  %c = arith.constant dense<2> : vector<8xi64>
  %p = math.fpowi %x, %c : vector<8xf32>, vector<8xi64>
  return %p : vector<8xf32>
}

// x^5 = x * (x^2)^2, from a broadcast scalar constant.
// CHECK-LABEL: func.func @fifth_broadcast
// CHECK-NOT: math.fpowi
// CHECK: %[[X2:.*]] = arith.mulf %arg0, %arg0
// CHECK: %[[X4:.*]] = arith.mulf %[[X2]], %[[X2]]
// CHECK: %[[X5:.*]] = arith.mulf %arg0, %[[X4]]
// CHECK: return %[[X5]]
func.func @fifth_broadcast(%x: vector<4xf32>) -> vector<4xf32> {
  %c = arith.constant 5 : i32
  %b = vector.broadcast %c : i32 to vector<4xi32>
  %p = math.fpowi %x, %b : vector<4xf32>, vector<4xi32>
  return %p : vector<4xf32>
}

// x^-2 = 1 / (x * x); x^0 = 1 (also for NaN, as powi says).
// CHECK-LABEL: func.func @negative_and_zero
// CHECK-NOT: math.fpowi
// CHECK: %[[X2:.*]] = arith.mulf %arg0, %arg0 : f32
// CHECK: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: %[[R:.*]] = arith.divf %[[ONE]], %[[X2]] : f32
// CHECK: %[[ONE0:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: return %[[R]], %[[ONE0]]
func.func @negative_and_zero(%x: f32) -> (f32, f32) {
  %m2 = arith.constant -2 : i64
  %z = arith.constant 0 : i64
  %a = math.fpowi %x, %m2 : f32, i64
  %b = math.fpowi %x, %z : f32, i64
  return %a, %b : f32, f32
}

// Integer powers become muli chains (math.ipowi has no LLVM lowering); by a negative
// exponent they are left alone.
// CHECK-LABEL: func.func @integer
// CHECK: %[[I2:.*]] = arith.muli %arg0, %arg0 : vector<8xi32>
// CHECK: %[[I3:.*]] = arith.muli %arg0, %[[I2]] : vector<8xi32>
// CHECK: math.ipowi %arg1, %{{.*}} : i32
// CHECK: return %[[I3]]
func.func @integer(%x: vector<8xi32>, %y: i32) -> (vector<8xi32>, i32) {
  %c = arith.constant dense<3> : vector<8xi32>
  %p = math.ipowi %x, %c : vector<8xi32>
  %m = arith.constant -1 : i32
  %q = math.ipowi %y, %m : i32
  return %p, %q : vector<8xi32>, i32
}

// A variable exponent: vectors take powf (which lowers lane by lane); scalars keep fpowi,
// which lowers to llvm.intr.powi.
// CHECK-LABEL: func.func @variable
// CHECK: %[[F:.*]] = arith.sitofp %arg2 : vector<8xi64> to vector<8xf32>
// CHECK: math.powf %arg0, %[[F]] : vector<8xf32>
// CHECK: math.fpowi %arg1, %arg3 : f32, i64
func.func @variable(%x: vector<8xf32>, %y: f32, %n: vector<8xi64>, %m: i64) -> (vector<8xf32>, f32) {
  %a = math.fpowi %x, %n : vector<8xf32>, vector<8xi64>
  %b = math.fpowi %y, %m : f32, i64
  return %a, %b : vector<8xf32>, f32
}
