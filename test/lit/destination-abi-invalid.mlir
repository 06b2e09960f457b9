// RUN: kope-opt --split-input-file --verify-diagnostics --kope-destination-abi %s

// expected-error @+1 {{module has neither @kope_kernel nor a @main payload function}}
module {
  func.func @other() {
    return
  }
}

// -----

// expected-error @+1 {{@main must have static shapes, got tensor<?xf32>}}
module {
  func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {
    return %x : tensor<?xf32>
  }
}

// -----

module {
  // expected-error @+1 {{@kope_kernel must return nothing, got (memref<4xf32>): write each output into its destination memref}}
  func.func @kope_kernel(%in: memref<4xf32>, %out: memref<4xf32>) -> memref<4xf32> {
    return %out : memref<4xf32>
  }
}

// -----

module {
  // expected-error @+1 {{@kope_kernel argument 1 is memref<4xf32, strided<[2]>>; arguments must be memrefs with static shapes and the default (contiguous) layout}}
  func.func @kope_kernel(%in: memref<4xf32>, %out: memref<4xf32, strided<[2]>>) {
    return
  }
}

// -----

module {
  // expected-error @+1 {{@kope_kernel argument 0 is tensor<4xf32>}}
  func.func @kope_kernel(%in: tensor<4xf32>, %out: memref<4xf32>) {
    return
  }
}

// -----

module {
  // expected-error @+1 {{@kope_kernel is only declared; it needs a body}}
  func.func private @kope_kernel(%in: memref<4xf32>, %out: memref<4xf32>)
}
