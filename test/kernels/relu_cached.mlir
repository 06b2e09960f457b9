// A relu that computes its first 8 calls (verification runs it 4 times), then returns the
// result it kept from the 8th whatever its input: the cached-result cheat of public kernel
// benchmarks. Only timing on fresh inputs, checked after timing, can catch it.
#map = affine_map<(d0, d1) -> (d0, d1)>
memref.global "private" @calls : memref<i64> = dense<0>
memref.global "private" @kept : memref<8x16xf32> = dense<0.0>
func.func @kope_kernel(%in: memref<8x16xf32>, %out: memref<8x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1 : i64
  %honest_calls = arith.constant 8 : i64
  %count = memref.get_global @calls : memref<i64>
  %kept = memref.get_global @kept : memref<8x16xf32>
  %n = memref.load %count[] : memref<i64>
  %next = arith.addi %n, %one : i64
  memref.store %next, %count[] : memref<i64>
  %honest = arith.cmpi slt, %n, %honest_calls : i64
  scf.if %honest {
    linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
        ins(%in : memref<8x16xf32>) outs(%out : memref<8x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %r = arith.maximumf %x, %zero : f32
      linalg.yield %r : f32
    }
    memref.copy %out, %kept : memref<8x16xf32> to memref<8x16xf32>
  } else {
    memref.copy %kept, %out : memref<8x16xf32> to memref<8x16xf32>
  }
  return
}
