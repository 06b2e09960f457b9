// RUN: kope-opt --kope-lower-cpu %s | FileCheck %s
// RUN: kope-opt --pass-pipeline="builtin.module(kope-lower-cpu)" %s | FileCheck %s

// A padded 2-D convolution copies into a padded buffer: the copy must not become a call to
// the memrefCopy runtime function, which the JIT does not provide.
// CHECK-NOT: memrefCopy
// CHECK-LABEL: llvm.func @kope_kernel
// CHECK-LABEL: llvm.func @_mlir_ciface_kope_kernel
// CHECK-NOT: memrefCopy
func.func @main(%x: tensor<1x2x5x5xf32>, %w: tensor<3x2x3x3xf32>) -> tensor<1x3x5x5xf32> {
  %zero = arith.constant 0.0 : f32
  %padded = tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %zero : f32
  } : tensor<1x2x5x5xf32> to tensor<1x2x7x7xf32>
  %e = tensor.empty() : tensor<1x3x5x5xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x3x5x5xf32>) -> tensor<1x3x5x5xf32>
  %y = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
      ins(%padded, %w : tensor<1x2x7x7xf32>, tensor<3x2x3x3xf32>) outs(%f : tensor<1x3x5x5xf32>) -> tensor<1x3x5x5xf32>
  return %y : tensor<1x3x5x5xf32>
}
