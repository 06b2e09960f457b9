// RUN: kope-opt --kope-refine-reshapes %s | FileCheck %s
// RUN: kope-opt --kope-refine-reshapes --linalg-fuse-elementwise-ops --canonicalize %s | FileCheck %s --check-prefix=FUSED

// Group norm's regrouping: (batch, groups, channels x positions) collapsed and expanded to
// NCHW. Rewritten through the common refinement (batch, groups, channels per group, h, w).
// CHECK-LABEL: func.func @regroup
// CHECK: %[[S:.*]] = linalg.generic
// CHECK-NOT: tensor.collapse_shape %[[S]]
// CHECK: %[[E:.*]] = tensor.expand_shape %[[S]] {{\[\[}}0], [1], [2, 3, 4]] output_shape [2, 4, 3, 4, 4] : tensor<2x4x48xf32> into tensor<2x4x3x4x4xf32>
// CHECK: %[[C:.*]] = tensor.collapse_shape %[[E]] {{\[\[}}0], [1, 2], [3], [4]] : tensor<2x4x3x4x4xf32> into tensor<2x12x4x4xf32>
// CHECK: linalg.generic {{.*}} ins(%[[C]] : tensor<2x12x4x4xf32>)
// The elementwise ops on both sides lifted to the refined shape: no reshape between them.
// FUSED-LABEL: func.func @regroup
// FUSED: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]
// FUSED-SAME: tensor<2x4x3x4x4xf32>
// FUSED: tensor.collapse_shape {{.*}} : tensor<2x4x3x4x4xf32> into tensor<2x12x4x4xf32>
func.func @regroup(%x: tensor<2x4x48xf32>) -> tensor<2x12x4x4xf32> {
  %e = tensor.empty() : tensor<2x4x48xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, j, k)>, affine_map<(i, j, k) -> (i, j, k)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x : tensor<2x4x48xf32>) outs(%e : tensor<2x4x48xf32>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  } -> tensor<2x4x48xf32>
  %c = tensor.collapse_shape %s [[0], [1, 2]] : tensor<2x4x48xf32> into tensor<2x192xf32>
  %n = tensor.expand_shape %c [[0], [1, 2, 3]] output_shape [2, 12, 4, 4] : tensor<2x192xf32> into tensor<2x12x4x4xf32>
  %e2 = tensor.empty() : tensor<2x12x4x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j, k, l) -> (i, j, k, l)>, affine_map<(i, j, k, l) -> (i, j, k, l)>],
                       iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%n : tensor<2x12x4x4xf32>) outs(%e2 : tensor<2x12x4x4xf32>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.addf %a, %a : f32
    linalg.yield %m : f32
  } -> tensor<2x12x4x4xf32>
  return %r : tensor<2x12x4x4xf32>
}

// Dims that straddle each other without dividing (2x3 regrouped as 3x2) have no common
// refinement: left as they are.
// CHECK-LABEL: func.func @straddling
// CHECK: tensor.collapse_shape
// CHECK-NEXT: tensor.expand_shape
func.func @straddling(%x: tensor<2x3xf32>) -> tensor<3x2xf32> {
  %c = tensor.collapse_shape %x [[0, 1]] : tensor<2x3xf32> into tensor<6xf32>
  %n = tensor.expand_shape %c [[0, 1]] output_shape [3, 2] : tensor<6xf32> into tensor<3x2xf32>
  return %n : tensor<3x2xf32>
}

// A reshape read by two ops is cloned for the second (elementwise fusion expands an op
// through a reshape only where the reshape has one use).
// CHECK-LABEL: func.func @two_users
// CHECK-COUNT-2: tensor.collapse_shape %{{.*}} {{\[\[}}0, 1]] : tensor<2x3xf32> into tensor<6xf32>
func.func @two_users(%x: tensor<2x3xf32>) -> (tensor<6xf32>, tensor<6xf32>) {
  %c = tensor.collapse_shape %x [[0, 1]] : tensor<2x3xf32> into tensor<6xf32>
  %e = tensor.empty() : tensor<6xf32>
  %a = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%c : tensor<6xf32>) outs(%e : tensor<6xf32>) {
  ^bb0(%p: f32, %q: f32):
    %m = arith.mulf %p, %p : f32
    linalg.yield %m : f32
  } -> tensor<6xf32>
  %b = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%c : tensor<6xf32>) outs(%e : tensor<6xf32>) {
  ^bb0(%p: f32, %q: f32):
    %m = arith.addf %p, %p : f32
    linalg.yield %m : f32
  } -> tensor<6xf32>
  return %a, %b : tensor<6xf32>, tensor<6xf32>
}
