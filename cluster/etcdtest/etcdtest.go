// Package etcdtest runs a real etcd server for tests: Debian's etcd-server
// (/usr/bin/etcd, or $TENSORFS_ETCD), on loopback, with a temporary data
// directory and free ports, stopped in the test's cleanup.
package etcdtest

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorfs/tensorfs/internal/testutil"
)

// Options are a Server's extras.
type Options struct {
	// CertFile and KeyFile, when set, serve the client URL over TLS
	// (https) with this certificate (which must also allow client auth:
	// the health check presents it), and CAFile then requires client
	// certificates signed by that CA.
	CertFile, KeyFile, CAFile string
}

// Server is one etcd process (a single-member cluster).
type Server struct {
	// Endpoint is its client URL, http://127.0.0.1:PORT (https:// with
	// Options.CertFile).
	Endpoint string
	opt      Options
	t        testing.TB
	bin, dir string
	peerURL  string
	mu       sync.Mutex
	cmd      *exec.Cmd
	exit     chan error
	log      *testutil.SyncBuffer
}

// Binary is the etcd server to run: $TENSORFS_ETCD, else etcd on $PATH or
// /usr/bin/etcd; "" when there is none.
func Binary() string {
	if b := os.Getenv("TENSORFS_ETCD"); b != "" {
		return b
	}
	if b, err := exec.LookPath("etcd"); err == nil {
		return b
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd"
	}
	return ""
}

// Start runs etcd and waits (20 s at most) until it answers /health; the
// test is skipped, saying why, when no etcd is installed, and fails when it
// does not start. Its heartbeat is 50 ms and election timeout 500 ms, so
// that leases of 1 s are honoured (etcd's minimum TTL is 1.5 election
// timeouts). Stopped at the test's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options (TLS).
func StartWith(t testing.TB, opt Options) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip("no etcd server (apt-get install etcd-server, or set $TENSORFS_ETCD)")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), opt: opt}
	scheme := "http"
	if opt.CertFile != "" {
		scheme = "https"
	}
	var err error
	for try := 0; try < 5; try++ {
		c, p := testutil.FreePort(t), testutil.FreePort(t)
		s.Endpoint = fmt.Sprintf("%s://127.0.0.1:%d", scheme, c)
		s.peerURL = fmt.Sprintf("http://127.0.0.1:%d", p)
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
		os.RemoveAll(s.dir)
		os.MkdirAll(s.dir, 0o700)
	}
	t.Fatalf("etcd did not start: %v", err)
	return nil
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = &testutil.SyncBuffer{}
	args := []string{"--name", "t", "--data-dir", s.dir,
		"--listen-client-urls", s.Endpoint, "--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", s.peerURL, "--initial-advertise-peer-urls", s.peerURL,
		"--initial-cluster", "t=" + s.peerURL, "--heartbeat-interval", "50", "--election-timeout", "500",
		"--log-level", "warn"}
	cl := http.Client{Timeout: time.Second}
	if s.opt.CertFile != "" {
		args = append(args, "--cert-file", s.opt.CertFile, "--key-file", s.opt.KeyFile)
		tc := &tls.Config{InsecureSkipVerify: true}
		if s.opt.CAFile != "" {
			args = append(args, "--trusted-ca-file", s.opt.CAFile, "--client-cert-auth")
			cert, err := tls.LoadX509KeyPair(s.opt.CertFile, s.opt.KeyFile)
			if err != nil {
				return err
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cl.Transport = &http.Transport{TLSClientConfig: tc}
	}
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exit = make(chan error, 1)
	go func(cmd *exec.Cmd, exit chan error) { exit <- cmd.Wait() }(s.cmd, s.exit)
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-s.exit:
			s.cmd = nil
			return fmt.Errorf("etcd exited: %v\n%s", err, s.log.String())
		default:
		}
		if resp, err := cl.Get(s.Endpoint + "/health"); err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if strings.Contains(b.String(), `"health":"true"`) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Kill()
			<-s.exit
			s.cmd = nil
			return fmt.Errorf("etcd not healthy within 20s\n%s", s.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends etcd (SIGTERM, then SIGKILL after 10 s); nothing when it is not
// running. Its data directory stays for Restart.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exit:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.exit
	}
	s.cmd = nil
}

// Restart starts the stopped server again on the same ports and data (its
// records and leases survive; etcd renews every lease's TTL on start).
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("etcd did not restart: %v", err)
	}
}

// Log is what etcd printed.
func (s *Server) Log() string { return s.log.String() }
