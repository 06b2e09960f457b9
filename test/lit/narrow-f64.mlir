// kope-narrow-f64 computes in f32 the f64 intermediates of a function of f32 tensors, as
// torch-mlir's variance has them; a function with f64 arguments or results keeps its f64.
// RUN: kope-opt --split-input-file --verify-diagnostics --kope-narrow-f64 %s | FileCheck %s

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
#id = affine_map<(d0) -> (d0)>
// CHECK-LABEL: func.func @variance
// CHECK-NOT: f64
// CHECK-NOT: arith.extf
// CHECK-NOT: arith.truncf
// CHECK: arith.constant 6.400000e+01 : f32
// CHECK: tensor.empty() : tensor<4x64xf32>
// CHECK: arith.divf {{.*}} : f32
// CHECK: return {{.*}} : tensor<4xf32>
func.func @variance(%x: tensor<4x64xf32>) -> tensor<4xf32> {
  %zero = arith.constant 0.0 : f64
  %n = arith.constant 64.0 : f64
  %wide_empty = tensor.empty() : tensor<4x64xf64>
  %wide = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x64xf32>) outs(%wide_empty : tensor<4x64xf64>) {
  ^bb0(%in: f32, %out: f64):
    %e = arith.extf %in : f32 to f64
    linalg.yield %e : f64
  } -> tensor<4x64xf64>
  %acc_empty = tensor.empty() : tensor<4xf64>
  %acc = linalg.fill ins(%zero : f64) outs(%acc_empty : tensor<4xf64>) -> tensor<4xf64>
  %sum = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%wide : tensor<4x64xf64>) outs(%acc : tensor<4xf64>) {
  ^bb0(%in: f64, %out: f64):
    %s = arith.addf %in, %out : f64
    linalg.yield %s : f64
  } -> tensor<4xf64>
  %out_empty = tensor.empty() : tensor<4xf32>
  %mean = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%sum : tensor<4xf64>) outs(%out_empty : tensor<4xf32>) {
  ^bb0(%in: f64, %out: f32):
    %d = arith.divf %in, %n : f64
    %t = arith.truncf %d : f64 to f32
    linalg.yield %t : f32
  } -> tensor<4xf32>
  return %mean : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @wide_result
// CHECK: arith.extf {{.*}} : f32 to f64
// CHECK: return {{.*}} : f64
// expected-warning @+1 {{kope-narrow-f64: f64 arguments or results: the f64 arithmetic is kept}}
func.func @wide_result(%x: f32) -> f64 {
  %e = arith.extf %x : f32 to f64
  return %e : f64
}
