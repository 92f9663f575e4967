package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/cluster"
	"github.com/tensorfs/tensorfs/xattrs"
)

// nodeRow is one node in tensorfs nodes' output (its --json objects).
type nodeRow struct {
	Name       string   `json:"name"`
	Addr       string   `json:"addr"`
	HostID     string   `json:"host_id"`
	SameHost   bool     `json:"same_host"`
	Since      string   `json:"since"`
	Transports []string `json:"transports"`
	Instance   string   `json:"instance,omitempty"`
	// Source is "etcd" or "peer" (a --peer of the mount).
	Source string `json:"source"`
	Self   bool   `json:"self,omitempty"`
	Stale  bool   `json:"stale,omitempty"`
}

// newNodesCmd is the nodes command; most of its length is its --help and
// its two sources (a mount's stats, or etcd itself), each a few lines.
func newNodesCmd() *cobra.Command {
	var (
		asJSON bool
		hostID string
		ec     etcdFlags
	)
	cmd := &cobra.Command{
		Use:   "nodes [MOUNTPOINT]",
		Short: "List the cluster's nodes: through a mount's stats, or straight from etcd with --etcd",
		Long: `List the nodes of a tensorfs cluster: name, address, host, whether on this
host, up since, transports.

With MOUNTPOINT, the list is that daemon's view (its stats "peers": the etcd
view it resolves peer names through, and its --peer entries); stats lists 64
etcd nodes at most, and says how many there are. With --etcd ENDPOINTS (and
--cluster, and etcd's TLS and auth flags as for mount) the records are read
from etcd itself, all of them; "same host" then compares with this machine's
boot id (or --host-id).

--json prints a JSON array of {name, addr, host_id, same_host, since,
transports, instance, source, self, stale}.`,
		Args: positional(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rows []nodeRow
			var note string
			switch {
			case ec.enabled() && len(args) == 0:
				if hostID == "" {
					b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
					hostID = strings.TrimSpace(string(b))
				}
				cfg, err := ec.config("", hostID, 5*time.Second)
				if err != nil {
					return err
				}
				recs, err := cluster.List(cfg)
				if err != nil {
					return err
				}
				for _, r := range recs {
					rows = append(rows, nodeRow{Name: r.Name, Addr: r.Addr, HostID: r.HostID, SameHost: r.HostID == hostID, Since: r.Started.UTC().Format(time.RFC3339),
						Transports: r.Transports, Instance: r.Instance, Source: "etcd"})
				}
			case len(args) == 1 && !ec.enabled():
				var err error
				if rows, note, err = nodesFromMount(args[0]); err != nil {
					return err
				}
			default:
				return fmt.Errorf("give a MOUNTPOINT or --etcd ENDPOINTS (one of them)")
			}
			if rows == nil {
				rows = []nodeRow{}
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tADDRESS\tHOST\tSAME HOST\tUP SINCE\tTRANSPORTS\tSOURCE")
			for _, r := range rows {
				name, same := r.Name, "no"
				if r.Self {
					name += " (this node)"
				}
				if r.SameHost {
					same = "yes"
				}
				if r.Stale {
					r.Source += " (stale)"
				}
				host, since := r.HostID, r.Since
				if host == "" {
					host, same, since = "-", "-", "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, r.Addr, host, same, since, strings.Join(r.Transports, ","), r.Source)
			}
			w.Flush()
			if note != "" {
				fmt.Fprintln(os.Stderr, note)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&hostID, "host-id", "", "this machine's host identity, for 'same host' with --etcd (default: the kernel's boot id)")
	ec.register(f, false)
	return cmd
}

// nodesFromMount reads the nodes from a mount's stats, and a note when
// etcd is lost or stats lists only part of the view.
func nodesFromMount(mnt string) ([]nodeRow, string, error) {
	b := make([]byte, 256<<10)
	n, err := unix.Getxattr(mnt, xattrs.StatsName, b)
	if err != nil {
		return nil, "", fmt.Errorf("%s: reading stats: %v (is it a tensorfs mount?)", mnt, err)
	}
	var st xattrs.Stats
	if err := json.Unmarshal(b[:n], &st); err != nil {
		return nil, "", fmt.Errorf("%s: stats: %v", mnt, err)
	}
	rows := make([]nodeRow, 0, len(st.Peers))
	for name, p := range st.Peers {
		src := p.Source
		if src == "" {
			src = "peer"
		}
		rows = append(rows, nodeRow{Name: name, Addr: p.Addr, HostID: p.HostID, SameHost: p.SameHost, Since: p.Since, Transports: p.Transports,
			Instance: p.Instance, Source: src, Self: p.Self, Stale: p.Stale})
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Self != rows[j].Self {
			return rows[i].Self
		}
		return rows[i].Name < rows[j].Name
	})
	note := ""
	if c := st.Cluster; c != nil {
		etcdRows := 0
		for _, r := range rows {
			if r.Source == "etcd" {
				etcdRows++
			}
		}
		if c.Nodes > etcdRows {
			note = fmt.Sprintf("%d of cluster %s's %d nodes listed (stats lists 64 at most; all of them: tensorfs nodes --etcd %s --cluster %s)", etcdRows, c.Cluster, c.Nodes, strings.Join(c.Endpoints, ","), c.Cluster)
		}
		if c.State != "connected" {
			note = strings.TrimSpace(note + fmt.Sprintf("\netcd %s is %s since %s (%s): this is the daemon's last view", strings.Join(c.Endpoints, ","), c.State, c.Since, c.Error))
		}
	}
	return rows, note, nil
}
