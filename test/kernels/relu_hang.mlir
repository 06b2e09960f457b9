// Never returns: an infinite loop with a side effect the optimizer must keep.
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8x16xf32>) {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  %true = arith.constant true
  scf.while : () -> () {
    scf.condition(%true)
  } do {
    %x = memref.load %out[%c0, %c0] : memref<8x16xf32>
    %y = arith.addf %x, %one : f32
    memref.store %y, %out[%c0, %c0] : memref<8x16xf32>
    scf.yield
  }
  return
}
