// kope-annotate-experience attaches what the store knows about each keyed operator.
// RUN: rm -rf %t && mkdir -p %t
// RUN: kope-opt --kope-outline-operators %s -o %t/outlined.mlir
// RUN: %PYTHON %S/Inputs/make_store.py %t/store %t/outlined.mlir \
// RUN:   "kope_op_0 source=eager latency_us=4 eager_us=4" \
// RUN:   "kope_op_0 source=reference latency_us=16 eager_us=4" \
// RUN:   "kope_op_0 source=agent verdict=compile_error kernel=payload" \
// RUN:   "kope_op_0 source=agent verdict=mismatch kernel=payload latency_us=1 eager_us=4" \
// RUN:   "kope_op_0 source=agent kernel=payload latency_us=2.5 eager_us=4" \
// RUN:   "kope_op_1 source=eager latency_us=3 eager_us=3" \
// RUN:   "kope_op_1 source=agent kernel=payload latency_us=6 eager_us=3" \
// RUN:   "kope_op_2 source=agent verdict=timeout kernel=payload"
// RUN: kope-opt --kope-annotate-experience=store=%t/store %t/outlined.mlir | FileCheck %s
// RUN: kope-opt --pass-pipeline="builtin.module(kope-outline-operators,kope-annotate-experience{store=%t/store})" %s | FileCheck %s

// Annotating twice replaces the attribute; the functions are unchanged.
// RUN: kope-opt --kope-annotate-experience=store=%t/store %t/outlined.mlir | kope-opt --kope-annotate-experience=store=%t/store | FileCheck %s

// Functions without kope.key get nothing.
// CHECK-LABEL: func.func @f(
// CHECK-NOT: kope.experience
// CHECK: call @kope_op_0

// The agent's verified kernel is the fastest: 1.6x eager.
// CHECK-LABEL: func.func private @kope_op_0
// CHECK-SAME: kope.experience = {attempts = 5 : i64, best_attempt = "attempt-{{[0-9a-f]+}}", best_us = 2.500000e+00 : f64, eager_us = 4.000000e+00 : f64, op = "linalg.matmul", speedup_vs_eager = 1.600000e+00 : f64, verdicts = {compile_error = 1 : i64, mismatch = 1 : i64, verified = 3 : i64}, winner = "agent"}
// CHECK: linalg.matmul

// Eager ATen wins against a slower agent kernel.
// CHECK-LABEL: func.func private @kope_op_1
// CHECK-SAME: kope.experience = {attempts = 2 : i64, best_attempt = "attempt-{{[0-9a-f]+}}", best_us = 3.000000e+00 : f64, eager_us = 3.000000e+00 : f64, op = "linalg.generic", speedup_vs_eager = 1.000000e+00 : f64, verdicts = {verified = 2 : i64}, winner = "eager"}

// Only a failed attempt: no winner, no timings.
// CHECK-LABEL: func.func private @kope_op_2
// CHECK-SAME: kope.experience = {attempts = 1 : i64, op = "linalg.generic", verdicts = {timeout = 1 : i64}}

// Memory has never seen it.
// CHECK-LABEL: func.func private @kope_op_3
// CHECK-SAME: kope.experience = {attempts = 0 : i64}
// CHECK-NOT: kope.experience
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @f(%x: tensor<4x6xf32>, %w: tensor<6x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x6xf32>, tensor<6x8xf32>) outs(%init : tensor<4x8xf32>) -> tensor<4x8xf32>
  %relu = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.maximumf %in, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x8xf32>
  %tanh = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%relu : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = math.tanh %in : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  %neg = linalg.negf ins(%tanh : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %tanh, %neg : tensor<4x8xf32>, tensor<4x8xf32>
}
