package tensor_test

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/tensor"
)

// An embedder that owns its memory (here a memfd of this process) registers
// it as a tensor: Store.Import opens it, Tensor.Register makes it the
// tensor's memory region and IPC export, and the release at Unlink
// deregisters and unmaps it without freeing it.
func ExampleTensor_Register() {
	host, _ := gpu.NewHost(64 << 20)
	store, _ := tensor.NewStore(tensor.Config{Devices: []gpu.Device{host}})
	defer store.Close()

	fd, _ := unix.MemfdCreate("mine", unix.MFD_CLOEXEC)
	defer unix.Close(fd)
	unix.Ftruncate(fd, 4096)
	unix.Pwrite(fd, []byte("owned by me"), 0)

	t, _ := store.New(tensor.Template{})
	buf, err := store.Import(fmt.Sprintf("memfd:/proc/%d/fd/%d", os.Getpid(), fd), 0, 11)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := t.Register(buf); err != nil {
		fmt.Println(err)
		return
	}
	p := make([]byte, 11)
	t.ReadAt(p, 0)
	fmt.Println(string(p), t.Info().Shape, store.Stats().Regions)
	t.Unlink()
	fmt.Println(store.Stats().Regions)
	// Output:
	// owned by me 11 1
	// 0
}
