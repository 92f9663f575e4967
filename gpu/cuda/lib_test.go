package cuda

import (
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// TestCallOutParamSurvivesStackGrowth: an out parameter on the caller's
// stack (libDriver's &p) gets what the C function wrote into it even when
// the goroutine's stack grows, and moves, on the way into the call. Each
// depth of a recursion runs on a fresh goroutine, so that across the
// depths the stack's limit falls at every point of the way from call into
// C. Before call was go:uintptrescapes, p stayed on the stack and the C
// function wrote into the stack's old copy: cuMemAlloc_v2 returned
// success and pointer 0 on an H100 host. memcpy of libc stands in for the
// driver (no GPU needed).
func TestCallOutParamSurvivesStackGrowth(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skipf("no libc.so.6 to call: %v", err)
	}
	defer purego.Dlclose(libc)
	memcpy, err := purego.Dlsym(libc, "memcpy")
	if err != nil {
		t.Fatalf("dlsym memcpy: %v", err)
	}
	src := uint64(0x0123456789abcdef)
	for depth := range 1500 {
		got := make(chan uint64)
		go func() { got <- outAtDepth(depth, memcpy, &src) }()
		if v := <-got; v != src {
			t.Fatalf("depth %d: the out parameter holds %#x, want %#x: the C call wrote elsewhere", depth, v, src)
		}
	}
}

// outAtDepth calls memcpy through call into an out parameter of its own
// stack frame, n frames of 64 bytes down.
//
//go:noinline
func outAtDepth(n int, memcpy uintptr, src *uint64) uint64 {
	if n > 0 {
		var pad [64]byte
		pad[n%64] = byte(n)
		return outAtDepth(n-1, memcpy, src) + uint64(pad[n%64]) - uint64(byte(n))
	}
	var p uint64
	call(memcpy, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(src)), 8)
	return p
}
