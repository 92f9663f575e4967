//go:build !ucx

package main

import (
	"fmt"
	"time"

	"github.com/tensorfs/tensorfs/mr"
	"github.com/tensorfs/tensorfs/transfer"
)

// openUCX is --transport in a build without UCX (the default, pure Go):
// auto and tcp are TCP, ucx is refused.
func openUCX(transport string, _ *mr.Registry, _ time.Duration) (rma transfer.RMA, closeUCX func(), err error) {
	if transport == "ucx" {
		return nil, nil, fmt.Errorf("--transport ucx: this tensorfs is built without UCX (build it with CGO_ENABLED=1 go build -tags ucx, against Debian's libucx-dev)")
	}
	return nil, func() {}, nil
}
