// A kernel whose schedule fails: a function is not a tileable operation.
module attributes {transform.with_named_sequence} {
  func.func @main(%a: tensor<3x5xf32>, %b: tensor<5x7xf32>) -> tensor<3x7xf32> {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<3x7xf32>
    %init = linalg.fill ins(%zero : f32) outs(%e : tensor<3x7xf32>) -> tensor<3x7xf32>
    %r = linalg.matmul ins(%a, %b : tensor<3x5xf32>, tensor<5x7xf32>) outs(%init : tensor<3x7xf32>) -> tensor<3x7xf32>
    return %r : tensor<3x7xf32>
  }
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    %tiled, %loops = transform.structured.tile_using_for %func tile_sizes [2] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
