// kope-optimize runs the agent on each outlined operator inside a pipeline: proposals are
// verified against the operator's own body (its reference lowering), timed against it, and
// recorded; kope-apply-kernels in the same pipeline then puts the winners in place. A second
// run over the same store searches no more (it may confirm again a figure that load
// disturbed), and an operator the target cannot take gets a warning and keeps its body.
// One thread, so that lit's other worker, on the other core, leaves the timings undisturbed.
// RUN: rm -rf %t
// RUN: env OMP_NUM_THREADS=1 kope-opt --pass-pipeline="builtin.module(kope-outline-operators,kope-optimize{agent=heuristic budget=2 store=%t},kope-apply-kernels{store=%t})" %s -o %t.first.mlir 2> %t.first.err
// RUN: FileCheck %s < %t.first.mlir
// RUN: FileCheck %s --check-prefix=WARN < %t.first.err
// RUN: kope memory export --store %t | %PYTHON %S/Inputs/searched_attempts.py > %t.searched1
// RUN: env OMP_NUM_THREADS=1 kope-opt --pass-pipeline="builtin.module(kope-outline-operators,kope-optimize{agent=heuristic budget=2 store=%t},kope-apply-kernels{store=%t})" %s 2>/dev/null | FileCheck %s
// RUN: kope memory export --store %t | %PYTHON %S/Inputs/searched_attempts.py > %t.searched2
// RUN: diff %t.searched1 %t.searched2

// CHECK-LABEL: func.func @main
// CHECK: call @kope_op_0
// CHECK: call @kope_op_1
// CHECK: call @kope_op_2

// The matmul's reference loops lose to a tiled, vectorized schedule by a wide margin: the
// agent's kernel replaced the body, and the annotation says so.
// CHECK-LABEL: func.func private @kope_op_0(%{{.*}}: tensor<64x96xf32>, %{{.*}}: tensor<96x80xf32>) -> tensor<64x80xf32>
// CHECK-SAME: kope.kernel = "agent"
// CHECK-SAME: kope.optimized = {attempts = 2 : i64, best_attempt = "attempt-{{[0-9a-f]+}}", speedup = {{[0-9.e+]+}} : f64, stopped = "{{[a-z ]+}}", winner = "agent"}
// CHECK: vector.

// The row sum too.
// CHECK-LABEL: func.func private @kope_op_1(%{{.*}}: tensor<64x80xf32>) -> tensor<64xf32>
// CHECK-SAME: kope.kernel = "agent"
// CHECK-SAME: winner = "agent"

// A complex multiply: no kernel of the cpu target takes complex numbers.
// CHECK-LABEL: func.func private @kope_op_2
// CHECK-NOT: kope.optimized
// CHECK: linalg.generic
// WARN: warning: kope-optimize: @kope_op_2 not optimized: its element type complex<f32> is not one the cpu target takes

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
module {
  func.func @main(%a: tensor<64x96xf32>, %b: tensor<96x80xf32>, %c: tensor<8x8xcomplex<f32>>) -> (tensor<64xf32>, tensor<8x8xcomplex<f32>>) {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<64x80xf32>
    %f = linalg.fill ins(%zero : f32) outs(%e : tensor<64x80xf32>) -> tensor<64x80xf32>
    %mm = linalg.matmul ins(%a, %b : tensor<64x96xf32>, tensor<96x80xf32>) outs(%f : tensor<64x80xf32>) -> tensor<64x80xf32>
    %er = tensor.empty() : tensor<64xf32>
    %fr = linalg.fill ins(%zero : f32) outs(%er : tensor<64xf32>) -> tensor<64xf32>
    %sum = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%mm : tensor<64x80xf32>) outs(%fr : tensor<64xf32>) {
    ^bb0(%in: f32, %acc: f32):
      %s = arith.addf %in, %acc : f32
      linalg.yield %s : f32
    } -> tensor<64xf32>
    %ec = tensor.empty() : tensor<8x8xcomplex<f32>>
    %sq = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%c : tensor<8x8xcomplex<f32>>) outs(%ec : tensor<8x8xcomplex<f32>>) {
    ^bb0(%in: complex<f32>, %out: complex<f32>):
      %m = complex.mul %in, %in : complex<f32>
      linalg.yield %m : complex<f32>
    } -> tensor<8x8xcomplex<f32>>
    return %sum, %sq : tensor<64xf32>, tensor<8x8xcomplex<f32>>
  }
}
