// A memref-level kernel in destination-passing form: it cannot replace a function on tensors.
func.func @kope_kernel(%a: memref<2x3xf32>, %b: memref<3x4xf32>, %c: memref<2x4xf32>) attributes {llvm.emit_c_interface} {
  linalg.matmul ins(%a, %b : memref<2x3xf32>, memref<3x4xf32>) outs(%c : memref<2x4xf32>)
  return
}
