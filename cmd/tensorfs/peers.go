package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/tensorfs/tensorfs/fs"
	"github.com/tensorfs/tensorfs/transfer"
)

// peerFlags are the mount flags of the peer service.
type peerFlags struct {
	name, listen, secretFile, hostID string
	transport, checksum              string
	peers                            []string
	timeout, idle, spin              time.Duration
	streams                          int
	anyEndpoint                      bool
	flags                            *pflag.FlagSet
}

func (p *peerFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.name, "name", "", "this node's name in peer paths (default: the hostname)")
	f.StringVar(&p.listen, "listen", "", "HOST:PORT to accept peers on")
	f.StringArrayVar(&p.peers, "peer", nil, "a peer as NAME=HOST:PORT (repeatable)")
	f.StringVar(&p.secretFile, "secret-file", "", "file holding the shared peer secret (>= 16 bytes, mode 0600)")
	f.StringVar(&p.hostID, "host-id", "", "host identity (default: the kernel's boot id)")
	f.DurationVar(&p.timeout, "timeout", 10*time.Second, "how long a copy waits on a silent peer")
	f.DurationVar(&p.idle, "idle-timeout", transfer.DefaultIdleTimeout, "how long a connection to a peer is kept open after a copy, for the next one")
	f.IntVar(&p.streams, "streams", transfer.DefaultStreams, fmt.Sprintf("parallel TCP streams per large copy (1 to %d)", transfer.MaxStreams))
	f.StringVar(&p.transport, "transport", "auto", "how copies with peers on other hosts move their bytes: auto (one-sided on UCX with a peer whose endpoint reaches registered memory by itself and detects a dead peer: RDMA verbs; else tensorfs's TCP streams), tcp (no UCX) or ucx (UCX only: a peer without it, or without such an endpoint, is an error, EPROTONOSUPPORT); with UCX every host-memory region is mapped and its rkey is user.tensorfs.rkey; GPU memory stages through host memory")
	f.BoolVar(&p.anyEndpoint, "ucx-any-endpoint", false, "move copies' bytes on any UCX endpoint to a peer of another host, also one that is not one-sided (UCX's tcp, and its shared memory in UCX 1.13: puts and gets emulated with messages the peer serves) or cannot detect a dead peer (shared memory): for trying and testing the UCX path without RDMA; a peer killed mid-copy can then stall this daemon's UCX worker or abort this daemon or the peer")
	f.StringVar(&p.checksum, "checksum", "xxh3", "the check of a TCP copy's bytes, each chunk's sum checked by the receiver: xxh3 (XXH3's low 32 bits; CRC32C with a peer that runs crc32c or predates xxh3), crc32c, or none (TCP's own checksum only; a copy goes without only when both nodes say none). Chunks are summed where they lie, in a host-memory source's and destination's memory; a mismatch there runs the copy again from buffers, where one is an error")
	f.DurationVar(&p.spin, "spin", transfer.DefaultSpin, "how long a peer connection polls for its next frame before it sleeps (0: never; hosts of fewer than 4 CPUs default to 0)")
	p.flags = f
}

// spinFor is --spin: as given, else DefaultSpin on a host of at least 4
// CPUs and 0 on a smaller one (a spinning reader there takes the core the
// peer or the caller needs).
func (p *peerFlags) spinFor(cpus int) time.Duration {
	if p.flags != nil && p.flags.Changed("spin") {
		return p.spin
	}
	if cpus < fs.SmallHostCPUs {
		return 0
	}
	return p.spin
}

// checkNodeName refuses a node name that a peer path, the mount's source
// (tensorfs:NAME, between mount options split at commas) or a log line
// could not carry: empty, over 64 bytes, starting with '-' (a flag), or
// holding ':', '/', ',', '\', white space or a control character.
func checkNodeName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty")
	case len(name) > 64:
		return fmt.Errorf("longer than 64 bytes")
	case name[0] == '-':
		return fmt.Errorf("starts with '-'")
	}
	for _, r := range name {
		if r <= ' ' || r == 0x7f || strings.ContainsRune(":/,\\", r) || unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("no ':', '/', ',', '\\', spaces or control characters (%q)", r)
		}
	}
	return nil
}

// config builds the peer service configuration. Errors: a malformed --peer,
// an unreadable secret file, one readable by group or others (as ssh refuses
// such keys), or one under 16 bytes.
func (p *peerFlags) config() (transfer.Config, error) {
	cfg := transfer.Config{Name: p.name, Listen: p.listen, HostID: p.hostID, Timeout: p.timeout, IdleTimeout: p.idle, Streams: p.streams, Spin: p.spinFor(runtime.NumCPU()), RMAAnyEndpoint: p.anyEndpoint, Peers: map[string]string{}}
	if cfg.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return cfg, fmt.Errorf("--name not given and no hostname: %v", err)
		}
		cfg.Name = h
	}
	if err := checkNodeName(cfg.Name); err != nil {
		return cfg, fmt.Errorf("--name %q: %v", cfg.Name, err)
	}
	switch p.transport {
	case "auto", "tcp", "ucx":
	default:
		return cfg, fmt.Errorf("--transport %q: want auto, tcp or ucx", p.transport)
	}
	sum, err := transfer.ParseChecksum(p.checksum)
	if err != nil {
		return cfg, fmt.Errorf("--checksum %v", err)
	}
	cfg.Checksum = sum
	if cfg.HostID == "" {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return cfg, fmt.Errorf("--host-id not given and no boot id: %v", err)
		}
		cfg.HostID = strings.TrimSpace(string(b))
	}
	for _, pe := range p.peers {
		name, addr, ok := strings.Cut(pe, "=")
		if !ok || name == "" || addr == "" {
			return cfg, fmt.Errorf("--peer %q: want NAME=HOST:PORT", pe)
		}
		if err := checkNodeName(name); err != nil {
			return cfg, fmt.Errorf("--peer %q: name %q: %v", pe, name, err)
		}
		if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
			return cfg, fmt.Errorf("--peer %q: %q is not HOST:PORT", pe, addr)
		}
		cfg.Peers[name] = addr
	}
	if p.timeout <= 0 {
		return cfg, fmt.Errorf("--timeout %v: must be positive", p.timeout)
	}
	if p.idle <= 0 {
		return cfg, fmt.Errorf("--idle-timeout %v: must be positive", p.idle)
	}
	if p.spin < 0 || p.spin > time.Second {
		return cfg, fmt.Errorf("--spin %v: want 0 to 1s", p.spin)
	}
	if p.streams < 1 || p.streams > transfer.MaxStreams {
		return cfg, fmt.Errorf("--streams %d: want 1 to %d", p.streams, transfer.MaxStreams)
	}
	if p.secretFile != "" {
		st, err := os.Stat(p.secretFile)
		if err != nil {
			return cfg, fmt.Errorf("--secret-file: %v", err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			return cfg, fmt.Errorf("--secret-file %s is readable by group or others (mode %04o): chmod 600 it", p.secretFile, st.Mode().Perm())
		}
		b, err := os.ReadFile(p.secretFile)
		if err != nil {
			return cfg, fmt.Errorf("--secret-file: %v", err)
		}
		b = bytes.TrimSuffix(b, []byte("\n"))
		if len(b) < 16 {
			return cfg, fmt.Errorf("--secret-file %s holds %d bytes; at least 16 are needed", p.secretFile, len(b))
		}
		cfg.Secret = b
	}
	return cfg, nil
}
