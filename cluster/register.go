package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Register writes this node's record under a fresh lease of Config.TTL and
// keeps the lease alive until Close; if the lease is lost (etcd unreachable
// for longer than the TTL), the record is written again under a new one
// once etcd answers. Call it once, after the peer service listens at
// r.Addr. The name is claimed by a transaction: the key is absent, or its
// holder is stale (no lease, a leaving record, this very instance, an
// expired lease, the same host and address as r (which this daemon now
// listens on), or an address that refuses connections: a daemon that died
// within its TTL).
// Errors: ErrNameTaken (wrapped with the holder's address, host and
// instance) when a live node holds the name; ErrUnreachable and etcd's own.
func (m *Member) Register(r Record) error {
	if r.Name == "" {
		r.Name = m.cfg.Name
	}
	m.regMu.Lock()
	m.rec = &r
	m.regMu.Unlock()
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.Timeout)
	defer cancel()
	lease, err := m.claim(ctx, r)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return unreachable(m.cfg.Endpoints, err)
		}
		return err
	}
	m.regMu.Lock()
	m.lease, m.registered, m.lastAlive = lease, true, time.Now()
	m.regMu.Unlock()
	m.wg.Add(1)
	go m.keepAlive(lease)
	return nil
}

// claim grants a lease and puts r under it if the name is free or its
// holder stale (see Register); the lease is revoked on failure.
func (m *Member) claim(ctx context.Context, r Record) (clientv3.LeaseID, error) {
	val, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	g, err := m.cli.Grant(ctx, int64((m.cfg.TTL+time.Second-1)/time.Second))
	if err != nil {
		return 0, err
	}
	key := Key(m.cfg.Cluster, r.Name)
	ok, err := m.put(ctx, key, string(val), g.ID, r)
	if err != nil || !ok {
		rctx, cancel := context.WithTimeout(context.Background(), m.cfg.Timeout)
		m.cli.Revoke(rctx, g.ID)
		cancel()
		if err == nil {
			err = fmt.Errorf("%w: name %s in cluster %s changed hands while being claimed", ErrNameTaken, r.Name, m.cfg.Cluster)
		}
		return 0, err
	}
	return g.ID, nil
}

// put writes key = val under lease when the key is absent, or replaces a
// stale holder's record (guarded by its mod revision); false when the key
// changed under it twice.
func (m *Member) put(ctx context.Context, key, val string, lease clientv3.LeaseID, r Record) (bool, error) {
	for range 3 {
		resp, err := m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return false, err
		}
		if resp.Succeeded {
			return true, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // deleted meanwhile: try the absent case again
		}
		kv := kvs[0]
		var old Record
		json.Unmarshal(kv.Value, &old)
		why, err := m.stale(ctx, clientv3.LeaseID(kv.Lease), old, r)
		if err != nil {
			return false, err
		}
		if why == "" {
			return false, fmt.Errorf("%w: node %s in cluster %s is already registered by a live daemon at %s (host %s, instance %s, started %s): stop it or pick another --name",
				ErrNameTaken, r.Name, m.cfg.Cluster, old.Addr, old.HostID, old.Instance, old.Started.UTC().Format(time.RFC3339))
		}
		resp, err = m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Commit()
		if err != nil {
			return false, err
		}
		if resp.Succeeded {
			if old.Instance != r.Instance {
				m.logf("cluster %s: took over name %s from instance %s at %s: %s", m.cfg.Cluster, r.Name, old.Instance, old.Addr, why)
			}
			return true, nil
		}
	}
	return false, nil
}

