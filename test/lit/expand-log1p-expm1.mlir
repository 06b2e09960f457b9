// kope-expand-log1p-expm1 rewrites math.log1p and math.expm1, which math-to-llvm would
// compute as log(1 + x) and exp(x) - 1, into log and exp with the corrections exact near 0,
// on scalars and vectors alike.
// RUN: kope-opt --kope-expand-log1p-expm1 %s | FileCheck %s

// CHECK-LABEL: func.func @log1p_vector
// CHECK-NOT: math.log1p
// CHECK: %[[U:.*]] = arith.addf %arg0, %{{.*}} : vector<8xf32>
// CHECK: %[[D:.*]] = arith.subf %[[U]], %{{.*}} : vector<8xf32>
// CHECK: %[[L:.*]] = math.log %[[U]] : vector<8xf32>
// CHECK: %[[Q:.*]] = arith.divf %arg0, %[[D]] : vector<8xf32>
// CHECK: arith.mulf %[[L]], %[[Q]] : vector<8xf32>
// CHECK: arith.cmpf oeq, %[[D]]
func.func @log1p_vector(%x: vector<8xf32>) -> vector<8xf32> {
  %y = math.log1p %x : vector<8xf32>
  return %y : vector<8xf32>
}

// CHECK-LABEL: func.func @expm1_scalar
// CHECK-NOT: math.expm1
// CHECK: %[[U:.*]] = math.exp %arg0 : f64
// CHECK: %[[M:.*]] = arith.subf %[[U]], %{{.*}} : f64
// CHECK: %[[L:.*]] = math.log %[[U]] : f64
// CHECK: %[[Q:.*]] = arith.divf %arg0, %[[L]] : f64
// CHECK: arith.mulf %[[M]], %[[Q]] : f64
func.func @expm1_scalar(%x: f64) -> f64 {
  %y = math.expm1 %x : f64
  return %y : f64
}
