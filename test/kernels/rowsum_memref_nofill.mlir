// The row sum without its linalg.fill: it accumulates into whatever the destination held.
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8xf32>) {
  linalg.reduce ins(%in : memref<8x16xf32>) outs(%out : memref<8xf32>) dimensions = [1]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  return
}
