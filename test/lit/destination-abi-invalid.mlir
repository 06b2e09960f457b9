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

// Already in the calling convention: nothing to do, no error.
module {
  func.func @kope_kernel(%in: memref<4xf32>, %out: memref<4xf32>) {
    return
  }
}