// stale says why the holder of a name (its lease and record) no longer
// holds it, or "" when it is live.
func (m *Member) stale(ctx context.Context, lease clientv3.LeaseID, old, r Record) (string, error) {
	switch {
	case old.Instance == r.Instance:
		return "this instance's own record", nil
	case old.Leaving:
		return "it was shutting down", nil
	case lease == 0:
		return "its record has no lease", nil
	case old.Addr == r.Addr && old.HostID == r.HostID:
		// Restarted on the same host and port: this daemon's listener
		// holds the address now, so the old one listens no more.
		return "its address " + old.Addr + " is now this daemon's listener (the old daemon is gone)", nil
	}
	ttl, err := m.cli.TimeToLive(ctx, lease)
	// TTL is the whole seconds left, rounded down (0 for a live lease's
	// last second); -1 for an expired one.
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ttl.TTL < 0) {
		return "its lease has expired", nil
	}
	if err != nil {
		return "", err
	}
	// Live lease: a daemon killed less than a TTL ago still holds one. Its
	// address refusing connections says it is dead (only a refusal: a
	// timeout may be a live node behind a slow network).
	d := net.Dialer{Timeout: min(m.cfg.Timeout, time.Second)}
	c, err := d.DialContext(ctx, "tcp", old.Addr)
	if err == nil {
		c.Close()
		return "", nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Sprintf("its lease has %ds left but %s refuses connections (the daemon died)", ttl.TTL, old.Addr), nil
	}
	return "", nil
}

// keepAlive renews lease until Close; when the lease is lost it registers
// the record again under a new one, retrying every interval until etcd
// answers (logging once per change).
func (m *Member) keepAlive(lease clientv3.LeaseID) {
	defer m.wg.Done()
	for {
		ch, err := m.cli.KeepAlive(m.ctx, lease)
		if err == nil {
			for range ch {
				m.regMu.Lock()
				m.lastAlive = time.Now()
				m.regMu.Unlock()
			}
		}
		if m.ctx.Err() != nil {
			return
		}
		m.regMu.Lock()
		m.registered = false
		rec := *m.rec
		m.regMu.Unlock()
		m.logf("cluster %s: lease of node %s lost (no answer from etcd for the TTL %v, or the lease was revoked): registering again when etcd answers", m.cfg.Cluster, rec.Name, m.cfg.TTL)
		m.mu.Lock()
		m.notify()
		m.mu.Unlock()
		logged := ""
		for {
			ctx, cancel := context.WithTimeout(m.ctx, m.cfg.Timeout)
			l, err := m.claim(ctx, rec)
			cancel()
			if m.ctx.Err() != nil {
				return
			}
			if err == nil {
				lease = l
				break
			}
			if errors.Is(err, ErrNameTaken) && logged != err.Error() {
				logged = err.Error()
				m.logf("cluster %s: cannot register again: %v", m.cfg.Cluster, err)
			}
			m.sleep(m.interval())
		}
		m.regMu.Lock()
		m.lease, m.registered, m.lastAlive = lease, true, time.Now()
		m.regMu.Unlock()
		m.logf("cluster %s: node %s registered again at %s", m.cfg.Cluster, rec.Name, rec.Addr)
		m.mu.Lock()
		m.notify()
		m.mu.Unlock()
	}
}

// deregister marks the record leaving and revokes its lease (which deletes
// it), each bounded by Config.Timeout; after the goroutines stopped.
func (m *Member) deregister() {
	m.regMu.Lock()
	rec, lease, ok := m.rec, m.lease, m.registered
	m.registered = false
	m.regMu.Unlock()
	if rec == nil || !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(m.cfg.Timeout, 2*time.Second))
	defer cancel()
	key := Key(m.cfg.Cluster, rec.Name)
	bye := *rec
	bye.Leaving = true
	val, _ := json.Marshal(bye)
	if _, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease))).Commit(); err != nil {
		m.logf("cluster %s: deregistering %s: %v (its record expires with its lease, within %v)", m.cfg.Cluster, rec.Name, err, m.cfg.TTL)
		return
	}
	if _, err := m.cli.Revoke(ctx, lease); err != nil {
		m.logf("cluster %s: deregistering %s: %v (its record expires with its lease, within %v)", m.cfg.Cluster, rec.Name, err, m.cfg.TTL)
	}
}
