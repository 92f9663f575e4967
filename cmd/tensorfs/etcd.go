package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tensorfs/tensorfs/cluster"
)

// etcdFlags are the flags of cluster membership through etcd (mount and
// nodes).
type etcdFlags struct {
	endpoints, cluster, cert, key, ca, user, advertise string
	ttl                                                time.Duration
}

// register adds the flags to f; withTTL for mount (--etcd-ttl and
// --advertise: nodes registers nothing).
func (e *etcdFlags) register(f *pflag.FlagSet, withTTL bool) {
	use := "etcd endpoints, comma-separated (e.g. http://10.0.0.1:2379): read the cluster's records there"
	if withTTL {
		use = "etcd endpoints, comma-separated (e.g. http://10.0.0.1:2379): register there and find peers by name"
	}
	f.StringVar(&e.endpoints, "etcd", "", use)
	f.StringVar(&e.cluster, "cluster", cluster.DefaultCluster, "cluster name: records live under /tensorfs/CLUSTER/nodes/")
	f.StringVar(&e.cert, "etcd-cert", "", "client certificate for etcd's TLS (PEM)")
	f.StringVar(&e.key, "etcd-key", "", "client key for etcd's TLS (PEM)")
	f.StringVar(&e.ca, "etcd-ca", "", "CA certificate that signed etcd's server certificate (PEM)")
	f.StringVar(&e.user, "etcd-user", "", "etcd user as USER[:PASSWORD]; USER alone takes the password from $ETCD_PASSWORD")
	if withTTL {
		f.StringVar(&e.advertise, "advertise", "", "HOST:PORT registered in etcd for peers to dial (default: the --listen address)")
		f.DurationVar(&e.ttl, "etcd-ttl", cluster.DefaultTTL, "TTL of this node's etcd lease (whole seconds): a dead node vanishes from its peers' views after it")
	}
}

// enabled reports whether --etcd was given.
func (e *etcdFlags) enabled() bool { return e.endpoints != "" }

// config builds the cluster configuration; timeout bounds each etcd
// request. Errors: empty endpoints, a bad --cluster or --etcd-ttl.
func (e *etcdFlags) config(name, hostID string, timeout time.Duration) (cluster.Config, error) {
	cfg := cluster.Config{Cluster: e.cluster, Name: name, HostID: hostID, CertFile: e.cert, KeyFile: e.key, CAFile: e.ca, TTL: e.ttl, Timeout: timeout}
	for _, ep := range strings.Split(e.endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			if !strings.Contains(ep, "://") {
				ep = "http://" + ep
				if e.cert != "" || e.ca != "" {
					ep = "https://" + strings.TrimPrefix(ep, "http://")
				}
			}
			cfg.Endpoints = append(cfg.Endpoints, ep)
		}
	}
	if len(cfg.Endpoints) == 0 {
		return cfg, fmt.Errorf("--etcd %q: no endpoints", e.endpoints)
	}
	if e.cluster == "" || strings.ContainsAny(e.cluster, "/ ") {
		return cfg, fmt.Errorf("--cluster %q: a non-empty name with no '/' or spaces", e.cluster)
	}
	if e.ttl != 0 && (e.ttl < time.Second || e.ttl%time.Second != 0) {
		return cfg, fmt.Errorf("--etcd-ttl %v: whole seconds, at least 1s", e.ttl)
	}
	if e.advertise != "" {
		if host, port, err := net.SplitHostPort(e.advertise); err != nil || host == "" || port == "" {
			return cfg, fmt.Errorf("--advertise %q: want HOST:PORT", e.advertise)
		}
	}
	if e.user != "" {
		u, p, ok := strings.Cut(e.user, ":")
		if !ok {
			p = os.Getenv("ETCD_PASSWORD")
		}
		cfg.Username, cfg.Password = u, p
	}
	return cfg, nil
}

// advertised is the address this node registers: --advertise, else the
// listener's bound address. Errors: a bound address whose host is
// unspecified (0.0.0.0, ::), which peers cannot dial.
func advertised(flag string, bound net.Addr) (string, error) {
	if flag != "" {
		return flag, nil
	}
	host, _, err := net.SplitHostPort(bound.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return "", fmt.Errorf("--listen %s binds every address: give --advertise HOST:PORT, the address peers reach this node at, to register in etcd", bound)
	}
	return bound.String(), nil
}
