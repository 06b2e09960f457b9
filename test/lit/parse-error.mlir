// A malformed file gives file:line:col: error and exit status 1.
// RUN: not kope-opt %s 2>&1 | FileCheck %s
// CHECK: parse-error.mlir:8:23: error: use of undeclared SSA value name

func.func @broken(%a: tensor<4xf32>) -> tensor<4xf32> {
  // The next line names a value that does not exist.

  %0 = arith.addf %a, %missing : tensor<4xf32>
  return %0 : tensor<4xf32>
}
