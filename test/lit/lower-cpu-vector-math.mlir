// RUN: kope-opt --kope-lower-cpu %s | FileCheck %s

// An exact erf on a 2-D vector (a GELU tile of a schedule without polynomial math, or of bf16,
// which has none) has no LLVM intrinsic: libm lowers it to one erff call per lane, unrolled
// through vector.extract and vector.insert, which the vector lowering after it must still
// lower. Before, they reached LLVM translation with unrealized casts and the kernel failed to
// build ("LLVM Translation failed for operation: omp.wsloop" when threaded).
// CHECK-LABEL: llvm.func @kope_kernel
// CHECK-COUNT-16: llvm.call @erff
// CHECK-NOT: vector.
// CHECK-NOT: unrealized_conversion_cast
func.func @main(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %c0 = arith.constant 0 : index
  %pad = arith.constant 0.0 : f32
  %v = vector.transfer_read %x[%c0, %c0], %pad {in_bounds = [true, true]} : tensor<2x8xf32>, vector<2x8xf32>
  %e = math.erf %v : vector<2x8xf32>
  %empty = tensor.empty() : tensor<2x8xf32>
  %y = vector.transfer_write %e, %empty[%c0, %c0] {in_bounds = [true, true]} : vector<2x8xf32>, tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}
