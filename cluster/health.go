package cluster

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// healthLoop checks on etcd every interval and keeps the state:
// "connected", or "lost" while etcd does not answer. A keep-alive answered
// within the last interval and a half counts as an answer (no extra
// request); else a count-only read of this node's key asks. Each change is
// logged once; back to "connected", the view is reloaded (the watch loop's
// resync), so it converges on what happened meanwhile.
func (m *Member) healthLoop() {
	defer m.wg.Done()
	iv := m.interval()
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		m.regMu.Lock()
		fresh := m.registered && time.Since(m.lastAlive) < iv*3/2
		m.regMu.Unlock()
		var err error
		if !fresh {
			ctx, cancel := context.WithTimeout(m.ctx, iv)
			_, err = m.cli.Get(ctx, Key(m.cfg.Cluster, m.cfg.Name), clientv3.WithCountOnly())
			cancel()
			if m.ctx.Err() != nil {
				return
			}
		}
		m.setState(err)
	}
}

// setState records an answer (err nil) or a failure, logging and waking
// Changed's waiters on a change of state.
func (m *Member) setState(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err != nil && m.state == "connected":
		m.state, m.since, m.lastErr = "lost", time.Now(), err.Error()
		m.logf("cluster %s: etcd %s unreachable (%v): serving peers from the last view (%d nodes), retrying every %v",
			m.cfg.Cluster, strings.Join(m.cfg.Endpoints, ","), err, len(m.nodes), m.interval().Round(time.Millisecond))
		m.notify()
	case err != nil:
		m.lastErr = err.Error()
	case m.state != "connected":
		m.logf("cluster %s: etcd %s reachable again after %v: reloading the view", m.cfg.Cluster, strings.Join(m.cfg.Endpoints, ","), time.Since(m.since).Round(time.Millisecond))
		m.state, m.since, m.lastErr = "connected", time.Now(), ""
		select {
		case m.resync <- struct{}{}:
		default:
		}
		m.notify()
	}
}

// State is "connected" or "lost" (etcd did not answer the last check).
func (m *Member) State() string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.state
}
