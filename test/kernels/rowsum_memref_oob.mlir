// A correct row sum that also writes one element past the end of its destination.
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out : memref<8xf32>)
  linalg.reduce ins(%in : memref<8x16xf32>) outs(%out : memref<8xf32>) dimensions = [1]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  %c8 = arith.constant 8 : index
  memref.store %zero, %out[%c8] : memref<8xf32>
  return
}
