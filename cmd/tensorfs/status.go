package main

// status reads a daemon through its mount only: statfs (the default
// device's capacity and use, as df shows them), the root's stats xattr
// (live counts, peers, transfers, errors) and /proc/self/mounts (the node
// name the mount carries in its source, "tensorfs:NAME"). Anyone who can
// see the mount can run it; there is no control socket to secure.

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// statusReport is tensorfs status's document (its --json output).
type statusReport struct {
	// Mount is the mountpoint.
	Mount string `json:"mount"`
	// Node is this daemon's node name, "" when the mount does not say
	// (a mount by an older daemon).
	Node string `json:"node,omitempty"`
	// Device is the default device's capacity and use (statfs).
	Device deviceUse `json:"device"`
	// Devices are every device's capacity and use (stats "devices"),
	// default first.
	Devices []xattrs.DeviceUse `json:"devices"`
	// Live is the stats document's live counts (all devices).
	Live xattrs.Live `json:"live"`
	// Peers are the nodes this one reaches by name, sorted by name.
	Peers []peerState `json:"peers"`
	// Cluster is the etcd view's state, absent without --etcd.
	Cluster *xattrs.Cluster `json:"cluster,omitempty"`
	// Active are the transfers running now (none finished).
	Active []transferProgress `json:"transfers"`
	// Errors are the daemon's recent errors (stats "errors.recent"),
	// absent when its stats does not carry them.
	Errors []xattrs.Refusal `json:"errors,omitzero"`
}

// deviceUse is the default device as statfs reports it, in bytes.
type deviceUse struct {
	// Capacity is what tensorfs may allocate there (--max-memory, or the
	// device's memory).
	Capacity uint64 `json:"capacity"`
	// Used is the bytes tensorfs holds there.
	Used uint64 `json:"used"`
	// Free is Capacity less Used.
	Free uint64 `json:"free"`
}

// peerState is one peer in status.
type peerState struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	// Source is "peer" (a --peer) or "etcd".
	Source string `json:"source"`
	// State is "configured" (a --peer no handshake has reached yet),
	// "reached" (a --peer a handshake reached: Reached, and SameHost from
	// it), "live" (in the etcd view), "stale" (from the last view, etcd
	// lost) or "self" (this node's own record).
	State    string `json:"state"`
	SameHost bool   `json:"same_host,omitempty"`
	Since    string `json:"since,omitempty"`
	Reached  string `json:"reached,omitempty"`
	// UCX is the transports of this node's UCX endpoint to the peer,
	// UCXOneSided whether it is one-sided, UCXPeerFailure whether it
	// detects a dead peer, UCXCarries whether copies move their bytes on
	// it: stats' peers.
	UCX            []string `json:"ucx,omitempty"`
	UCXOneSided    bool     `json:"ucx_one_sided,omitempty"`
	UCXPeerFailure bool     `json:"ucx_peer_failure,omitempty"`
	UCXCarries     bool     `json:"ucx_carries,omitempty"`
}

// transferProgress is a running transfer in status.
type transferProgress struct {
	xattrs.Record
	// Percent is bytes_done of bytes_total, -1 while the total is unknown.
	Percent float64 `json:"percent"`
}

func newStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status MOUNT",
		Short: "Show a daemon's state: node, device use, peers, live transfers, recent errors",
		Long: `Show the state of the tensorfs daemon serving MOUNT (any path on the mount
names it): its node name; the default device's capacity, use and free space
(statfs, as df shows them) and the tensors and bytes live on all its devices;
its peers and their state (configured by --peer, reached once a handshake with
that peer succeeded, which then tells whether it is on this host; live or stale
in the etcd view), the transports of its UCX endpoint to each, "(copies on tcp)" when
copies do not use that endpoint, "(any endpoint)" when they use one that is not
one-sided or cannot detect a dead peer, --ucx-any-endpoint) and the cluster's; the transfers running now with their progress; and
the daemon's recent errors, when its stats document records them.

Everything is read through the mount (statfs and the root's
user.tensorfs.stats xattr), so any user who can see the mount can run it.
--json prints {mount, node, device: {capacity, used, free}, live, peers:
[{name, addr, source, state, same_host, since, ucx, ucx_one_sided, ucx_peer_failure, ucx_carries}], cluster, transfers: [the
running records of stats, each with percent], errors}.`,
		Args: positional(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := readStatus(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			writeStatus(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// readStats reads and decodes the stats document of the mount at mnt.
func readStats(mnt string) (xattrs.Stats, error) {
	var st xattrs.Stats
	v, ok, err := getxattrString(func(b []byte) (int, error) { return unix.Getxattr(mnt, xattrs.StatsName, b) })
	if err == nil && !ok {
		err = unix.ENODATA
	}
	if err != nil {
		return st, fmt.Errorf("reading %s: %s", xattrs.StatsName, errText(err))
	}
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return st, fmt.Errorf("%s: %v", xattrs.StatsName, err)
	}
	return st, nil
}

// readStatus gathers status's report for the mount that arg is on.
func readStatus(arg string) (statusReport, error) {
	loc, err := locate("status", arg)
	if err != nil {
		return statusReport{}, err
	}
	rep := statusReport{Mount: loc.mnt, Node: nodeOfMount(loc.mnt), Peers: []peerState{}, Active: []transferProgress{}}
	var sf unix.Statfs_t
	if err := unix.Statfs(loc.mnt, &sf); err != nil {
		return rep, fmt.Errorf("status %s: statfs: %s", arg, errText(err))
	}
	bs := uint64(sf.Bsize)
	rep.Device = deviceUse{Capacity: sf.Blocks * bs, Used: (sf.Blocks - sf.Bfree) * bs, Free: sf.Bfree * bs}
	st, err := readStats(loc.mnt)
	if err != nil {
		return rep, fmt.Errorf("status %s: %v", arg, err)
	}
	rep.Live, rep.Cluster, rep.Devices = st.Live, st.Cluster, st.Devices
	for name, p := range st.Peers {
		ps := peerState{Name: name, Addr: p.Addr, Source: p.Source, SameHost: p.SameHost, Since: p.Since, Reached: p.Reached, UCX: p.UCX, UCXOneSided: p.UCXOneSided, UCXPeerFailure: p.UCXPeerFailure, UCXCarries: p.UCXCarries}
		switch {
		case ps.Source == "" || ps.Source == "peer":
			ps.Source, ps.State = "peer", "configured"
			if p.Reached != "" {
				ps.State = "reached"
			}
		case p.Self:
			ps.State = "self"
		case p.Stale:
			ps.State = "stale"
		default:
			ps.State = "live"
		}
		if p.Self && rep.Node == "" {
			rep.Node = name
		}
		rep.Peers = append(rep.Peers, ps)
	}
	sort.Slice(rep.Peers, func(i, j int) bool { return rep.Peers[i].Name < rep.Peers[j].Name })
	for _, r := range st.Transfers.Recent {
		// Running: not final (took_us is set at the end, success or not).
		if r.TookUS != 0 || r.Error != "" {
			continue
		}
		pct := -1.0
		if r.BytesTotal > 0 {
			pct = 100 * float64(r.BytesDone) / float64(r.BytesTotal)
		}
		rep.Active = append(rep.Active, transferProgress{Record: r, Percent: pct})
	}
	if st.Errors.Recent != nil {
		rep.Errors = append([]xattrs.Refusal{}, st.Errors.Recent...)
	}
	return rep, nil
}

// nodeOfMount is the node name in the mount's source ("tensorfs:NAME",
// which mount writes there), "" when it has none.
func nodeOfMount(mnt string) string {
	ms, err := readMounts()
	if err != nil {
		return ""
	}
	name := ""
	for _, m := range ms {
		if m.dir == mnt && m.fstype == cpFSType {
			// The last one on mnt is the one that serves it.
			name, _ = strings.CutPrefix(m.source, mountSourcePrefix)
			if !strings.HasPrefix(m.source, mountSourcePrefix) {
				name = ""
			}
		}
	}
	return name
}

// writeStatus prints status's text.
func writeStatus(w io.Writer, r statusReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "node:\t%s\n", orDash(r.Node))
	fmt.Fprintf(tw, "mount:\t%s\n", r.Mount)
	pct := 0.0
	if r.Device.Capacity > 0 {
		pct = 100 * float64(r.Device.Used) / float64(r.Device.Capacity)
	}
	fmt.Fprintf(tw, "default device:\t%s capacity, %s used (%.0f%%), %s free\n", humanize.IBytes(r.Device.Capacity), humanize.IBytes(r.Device.Used), pct, humanize.IBytes(r.Device.Free))
	for _, d := range r.Devices {
		dpct := 0.0
		if d.Total > 0 {
			dpct = 100 * float64(d.Used) / float64(d.Total)
		}
		fmt.Fprintf(tw, "device %s:\t%s capacity, %s used (%.0f%%)\n", d.Name, humanize.IBytes(uint64(d.Total)), humanize.IBytes(uint64(d.Used)), dpct)
	}
	fmt.Fprintf(tw, "live (all devices):\t%d %s, %s; %d exports, %d leases, %d imports, %d pins\n", r.Live.Tensors, plural(int64(r.Live.Tensors), "tensor"),
		humanize.IBytes(uint64(r.Live.Bytes)), r.Live.Exports, r.Live.Leases, r.Live.Imports, r.Live.Pins)
	if c := r.Cluster; c != nil {
		line := fmt.Sprintf("%s %s (%s), %s since %s, %d nodes", c.Backend, c.Cluster, strings.Join(c.Endpoints, ","), c.State, c.Since, c.Nodes)
		if c.Error != "" {
			line += ": " + oneLine(c.Error)
		}
		fmt.Fprintf(tw, "cluster:\t%s\n", line)
	}
	tw.Flush()

	fmt.Fprintf(w, "\npeers: %d\n", len(r.Peers))
	if len(r.Peers) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tADDRESS\tSOURCE\tSTATE\tSAME HOST\tUP SINCE\tUCX")
		for _, p := range r.Peers {
			same := "no"
			if p.SameHost {
				same = "yes"
			}
			if p.Source == "peer" && p.Since == "" && p.Reached == "" {
				same = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Addr, p.Source, p.State, same, orDash(p.Since), ucxText(p.UCX, p.UCXCarries, p.UCXOneSided && p.UCXPeerFailure))
		}
		tw.Flush()
	}

	fmt.Fprintf(w, "\ntransfers running: %d\n", len(r.Active))
	if len(r.Active) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tPATH\tSRC\tDST\tTENSORS\tPROGRESS")
		for _, t := range r.Active {
			prog := humanize.IBytes(uint64(t.BytesDone)) + " of ?"
			if t.Percent >= 0 {
				prog = fmt.Sprintf("%s of %s (%.0f%%)", humanize.IBytes(uint64(t.BytesDone)), humanize.IBytes(uint64(t.BytesTotal)), t.Percent)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%s\n", t.ID, orDash(t.Path), t.Src, t.Dst, t.Tensors, prog)
		}
		tw.Flush()
	}

	if r.Errors != nil {
		fmt.Fprintf(w, "\nrecent errors: %d\n", len(r.Errors))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if len(r.Errors) > 0 {
			fmt.Fprintln(tw, "  TIME\tPID\tPATH\tATTR\tERRNO\tREASON")
		}
		for _, e := range r.Errors {
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\n", e.Time.Format(time.RFC3339), e.PID, orDash(shown(e.Path)), orDash(shown(e.Attr)),
				orDash(e.Errno), oneLine(shown(e.Reason)))
		}
		tw.Flush()
	}
}

// ucxText is a peer's UCX column: "-" without an endpoint, its
// transports, and "(copies on tcp)" when copies do not use the endpoint,
// "(any endpoint)" when they use it although it is not guarded (one-sided
// and detecting a dead peer: --ucx-any-endpoint).
func ucxText(transports []string, carries, guarded bool) string {
	if len(transports) == 0 {
		return "-"
	}
	t := strings.Join(transports, ",")
	switch {
	case !carries:
		t += " (copies on tcp)"
	case !guarded:
		t += " (any endpoint)"
	}
	return t
}
