// A kernel whose @main does not have the signature of the operator it is recorded for.
func.func @main(%a: tensor<4x4xf32>) -> tensor<4x4xf32> {
  return %a : tensor<4x4xf32>
}
