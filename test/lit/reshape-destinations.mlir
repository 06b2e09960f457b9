// RUN: kope-opt --kope-reshape-destinations %s | FileCheck %s

// A result written out through reshapes (group norm's groups expanded back to NCHW): its
// empty destination becomes the caller's buffer, reshaped back, so nothing is copied out.
// CHECK-LABEL: func.func @through_reshapes
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[OUT:.*]]: memref<1x2x2x6xf32>)
// CHECK: %[[D:.*]] = bufferization.to_tensor %[[OUT]] restrict writable : memref<1x2x2x6xf32> to tensor<1x2x2x6xf32>
// CHECK: %[[C:.*]] = tensor.collapse_shape %[[D]] {{\[\[}}0, 1], [2], [3]] : tensor<1x2x2x6xf32> into tensor<2x2x6xf32>
// CHECK: %[[F:.*]] = tensor.collapse_shape %[[C]] {{\[\[}}0, 1], [2]] : tensor<2x2x6xf32> into tensor<4x6xf32>
// CHECK-NOT: tensor.empty
// CHECK: linalg.generic {{.*}} outs(%[[F]] : tensor<4x6xf32>)
func.func @through_reshapes(%x: tensor<4x6xf32>, %out: memref<1x2x2x6xf32>) {
  %e = tensor.empty() : tensor<4x6xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x6xf32>) outs(%e : tensor<4x6xf32>) {
  ^bb0(%a: f32, %b: f32):
    %s = arith.mulf %a, %a : f32
    linalg.yield %s : f32
  } -> tensor<4x6xf32>
  %g = tensor.expand_shape %r [[0, 1], [2]] output_shape [2, 2, 6] : tensor<4x6xf32> into tensor<2x2x6xf32>
  %n = tensor.expand_shape %g [[0, 1], [2], [3]] output_shape [1, 2, 2, 6] : tensor<2x2x6xf32> into tensor<1x2x2x6xf32>
  bufferization.materialize_in_destination %n in restrict writable %out : (tensor<1x2x2x6xf32>, memref<1x2x2x6xf32>) -> ()
  return
}

// An empty tensor something else also starts from (CSE merges every empty tensor of one
// type) stays for the other; the destination's op gets the caller's buffer all the same.
// CHECK-LABEL: func.func @shared_empty
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[OUT:.*]]: memref<24xf32>)
// CHECK: %[[E:.*]] = tensor.empty() : tensor<4x6xf32>
// CHECK: %[[D:.*]] = bufferization.to_tensor %[[OUT]] restrict writable
// CHECK: %[[V:.*]] = tensor.expand_shape %[[D]]
// CHECK: linalg.copy ins(%[[X]] : tensor<4x6xf32>) outs(%[[V]] : tensor<4x6xf32>)
// CHECK: return %[[E]]
func.func @shared_empty(%x: tensor<4x6xf32>, %out: memref<24xf32>) -> tensor<4x6xf32> {
  %e = tensor.empty() : tensor<4x6xf32>
  %r = linalg.copy ins(%x : tensor<4x6xf32>) outs(%e : tensor<4x6xf32>) -> tensor<4x6xf32>
  %c = tensor.collapse_shape %r [[0, 1]] : tensor<4x6xf32> into tensor<24xf32>
  bufferization.materialize_in_destination %c in restrict writable %out : (tensor<24xf32>, memref<24xf32>) -> ()
  return %e : tensor<4x6xf32>
}
