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

func (e endpoint) OneSided() bool { return e.e.OneSided() }

func (e endpoint) DetectsPeerFailure() bool { return e.e.DetectsPeerFailure() }

func (e endpoint) Close(force bool, deadline time.Time) error { return e.e.Close(force, deadline) }

func (r rma) Map(addr uintptr, n int) ([]byte, func() error, error) {
	reg, err := r.c.Map(addr, n)
	if err != nil {
		return nil, nil, err
	}
	return reg.Rkey(), reg.Unmap, nil
}

func (e endpoint) Unpack(rkey []byte, base uint64, n int) (transfer.RMAKey, error) {
	k, err := e.e.Unpack(rkey, base, n)
	if err != nil {
		return nil, err
	}
	return key{k}, nil
}

// key is a RemoteKey as a transfer.RMAKey.
type key struct{ k *RemoteKey }

func (k key) Get(descs []transfer.RMADesc, deadline time.Time, stop <-chan struct{}) error {
	return k.k.Get(toDescs(descs), deadline, stop)
}

func (k key) Destroy() error { return k.k.Destroy() }

// toDescs converts a list: the two types have one layout, but the
// binding keeps its own (it does not depend on transfer's).
func toDescs(ds []transfer.RMADesc) []Desc {
	out := make([]Desc, len(ds))
	for i, d := range ds {
		out[i] = Desc{Local: d.Local, Off: d.Off, N: d.N}
	}
	return out
}
