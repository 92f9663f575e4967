package transfer

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// fakeEP counts the keys unpacked on it and destroyed.
type fakeEP struct {
	mu                  sync.Mutex
	unpacked, destroyed int
}

type fakeKey struct {
	ep        *fakeEP
	destroyed bool
}

func (e *fakeEP) Transports() []string                       { return nil }
func (e *fakeEP) OneSided() bool                             { return true }
func (e *fakeEP) DetectsPeerFailure() bool                   { return true }
func (e *fakeEP) Close(force bool, deadline time.Time) error { return nil }
func (e *fakeEP) Unpack(rkey []byte, base uint64, n int) (RMAKey, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.unpacked++
	return &fakeKey{ep: e}, nil
}

func (k *fakeKey) Get(descs []RMADesc, deadline time.Time, stop <-chan struct{}) error {
	if k.destroyed {
		return fmt.Errorf("get on a destroyed key")
	}
	return nil
}

func (k *fakeKey) Destroy() error {
	k.ep.mu.Lock()
	defer k.ep.mu.Unlock()
	if k.destroyed {
		return fmt.Errorf("destroyed twice")
	}
	k.destroyed = true
	k.ep.destroyed++
	return nil
}

// TestRMAKeysCache: a region offered again with the same packed key,
// address and length reuses its unpacked key; any difference unpacks
// anew; past maxRMAKeys the least recently used key nobody holds is
// destroyed, never one in use.
func TestRMAKeysCache(t *testing.T) {
	ep := &fakeEP{}
	var c rmaKeys
	rg := rmaRegion{Addr: 0x1000, Len: 4096, Rkey: []byte{1, 2, 3}}
	k1, rel1, err := c.get(ep, rg)
	if err != nil {
		t.Fatal(err)
	}
	k2, rel2, _ := c.get(ep, rg)
	if k1 != k2 || ep.unpacked != 1 {
		t.Fatalf("the same region unpacked %d times", ep.unpacked)
	}
	for _, other := range []rmaRegion{{Addr: 0x2000, Len: 4096, Rkey: rg.Rkey}, {Addr: rg.Addr, Len: 8192, Rkey: rg.Rkey}, {Addr: rg.Addr, Len: rg.Len, Rkey: []byte{1, 2, 4}}} {
		_, rel, _ := c.get(ep, other)
		rel()
	}
	if ep.unpacked != 4 {
		t.Fatalf("%d unpacks for 4 distinct regions", ep.unpacked)
	}
	// k1 is held (twice); fill the cache past its bound with released keys.
	for i := range maxRMAKeys {
		_, rel, _ := c.get(ep, rmaRegion{Addr: uint64(0x100000 + i*4096), Len: 4096, Rkey: []byte{9}})
		rel()
	}
	if len(c.m) != maxRMAKeys || ep.destroyed != 4 { // the 3 other regions and the oldest filler; never k1
		t.Fatalf("%d cached, %d destroyed", len(c.m), ep.destroyed)
	}
	if err := k1.Get(nil, time.Now().Add(time.Second), nil); err != nil {
		t.Fatalf("the key in use was evicted: %v", err)
	}
	rel1()
	rel2()
	// Released, and the least recently used now: the next miss evicts it.
	_, rel, _ := c.get(ep, rmaRegion{Addr: 0x9000000, Len: 4096, Rkey: []byte{9}})
	rel()
	if !k1.(*fakeKey).destroyed {
		t.Fatal("the least recently used key, released, was not the one evicted")
	}
}
