package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/gpu/cuda"
)

// openDevices resolves --device to the devices the store serves, the default
// first: auto (cuda:0 when the CUDA driver loads and sees a GPU, else host),
// host, or cuda:N. Every GPU present is served, and host memory always is, so
// a directory's device template can place tensors on any of them. limit
// (bytes, 0 for none) caps the default device only. notes are lines to log
// once the daemon has started (its choice of device, a broken driver): a
// failure to start prints one line, its own.
func openDevices(device string, limit int64) (devs []gpu.Device, notes []string, err error) {
	want := strings.ToLower(strings.TrimSpace(device))
	var ordinal int
	switch {
	case want == "auto" || want == gpu.HostName:
	case strings.HasPrefix(want, "cuda:"):
		n, err := strconv.ParseUint(strings.TrimPrefix(want, "cuda:"), 10, 16)
		if err != nil {
			return nil, nil, fmt.Errorf("--device %q: not auto, host or cuda:N", device)
		}
		ordinal = int(n)
	default:
		return nil, nil, fmt.Errorf("--device %q: not auto, host or cuda:N", device)
	}

	gpus, cudaErr := cuda.Open(0)
	if want == "auto" {
		if cudaErr != nil {
			notes = append(notes, fmt.Sprintf("device auto: %s; using host memory", whyNoCUDA(cudaErr)))
			want = gpu.HostName
		} else {
			notes = append(notes, fmt.Sprintf("device auto: %d GPU(s) through %s; using cuda:0", len(gpus), cuda.LibraryName))
			want = "cuda:0"
		}
	}
	if strings.HasPrefix(want, "cuda:") {
		if cudaErr != nil {
			return nil, nil, fmt.Errorf("--device %s: %s", want, whyNoCUDA(cudaErr))
		}
		if ordinal >= len(gpus) {
			closeAll(gpus)
			return nil, nil, fmt.Errorf("--device %s: no such GPU (this host has %d: cuda:0 to cuda:%d): %w", want, len(gpus), len(gpus)-1, gpu.ErrNoDevice)
		}
	} else if cudaErr != nil && !errors.Is(cudaErr, gpu.ErrNoDriver) && !errors.Is(cudaErr, gpu.ErrNoDevice) {
		// A broken driver is worth a line even when host memory was asked for.
		notes = append(notes, fmt.Sprintf("device %s: not serving GPUs: %s", want, whyNoCUDA(cudaErr)))
	}

	hostLimit := int64(0)
	if want == gpu.HostName {
		hostLimit = limit
	}
	host, err := gpu.NewHost(hostLimit)
	if err != nil {
		closeAll(gpus)
		return nil, nil, err
	}
	devs = []gpu.Device{host}
	for i, g := range gpus {
		if i == ordinal && want != gpu.HostName {
			if err := g.(*cuda.Device).SetMaxMemory(limit); err != nil {
				closeAll(gpus)
				return nil, nil, err
			}
			devs = append([]gpu.Device{g}, devs...)
		} else {
			devs = append(devs, g)
		}
	}
	return devs, notes, nil
}

// whyNoCUDA says in a few words why the CUDA backend is not usable.
func whyNoCUDA(err error) string {
	switch {
	case errors.Is(err, gpu.ErrNoDriver):
		return fmt.Sprintf("%s not found (%v)", cuda.LibraryName, err)
	case errors.Is(err, gpu.ErrNoDevice):
		return fmt.Sprintf("the CUDA driver sees no GPU (%v)", err)
	}
	return fmt.Sprintf("CUDA driver unusable (%v)", err)
}

func closeAll(devs []gpu.Device) {
	for _, d := range devs {
		d.Close()
	}
}
