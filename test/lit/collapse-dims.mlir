// RUN: kope-opt --kope-collapse-dims --canonicalize %s | FileCheck %s

#id4 = affine_map<(n, c, h, w) -> (n, c, h, w)>
#chan = affine_map<(n, c, h, w) -> (c)>

// An activation over NCHW: every loop indexed alike, so one loop of 8*64*7*7.
// CHECK-LABEL: func.func @activation
// CHECK: tensor.collapse_shape %{{.*}} {{\[\[}}0, 1, 2, 3]] : tensor<8x64x7x7xf32> into tensor<25088xf32>
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel"]
// CHECK-SAME: outs(%{{.*}} : tensor<25088xf32>)
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0, 1, 2, 3]] output_shape [8, 64, 7, 7]
func.func @activation(%x: tensor<8x64x7x7xf32>) -> tensor<8x64x7x7xf32> {
  %e = tensor.empty() : tensor<8x64x7x7xf32>
  %r = linalg.generic {indexing_maps = [#id4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x : tensor<8x64x7x7xf32>) outs(%e : tensor<8x64x7x7xf32>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  } -> tensor<8x64x7x7xf32>
  return %r : tensor<8x64x7x7xf32>
}

// A per-channel scale (batch norm in eval mode) indexes the channel alone: height and width
// collapse, batch and channel stay.
// CHECK-LABEL: func.func @per_channel
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel"]
// CHECK-SAME: ins(%{{.*}}, %{{.*}} : tensor<8x64x49xf32>, tensor<64xf32>)
func.func @per_channel(%x: tensor<8x64x7x7xf32>, %s: tensor<64xf32>) -> tensor<8x64x7x7xf32> {
  %e = tensor.empty() : tensor<8x64x7x7xf32>
  %r = linalg.generic {indexing_maps = [#id4, #chan, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %s : tensor<8x64x7x7xf32>, tensor<64xf32>) outs(%e : tensor<8x64x7x7xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<8x64x7x7xf32>
  return %r : tensor<8x64x7x7xf32>
}

// A reduction over height and width (a global average pool's sum): the reduced loops
// collapse, the kept ones stay apart.
// CHECK-LABEL: func.func @pool
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]
// CHECK-SAME: ins(%{{.*}} : tensor<8x64x49xf32>)
func.func @pool(%x: tensor<8x64x7x7xf32>) -> tensor<8x64xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x64xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x64xf32>) -> tensor<8x64xf32>
  %r = linalg.generic {indexing_maps = [#id4, affine_map<(n, c, h, w) -> (n, c)>], iterator_types = ["parallel", "parallel", "reduction", "reduction"]}
      ins(%x : tensor<8x64x7x7xf32>) outs(%f : tensor<8x64xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<8x64xf32>
  return %r : tensor<8x64xf32>
}

// A producer and its consumer collapse alike, so nothing is reshaped between them: the
// squares (all parallel, which alone would become one loop) keep the rows that the
// row sums reducing them keep.
// CHECK-LABEL: func.func @agree
// CHECK: %[[SQ:.*]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK-SAME: outs(%{{.*}} : tensor<6x20xf32>)
// CHECK-NOT: tensor.expand_shape %[[SQ]]
// CHECK: linalg.generic {{.*}} ins(%[[SQ]] : tensor<6x20xf32>)
func.func @agree(%x: tensor<6x4x5xf32>) -> tensor<6xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<6x4x5xf32>
  %sq = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, j, k)>, affine_map<(i, j, k) -> (i, j, k)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x : tensor<6x4x5xf32>) outs(%e : tensor<6x4x5xf32>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  } -> tensor<6x4x5xf32>
  %e2 = tensor.empty() : tensor<6xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e2 : tensor<6xf32>) -> tensor<6xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, j, k)>, affine_map<(i, j, k) -> (i)>], iterator_types = ["parallel", "reduction", "reduction"]}
      ins(%sq : tensor<6x4x5xf32>) outs(%f : tensor<6xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<6xf32>
  return %r : tensor<6xf32>
}

// Transposed operands and bodies that read their indices are left as they are.
// CHECK-LABEL: func.func @left_alone
// CHECK-NOT: tensor.collapse_shape
// CHECK: linalg.index
// CHECK-NOT: tensor.collapse_shape
// CHECK: return
func.func @left_alone(%x: tensor<4x5x6xf32>, %y: tensor<4x6x5xf32>) -> (tensor<4x5x6xf32>, tensor<4x5x6xf32>) {
  %e = tensor.empty() : tensor<4x5x6xf32>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, k, j)>, affine_map<(i, j, k) -> (i, j, k)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%y : tensor<4x6x5xf32>) outs(%e : tensor<4x5x6xf32>) {
  ^bb0(%a: f32, %b: f32):
    linalg.yield %a : f32
  } -> tensor<4x5x6xf32>
  %i = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, j, k)>, affine_map<(i, j, k) -> (i, j, k)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x : tensor<4x5x6xf32>) outs(%e : tensor<4x5x6xf32>) {
  ^bb0(%a: f32, %b: f32):
    %k = linalg.index 2 : index
    %ki = arith.index_cast %k : index to i32
    %kf = arith.sitofp %ki : i32 to f32
    %m = arith.mulf %a, %kf : f32
    linalg.yield %m : f32
  } -> tensor<4x5x6xf32>
  return %t, %i : tensor<4x5x6xf32>, tensor<4x5x6xf32>
}
