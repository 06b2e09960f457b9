// A correct row sum in the memref form the LLM prompt offers: fill the destination, reduce
// into it; no attributes (KOPE gives @kope_kernel its C interface).
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out : memref<8xf32>)
  linalg.reduce ins(%in : memref<8x16xf32>) outs(%out : memref<8xf32>) dimensions = [1]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  return
}
