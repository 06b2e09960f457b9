// kope-approximate-math rewrites f32 math.exp, expm1, erf, tanh, log and log1p (scalars and vectors) as
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

// log: the exponent and mantissa split from the bits (a subnormal scaled by 2^23 first), a
// polynomial in m - 1 (Cephes), and -inf, +inf and NaN where IEEE puts them.
// CHECK-LABEL: func.func @log
// CHECK-NOT: math.log
// CHECK: arith.shrui
// CHECK: arith.andi
// CHECK: arith.sitofp
// CHECK: math.fma
// CHECK: arith.constant 0xFF800000 : f32
// CHECK: arith.cmpf ult
// CHECK: return
func.func @log(%x: f32) -> f32 {
  %l = math.log %x : f32
  return %l : f32
}

// log1p: log of 1 + x, times the correction x / ((1 + x) - 1); x itself where 1 + x is 1.
// CHECK-LABEL: func.func @log1p
// CHECK-NOT: math.log
// CHECK: arith.divf
// CHECK: arith.cmpf oeq
// CHECK: return
func.func @log1p(%x: vector<8xf32>) -> vector<8xf32> {
  %l = math.log1p %x : vector<8xf32>
  return %l : vector<8xf32>
}

// expm1: exp's reduction, 2^n q + (2^n - 1) in one fma, -1 below the range.
// CHECK-LABEL: func.func @expm1
// CHECK-NOT: math.exp
// CHECK: math.fma
// CHECK: arith.constant -8.800000e+01 : f32
// CHECK: return
func.func @expm1(%x: f32) -> f32 {
  %e = math.expm1 %x : f32
  return %e : f32
}

// An op on values that do not change along the innermost loop (log-softmax's log of its row's
// sum, fused into the loop over every element) keeps its libm call: vectorized, LLVM computes
// it once from a splat, where a polynomial would be computed across the whole vector.
// CHECK-LABEL: func.func @log_of_a_row
// CHECK: math.log %{{.*}} : f32
// CHECK-NOT: math.log
// CHECK: return
#row = affine_map<(d0, d1) -> (d0)>
#all = affine_map<(d0, d1) -> (d0, d1)>
func.func @log_of_a_row(%x: tensor<4x8xf32>, %s: tensor<4xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %r = linalg.generic {indexing_maps = [#all, #row, #all], iterator_types = ["parallel", "parallel"]}
      ins(%x, %s : tensor<4x8xf32>, tensor<4xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %l = math.log %b : f32
    %m = math.log %a : f32
    %d = arith.subf %m, %l : f32
    linalg.yield %d : f32
  } -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// softplus's log1p(exp(-|x|)) changes along the row through a chain of ops: both rewritten.
// CHECK-LABEL: func.func @softplus_chain
// CHECK-NOT: math.exp
// CHECK-NOT: math.log1p
// CHECK: return
func.func @softplus_chain(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %r = linalg.generic {indexing_maps = [#all, #all], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %abs = math.absf %a : f32
    %neg = arith.negf %abs : f32
    %exp = math.exp %neg : f32
    %l = math.log1p %exp : f32
    linalg.yield %l : f32
  } -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
