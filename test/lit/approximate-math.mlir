// kope-approximate-math rewrites f32 math.exp, math.erf and math.tanh (scalars and vectors) as
// polynomials in arith/math.fma ops; other element types keep their libm calls.
// RUN: kope-opt --kope-approximate-math %s | FileCheck %s

// exp: range reduction by log2(e) (Cephes), a polynomial, 2^n built from the exponent bits,
// and the overflow/underflow limits.
// CHECK-LABEL: func.func @exp
// CHECK-NOT: math.exp
// CHECK: arith.constant 1.44269502 : f32
// CHECK: math.floor
// CHECK: math.fma
// CHECK: arith.shli
// CHECK: arith.bitcast {{.*}} : i32 to f32
// CHECK: arith.constant 88.7228394 : f32
// CHECK: arith.constant 0x7F800000 : f32
// CHECK: arith.select
// CHECK: return
func.func @exp(%x: f32) -> f32 {
  %e = math.exp %x : f32
  return %e : f32
}

// erf: Abramowitz-Stegun 7.1.26, its sign restored at the end.
// CHECK-LABEL: func.func @erf
// CHECK-NOT: math.erf
// CHECK: math.absf
// CHECK: arith.constant 0.327591091 : f32
// CHECK: arith.divf
// CHECK: return
func.func @erf(%x: f32) -> f32 {
  %r = math.erf %x : f32
  return %r : f32
}

// CHECK-LABEL: func.func @tanh
// CHECK-NOT: math.tanh
// CHECK-NOT: math.exp
// CHECK: return
func.func @tanh(%x: f32) -> f32 {
  %t = math.tanh %x : f32
  return %t : f32
}

// Vectors get splat constants of the same shape.
// CHECK-LABEL: func.func @vector
// CHECK-NOT: math.exp
// CHECK-DAG: arith.constant dense<1.44269502> : vector<8xf32>
// CHECK-DAG: arith.constant dense<127> : vector<8xi32>
// CHECK: arith.bitcast {{.*}} : vector<8xi32> to vector<8xf32>
func.func @vector(%x: vector<8xf32>) -> vector<8xf32> {
  %e = math.exp %x : vector<8xf32>
  return %e : vector<8xf32>
}

// f64 (and anything else not f32) is left alone.
// CHECK-LABEL: func.func @double
// CHECK: math.exp %{{.*}} : f64
// CHECK: math.tanh %{{.*}} : f64
func.func @double(%x: f64) -> f64 {
  %e = math.exp %x : f64
  %t = math.tanh %e : f64
  return %t : f64
}

// A division by a constant becomes a product by its reciprocal (GELU's x / sqrt(2)); a
// division by a value, or by zero, stays.
// CHECK-LABEL: func.func @divisions
// CHECK: arith.mulf %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK: arith.divf %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK: arith.divf %{{.*}}, %{{.*}} : vector<8xf32>
func.func @divisions(%x: vector<8xf32>, %y: vector<8xf32>) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>) {
  %sqrt2 = arith.constant dense<1.41421354> : vector<8xf32>
  %zero = arith.constant dense<0.0> : vector<8xf32>
  %a = arith.divf %x, %sqrt2 : vector<8xf32>
  %b = arith.divf %x, %y : vector<8xf32>
  %c = arith.divf %x, %zero : vector<8xf32>
  return %a, %b, %c : vector<8xf32>, vector<8xf32>, vector<8xf32>
}

// An exp whose argument is never positive (`kope.nonpositive`, a score minus its row's
// maximum) has no overflow handling: no +Inf, and 2^n in one step.
// CHECK-LABEL: func.func @exp_nonpositive
// CHECK-NOT: math.exp
// CHECK-NOT: 0x7F800000
// CHECK-NOT: arith.shrsi
// CHECK: return
func.func @exp_nonpositive(%x: vector<8xf32>) -> vector<8xf32> {
  %e = math.exp %x {kope.nonpositive} : vector<8xf32>
  return %e : vector<8xf32>
}
