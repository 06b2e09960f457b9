// An operator's outlined function returns only the results its caller uses, as the backend's
// Task of the same aten op does (amax lowers to a max with an argmax computed beside it).
// RUN: kope-opt --kope-outline-operators %s | FileCheck %s

// CHECK-LABEL: func.func @amax
// CHECK: %[[MAX:.*]] = call @kope_op_0(%{{.*}}) : (tensor<8x16xf32>) -> tensor<8xf32>
// CHECK: return %[[MAX]]
// CHECK-LABEL: func.func @both
// CHECK: %[[R:.*]]:2 = call @kope_op_1(%{{.*}}) : (tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xi64>)
// CHECK: return %[[R]]#0, %[[R]]#1
// CHECK-LABEL: func.func private @kope_op_0(%{{.*}}: tensor<8x16xf32>) -> tensor<8xf32>
// CHECK: %[[G:.*]]:2 = linalg.generic
// CHECK: return %[[G]]#0 : tensor<8xf32>
// CHECK-LABEL: func.func private @kope_op_1(%{{.*}}: tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xi64>)
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
func.func @amax(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %zero = arith.constant 0 : i64
  %ninf = arith.constant 0xFF800000 : f32
  %ei = tensor.empty() : tensor<8xi64>
  %fi = linalg.fill ins(%zero : i64) outs(%ei : tensor<8xi64>) -> tensor<8xi64>
  %ef = tensor.empty() : tensor<8xf32>
  %ff = linalg.fill ins(%ninf : f32) outs(%ef : tensor<8xf32>) -> tensor<8xf32>
  %r:2 = linalg.generic {indexing_maps = [#in, #out, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<8x16xf32>) outs(%ff, %fi : tensor<8xf32>, tensor<8xi64>) {
  ^bb0(%in: f32, %max: f32, %arg: i64):
    %j = linalg.index 1 : index
    %ji = arith.index_cast %j : index to i64
    %m = arith.maximumf %in, %max : f32
    %gt = arith.cmpf ogt, %in, %max : f32
    %a = arith.select %gt, %ji, %arg : i64
    linalg.yield %m, %a : f32, i64
  } -> (tensor<8xf32>, tensor<8xi64>)
  return %r#0 : tensor<8xf32>
}
func.func @both(%x: tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xi64>) {
  %zero = arith.constant 0 : i64
  %ninf = arith.constant 0xFF800000 : f32
  %ei = tensor.empty() : tensor<8xi64>
  %fi = linalg.fill ins(%zero : i64) outs(%ei : tensor<8xi64>) -> tensor<8xi64>
  %ef = tensor.empty() : tensor<8xf32>
  %ff = linalg.fill ins(%ninf : f32) outs(%ef : tensor<8xf32>) -> tensor<8xf32>
  %r:2 = linalg.generic {indexing_maps = [#in, #out, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<8x16xf32>) outs(%ff, %fi : tensor<8xf32>, tensor<8xi64>) {
  ^bb0(%in: f32, %max: f32, %arg: i64):
    %j = linalg.index 1 : index
    %ji = arith.index_cast %j : index to i64
    %m = arith.maximumf %in, %max : f32
    %gt = arith.cmpf ogt, %in, %max : f32
    %a = arith.select %gt, %ji, %arg : i64
    linalg.yield %m, %a : f32, i64
  } -> (tensor<8xf32>, tensor<8xi64>)
  return %r#0, %r#1 : tensor<8xf32>, tensor<8xi64>
}
