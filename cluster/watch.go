package cluster

import (
	"context"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// reloadLogMax is how many changes a reload of the view logs one by one.
const reloadLogMax = 10

// Reasons a node left the view, as Resolve's EHOSTUNREACH says them.
const (
	reasonShutdown = "its daemon shut down and deregistered"
	reasonExpired  = "its record went away without a goodbye: its lease expired (no keep-alive for the TTL: the daemon died or lost etcd) or the record was deleted by hand"
	reasonReload   = "its record was gone when this node reloaded the view (after etcd was unreachable): its lease expired meanwhile"
	reasonBad      = "its record is not valid JSON with an addr"
)

// load reads every record of the cluster and makes it the view (logging
// what changed when logChanges), returning etcd's revision of it.
func (m *Member) load(ctx context.Context, logChanges bool) (int64, error) {
	resp, err := m.cli.Get(ctx, m.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	fresh := make(map[string]Record, len(resp.Kvs))
	why := map[string]string{} // the records that are there but not live
	for _, kv := range resp.Kvs {
		name := strings.TrimPrefix(string(kv.Key), m.prefix)
		r, err := decode(name, kv.Value)
		if err != nil {
			why[name] = reasonBad
			continue
		}
		if r.Leaving {
			why[name] = reasonShutdown
			continue
		}
		fresh[name] = r
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	// After a long loss of etcd many records may have changed: the first
	// few are logged one by one, the rest counted.
	logged, more := 0, 0
	logf := func(format string, args ...any) {
		if !logChanges {
			return
		}
		if logged < reloadLogMax {
			logged++
			m.logf(format, args...)
		} else {
			more++
		}
	}
	for name, old := range m.nodes {
		if _, ok := fresh[name]; !ok {
			reason := reasonReload
			if w, ok := why[name]; ok {
				reason = w
			}
			m.forget(name, now, reason)
			logf("cluster %s: node %s (%s, instance %s) gone: %s", m.cfg.Cluster, name, old.Addr, old.Instance, reason)
		}
	}
	for name, r := range fresh {
		if old := m.nodes[name]; logChanges && (old.Instance != r.Instance || old.Addr != r.Addr) {
			if logged < reloadLogMax {
				logged++
				m.logArrival(old, r)
			} else {
				more++
			}
		}
		delete(m.gone, name)
	}
	if more > 0 {
		m.logf("cluster %s: and %d more nodes changed while etcd was unreachable (tensorfs nodes --etcd lists them)", m.cfg.Cluster, more)
	}
	m.nodes = fresh
	m.rev = resp.Header.Revision
	m.notify()
	return resp.Header.Revision, nil
}

// forget moves name from the live view to the departed ones; m.mu held.
func (m *Member) forget(name string, at time.Time, reason string) {
	delete(m.nodes, name)
	if len(m.gone) >= goneMax {
		oldest := ""
		for n, g := range m.gone {
			if oldest == "" || g.at.Before(m.gone[oldest].at) {
				oldest = n
			}
		}
		delete(m.gone, oldest)
	}
	m.gone[name] = gone{at: at, reason: reason}
}

// logArrival logs a record that is new or a new instance (old is the
// previous one, zero if none).
func (m *Member) logArrival(old, r Record) {
	switch {
	case r.Name == m.cfg.Name:
		// This node's own record: Register logs nothing either.
	case old.Instance == "":
		m.logf("cluster %s: node %s joined at %s (host %s, instance %s)", m.cfg.Cluster, r.Name, r.Addr, r.HostID, r.Instance)
	case old.Instance != r.Instance:
		m.logf("cluster %s: node %s restarted: instance %s at %s -> %s at %s", m.cfg.Cluster, r.Name, old.Instance, old.Addr, r.Instance, r.Addr)
	case old.Addr != r.Addr:
		m.logf("cluster %s: node %s moved: %s -> %s", m.cfg.Cluster, r.Name, old.Addr, r.Addr)
	}
}

// apply applies one watch event to the view; m.mu held.
func (m *Member) apply(ev *clientv3.Event, now time.Time) {
	name := strings.TrimPrefix(string(ev.Kv.Key), m.prefix)
	old, had := m.nodes[name]
	if ev.Type == mvccpb.DELETE {
		if had {
			m.forget(name, now, reasonExpired)
			m.logf("cluster %s: node %s (%s, instance %s) gone: %s", m.cfg.Cluster, name, old.Addr, old.Instance, reasonExpired)
		}
		return
	}
	r, err := decode(name, ev.Kv.Value)
	switch {
	case err != nil:
		m.logf("cluster %s: ignoring the record of %s: %v", m.cfg.Cluster, name, err)
		if had {
			m.forget(name, now, reasonBad)
		}
	case r.Leaving:
		if had {
			m.forget(name, now, reasonShutdown)
			m.logf("cluster %s: node %s (%s, instance %s) gone: %s", m.cfg.Cluster, name, old.Addr, old.Instance, reasonShutdown)
		}
	default:
		m.logArrival(old, r)
		m.nodes[name] = r
		delete(m.gone, name)
	}
}

// watchLoop keeps the view: a watch of the prefix from rev; when the watch
// fails (a compacted revision, a lost leader) or the health loop asks
// (etcd answered again), the whole view is reloaded and watched anew from
// there, so that what happened meanwhile is not missed.
func (m *Member) watchLoop(rev int64) {
	defer m.wg.Done()
	for m.ctx.Err() == nil {
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(m.ctx))
		wch := m.cli.Watch(ctx, m.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		reload := false
		for !reload {
			select {
			case <-m.resync:
				reload = true
			case wr, ok := <-wch:
				if !ok || wr.Err() != nil {
					reload = true
					break
				}
				now := time.Now()
				m.mu.Lock()
				for _, ev := range wr.Events {
					m.apply(ev, now)
				}
				if wr.Header.Revision > m.rev {
					m.rev = wr.Header.Revision
				}
				rev = m.rev
				m.notify()
				m.mu.Unlock()
			}
		}
		cancel()
		// Reload until etcd answers (or Close).
		for m.ctx.Err() == nil {
			lctx, lcancel := context.WithTimeout(m.ctx, m.cfg.Timeout)
			r, err := m.load(lctx, true)
			lcancel()
			if err == nil {
				rev = r
				break
			}
			m.sleep(m.interval())
		}
	}
}

// sleep waits d or until Close.
func (m *Member) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-m.ctx.Done():
	}
}

// interval is how often the member checks on etcd and retries: a third of
// the TTL, within [200 ms, 3 s].
func (m *Member) interval() time.Duration {
	return min(max(m.cfg.TTL/3, 200*time.Millisecond), 3*time.Second)
}
