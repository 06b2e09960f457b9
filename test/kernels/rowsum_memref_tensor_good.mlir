// A correct row sum in the memref form, written as tensor code between the memrefs (the
// to_tensor / materialize_in_destination bridge the prompt describes).
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8xf32>) {
  %zero = arith.constant 0.0 : f32
  %x = bufferization.to_tensor %in restrict : memref<8x16xf32> to tensor<8x16xf32>
  %e = tensor.empty() : tensor<8xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<8xf32>) -> tensor<8xf32>
  %r = linalg.reduce ins(%x : tensor<8x16xf32>) outs(%init : tensor<8xf32>) dimensions = [1]
    (%a: f32, %acc: f32) {
      %s = arith.addf %a, %acc : f32
      linalg.yield %s : f32
    }
  bufferization.materialize_in_destination %r in restrict writable %out
      : (tensor<8xf32>, memref<8xf32>) -> ()
  return
}
