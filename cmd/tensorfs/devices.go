package main

import (
	"fmt"
	"log"

	"github.com/tensorfs/tensorfs/gpu"
)

// openDevices resolves --device to the default device and the others served.
func openDevices(device string, limit int64) ([]gpu.Device, error) {
	switch device {
	case "auto":
		// The CUDA backend is not built yet: auto is host until it is.
		log.Printf("device auto: no CUDA backend in this build; using host memory")
		device = gpu.HostName
	case gpu.HostName:
	default:
		return nil, fmt.Errorf("--device %q: %w (this build serves host; auto picks it)", device, gpu.ErrNoDevice)
	}
	h, err := gpu.NewHost(limit)
	if err != nil {
		return nil, err
	}
	return []gpu.Device{h}, nil
}
