// Unknown passes and options are errors that list what exists.
// RUN: not kope-opt --kope-outline-operator %s 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: unknown KOPE pass 'kope-outline-operator'; KOPE passes are: {{.*}}kope-outline-operators

// RUN: not kope-opt --kope-outline-operators="tgt=cpu" %s 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: pass 'kope-outline-operators' has no option 'tgt'; its options are: target

// RUN: not kope-opt --kope-outline-operators="target=tpu" %s 2>&1 | FileCheck %s --check-prefix=TARGET
// TARGET: pass 'kope-outline-operators' option target='tpu' is not a known target; known targets: ascend, cpu, cuda

// RUN: not kope-opt --pass-pipeline="builtin.module(kope-lower-cpu)" --canonicalize %s 2>&1 | FileCheck %s --check-prefix=BOTH
// BOTH: either with --pass-pipeline or as flags, not both

// RUN: kope-opt --pass-pipeline="builtin.module(kope-outline-operators,canonicalize,func.func(cse))" %s | FileCheck %s --check-prefix=MIXED
// MIXED: func.func private @kope_op_0
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %0 = linalg.copy ins(%a : tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
