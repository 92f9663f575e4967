package gpu

import "unsafe"

// uintptrOf is the address of b's first byte; b must be non-empty.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
