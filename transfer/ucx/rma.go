//go:build ucx

package ucx

import (
	"time"

	"github.com/tensorfs/tensorfs/transfer"
)

// RMA is the context as the peer service's transfer.RMA: its worker
// address for the handshake, and endpoints to the peers that offer one.
func (c *Context) RMA() transfer.RMA { return rma{c} }

type rma struct{ c *Context }

func (r rma) Address() []byte { return r.c.Address() }

func (r rma) Connect(addr []byte) (transfer.RMAEndpoint, error) {
	e, err := r.c.Connect(addr)
	if err != nil {
		return nil, err
	}
	return endpoint{e}, nil
}

type endpoint struct{ e *Endpoint }

func (e endpoint) Transports() []string { return e.e.Transports() }

func (e endpoint) Close(force bool, deadline time.Time) error { return e.e.Close(force, deadline) }
