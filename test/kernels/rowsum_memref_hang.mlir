// A correct row sum, then a loop that never ends (its store keeps the optimizer from
// deleting it).
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out : memref<8xf32>)
  linalg.reduce ins(%in : memref<8x16xf32>) outs(%out : memref<8xf32>) dimensions = [1]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  %true = arith.constant true
  scf.while : () -> () {
    scf.condition(%true)
  } do {
    %v = memref.load %out[%c0] : memref<8xf32>
    %w = arith.addf %v, %one : f32
    memref.store %w, %out[%c0] : memref<8xf32>
    scf.yield
  }
  return
}
