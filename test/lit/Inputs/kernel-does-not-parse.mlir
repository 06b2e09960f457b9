// Not MLIR: a kernel text that does not parse.
func.func @main(%a: tensor<5x5xf32> -> {
