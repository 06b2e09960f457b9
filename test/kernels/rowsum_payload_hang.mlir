// The payload form (@main on tensors) with a loop that never ends: each turn rewrites one
// element of the tensor it carries, so no pass may delete it.
module {
  func.func @main(%arg0: tensor<8x16xf32>) -> tensor<8xf32> {
    %c0 = arith.constant 0 : index
    %one = arith.constant 1.0 : f32
    %true = arith.constant true
    %cst = arith.constant 0.000000e+00 : f32
    %0 = tensor.empty() : tensor<8xf32>
    %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<8xf32>) -> tensor<8xf32>
    %2 = scf.while (%t = %1) : (tensor<8xf32>) -> tensor<8xf32> {
      scf.condition(%true) %t : tensor<8xf32>
    } do {
    ^bb0(%t: tensor<8xf32>):
      %v = tensor.extract %t[%c0] : tensor<8xf32>
      %w = arith.addf %v, %one : f32
      %u = tensor.insert %w into %t[%c0] : tensor<8xf32>
      scf.yield %u : tensor<8xf32>
    }
    return %2 : tensor<8xf32>
  }
}
