// A kernel without @main.
func.func @other(%a: tensor<1x2xf32>, %b: tensor<2x3xf32>) -> tensor<1x3xf32> {
  %e = tensor.empty() : tensor<1x3xf32>
  return %e : tensor<1x3xf32>
}
