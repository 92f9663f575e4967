//go:build ucx

package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tensorfs/tensorfs/mr"
	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/transfer/ucx"
)

// openUCX is --transport in a build with UCX: auto and ucx open the
// daemon's UCP context and worker (progressed with the peer connections'
// spin) and map every memory region with it from now on (rkeys in
// user.tensorfs.rkey); tcp opens nothing. A context that cannot be opened
// is an error with ucx and a warning with auto. rma is the context for
// the peer service (its address in the handshake, an endpoint per peer
// that offers one); nil without. closeUCX closes the context.
func openUCX(transport string, regs *mr.Registry, spin time.Duration) (rma transfer.RMA, closeUCX func(), err error) {
	if transport == "tcp" {
		return nil, func() {}, nil
	}
	c, err := ucx.Open(ucx.Config{Spin: spin})
	if err != nil {
		if transport == "ucx" {
			return nil, nil, fmt.Errorf("--transport ucx: %w", err)
		}
		slog.Warn("ucx: cannot open a context; memory regions get no rkeys", "err", err)
		return nil, func() {}, nil
	}
	regs.SetMapper(c.Mapper())
	// Said in the mounted line (transports: ucx), not in a line of its own:
	// a start refused later (a name taken) prints that one line only.
	slog.Debug("ucx: context open; host-memory regions are mapped with rkeys (user.tensorfs.rkey)", "address_bytes", len(c.Address()), "required", transport == "ucx")
	return c.RMA(), func() {
		// A region registered after this (a write to a detached mount
		// still served) is not mapped: the context is going.
		regs.SetMapper(nil)
		if err := c.Close(); err != nil {
			slog.Error("ucx: close", "err", err)
		}
	}, nil
}
