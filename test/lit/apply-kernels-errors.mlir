// Bad options and a missing store are errors that say what to do; nothing is created.
// RUN: rm -rf %t && mkdir -p %t

// RUN: not kope-opt --kope-apply-kernels="store=%t/store target=tpu" %s 2>&1 | FileCheck %s --check-prefix=TARGET
// TARGET: pass 'kope-apply-kernels' option target='tpu' is not a known target; known targets: ascend, cpu, cuda

// RUN: not kope-opt --kope-apply-kernels="store=%t/store color=red" %s 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: pass 'kope-apply-kernels' has no option 'color'; its options are: store, target

// RUN: not kope-opt --kope-apply-kernels="store=%t/nowhere" %s 2>&1 | FileCheck %s --check-prefix=STORE
// RUN: not kope-opt --kope-annotate-experience="store=%t/nowhere" %s 2>&1 | FileCheck %s --check-prefix=STORE
// RUN: env KOPE_HOME=%t/nowhere not kope-opt --kope-apply-kernels %s 2>&1 | FileCheck %s --check-prefix=STORE
// STORE: apply-kernels-errors.mlir{{(:[0-9]+:[0-9]+)?}}: error: kope-{{apply-kernels|annotate-experience}}: no experience store at {{.*}}nowhere: the directory does not exist
// RUN: not ls %t/nowhere

// RUN: not kope-opt --kope-annotate-experience="store=%t/store target=cpu" %s 2>&1 | FileCheck %s --check-prefix=ANNOTATE
// ANNOTATE: pass 'kope-annotate-experience' has no option 'target'; its options are: store
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
