package ringlock_test

// The processes the tests run: the real ringlock server and
// ringlock-testkit, each on free loopback ports, each stopped by the test
// that started it.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// patience bounds every wait of the harness, so that a broken test fails
// instead of hanging; it is never what a test asserts.
const patience = 20 * time.Second

// binary is a workspace binary (cargo build --release puts it in
// target/release), or the one the environment variable names.
func binary(name, variable string) (string, error) {
	path := os.Getenv(variable)
	if path == "" {
		path = filepath.Join("..", "..", "target", "release", name)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is missing: run clients/go/test.sh, or cargo build --release -p %s (or set %s)",
			path, name, variable)
	}
	return path, nil
}

// server is a ringlock server on a free loopback port with its own data
// directory.
type server struct {
	addr    string
	command *exec.Cmd
	data    string
	// args are more flags, kept for restart.
	args  []string
	logMu sync.Mutex
	log   []string
}

var listening = regexp.MustCompile(`listening on ([0-9.:]+)`)

// startServer starts a server; stop it with stop.
func startServer(args ...string) (*server, error) {
	path, err := binary("ringlock", "RINGLOCK_BIN")
	if err != nil {
		return nil, err
	}
	data, err := os.MkdirTemp("", "ringlock-go-")
	if err != nil {
		return nil, err
	}
	s := &server{data: data, args: args}
	if err := s.launch(path, "127.0.0.1:0"); err != nil {
		os.RemoveAll(data)
		return nil, err
	}
	return s, nil
}

// launch starts the server's process listening on listen, with the
// server's data directory, and records the address it names.
func (s *server) launch(path, listen string) error {
	args := append([]string{"--listen", listen, "--shards", "1", "--no-pin", "--data-dir", s.data}, s.args...)
	s.command = exec.Command(path, args...)
	stderr, err := s.command.StderrPipe()
	if err != nil {
		return err
	}
	if err := s.command.Start(); err != nil {
		return err
	}
	lines := bufio.NewScanner(stderr)
	address := ""
	for lines.Scan() {
		s.logMu.Lock()
		s.log = append(s.log, lines.Text())
		s.logMu.Unlock()
		if found := listening.FindStringSubmatch(lines.Text()); found != nil {
			address = found[1]
			break
		}
	}
	if address == "" {
		_ = s.command.Process.Kill()
		_ = s.command.Wait()
		return fmt.Errorf("the server exited before listening:\n%s", strings.Join(s.log, "\n"))
	}
	s.addr = address
	// Keep reading its log, so that a full pipe never stops the server.
	go func() {
		for lines.Scan() {
			s.logMu.Lock()
			s.log = append(s.log[max(0, len(s.log)-200):], lines.Text())
			s.logMu.Unlock()
		}
	}()
	return nil
}

// kill sends SIGKILL and waits for the process to be gone; the data
// directory stays, for restart.
func (s *server) kill() {
	_ = s.command.Process.Kill()
	_ = s.command.Wait()
}

// terminate sends SIGTERM (a graceful stop: queued acquires are answered
// shutting-down) and waits for the process to exit; the data directory
// stays, for restart.
func (s *server) terminate(t *testing.T) {
	t.Helper()
	if err := s.command.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s.command.Wait(); err != nil {
		t.Fatalf("the server did not exit 0 on SIGTERM: %v", err)
	}
}

// rawConnection is a plain protocol connection of its own: a holder that
// is not the client under test.
type rawConnection struct {
	conn    net.Conn
	replies *bufio.Reader
}

func newRawConnection(t *testing.T, address string) *rawConnection {
	t.Helper()
	conn, err := net.DialTimeout("tcp", address, patience)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawConnection{conn: conn, replies: bufio.NewReader(conn)}
}

// call sends line and returns the reply line.
func (r *rawConnection) call(t *testing.T, line string) string {
	t.Helper()
	_ = r.conn.SetDeadline(time.Now().Add(patience))
	if _, err := io.WriteString(r.conn, line+"\n"); err != nil {
		t.Fatal(err)
	}
	reply, err := r.replies.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(reply, "\r\n")
}

// restart starts the server again on the same address and data directory,
// and returns once it answers a real P round trip: a killed server's
// io_uring listener may accept, and drop, connections for a few ms.
func (s *server) restart(t *testing.T) {
	t.Helper()
	path, err := binary("ringlock", "RINGLOCK_BIN")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.launch(path, s.addr); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience)
	for {
		if answersPing(s.addr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted server does not answer P")
		}
		time.Sleep(time.Millisecond)
	}
}

// answersPing reports whether a P sent to address on a new connection is
// answered.
func answersPing(address string) bool {
	conn, err := net.DialTimeout("tcp", address, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(conn, "P\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "P ")
}

// refusingAddress is a loopback address that refuses connections until the
// test ends: a socket bound but not listening, so that no other test's
// server can take the port meanwhile, as it could a port merely freed.
func refusingAddress(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	name, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", name.(*syscall.SockaddrInet4).Port)
}

// newServer starts a server, with more flags if given, stopped when the
// test ends.
func newServer(t *testing.T, args ...string) *server {
	t.Helper()
	s, err := startServer(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

func (s *server) stop() {
	_ = s.command.Process.Kill()
	_ = s.command.Wait()
	os.RemoveAll(s.data)
}

// stat reads a counter of the server's S reply ("total" object) over a
// connection of its own.
func (s *server) stat(t *testing.T, name string) uint64 {
	t.Helper()
	conn, err := net.DialTimeout("tcp", s.addr, patience)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(patience))
	if _, err := io.WriteString(conn, "S\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Total map[string]json.RawMessage `json:"total"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "S ")), &stats); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	value, err := strconv.ParseUint(string(stats.Total[name]), 10, 64)
	if err != nil {
		t.Fatalf("no counter %s in %q", name, line)
	}
	return value
}

// waitUntil polls done until it holds, failing the test after patience.
// Used only where the server offers no event to wait for.
func waitUntil(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kit is a ringlock-testkit process and a control connection to it.
type kit struct {
	t       *testing.T
	command *exec.Cmd
	stdin   io.WriteCloser
	control string
	conn    net.Conn
	reader  *bufio.Reader
}

var controlLine = regexp.MustCompile(`^ringlock-testkit control (\S+)`)

// newKit starts the test kit, stopped when the test ends: its standard
// input stays open until then, since the kit exits when it closes.
func newKit(t *testing.T) *kit {
	t.Helper()
	path, err := binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN")
	if err != nil {
		t.Fatal(err)
	}
	k := &kit{t: t, command: exec.Command(path)}
	k.stdin, err = k.command.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := k.command.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.command.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	found := controlLine.FindStringSubmatch(line)
	if found == nil {
		t.Fatalf("ringlock-testkit did not start: %q, %v", line, err)
	}
	k.control = found[1]
	k.conn, k.reader = k.dialControl()
	return k
}

func (k *kit) dialControl() (net.Conn, *bufio.Reader) {
	conn, err := net.DialTimeout("tcp", k.control, patience)
	if err != nil {
		k.t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

func (k *kit) stop() {
	if k.conn != nil {
		k.conn.Close()
	}
	k.stdin.Close()
	done := make(chan struct{})
	go func() {
		_ = k.command.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(patience):
		_ = k.command.Process.Kill()
		<-done
	}
}

// call sends one control command and returns the fields of its ok reply;
// safe to call from one goroutine at a time (use another kit connection
// for concurrent waits).
func (k *kit) call(format string, args ...any) []string {
	k.t.Helper()
	command := fmt.Sprintf(format, args...)
	_ = k.conn.SetDeadline(time.Now().Add(2 * patience))
	if _, err := io.WriteString(k.conn, command+"\n"); err != nil {
		k.t.Fatalf("%s: %v", command, err)
	}
	line, err := k.reader.ReadString('\n')
	if err != nil {
		k.t.Fatalf("%s: %v", command, err)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != "ok" {
		k.t.Fatalf("%s: %s", command, strings.TrimSpace(line))
	}
	return fields[1:]
}

// start starts a proxy or a fake; its id and address.
func (k *kit) start(format string, args ...any) (id, addr string) {
	k.t.Helper()
	fields := k.call(format, args...)
	if len(fields) != 2 {
		k.t.Fatalf("expected an id and an address: %v", fields)
	}
	return fields[0], fields[1]
}

// count runs a command whose reply is a number.
func (k *kit) count(format string, args ...any) int {
	k.t.Helper()
	fields := k.call(format, args...)
	n, err := strconv.Atoi(fields[0])
	if err != nil {
		k.t.Fatalf("not a count: %v", fields)
	}
	return n
}

// makeCerts writes a fresh set of test certificates with ringlock-testkit
// certs into a directory removed when the test ends; its path.
func makeCerts(t *testing.T) string {
	t.Helper()
	path, err := binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if output, err := exec.Command(path, "certs", dir).CombinedOutput(); err != nil {
		t.Fatalf("ringlock-testkit certs: %v: %s", err, output)
	}
	return dir
}

// tlsArgs are the server flags for TLS with the certificate <name>.pem of
// dir and its key.
func tlsArgs(dir, name string) []string {
	return []string{"--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem")}
}

// recorder is a loopback forwarder to a target that keeps the bytes each
// client connection sent through it, to check what crossed the wire.
type recorder struct {
	addr     string
	listener net.Listener
	mu       sync.Mutex
	sent     []*[]byte
	conns    []net.Conn
}

// newRecorder starts a recorder to target, closed when the test ends.
func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{addr: listener.Addr().String(), listener: listener}
	t.Cleanup(r.close)
	go func() {
		for {
			client, err := listener.Accept()
			if err != nil {
				return
			}
			upstream, err := net.DialTimeout("tcp", target, patience)
			if err != nil {
				client.Close()
				continue
			}
			record := new([]byte)
			r.mu.Lock()
			r.sent = append(r.sent, record)
			r.conns = append(r.conns, client, upstream)
			r.mu.Unlock()
			go r.pump(client, upstream, record)
			go r.pump(upstream, client, nil)
		}
	}()
	return r
}

func (r *recorder) pump(source, sink net.Conn, record *[]byte) {
	buffer := make([]byte, 64*1024)
	for {
		n, err := source.Read(buffer)
		if n > 0 {
			if record != nil {
				r.mu.Lock()
				*record = append(*record, buffer[:n]...)
				r.mu.Unlock()
			}
			if _, err := sink.Write(buffer[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	source.Close()
	sink.Close()
}

// connections is what each client connection sent so far, in accept order.
func (r *recorder) connections() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([][]byte, 0, len(r.sent))
	for _, record := range r.sent {
		out = append(out, append([]byte(nil), *record...))
	}
	return out
}

func (r *recorder) close() {
	r.listener.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, conn := range r.conns {
		conn.Close()
	}
}

// handedOut holds the ports freePort gave: the kernel may offer a port it
// just released again, and a cluster asks for several in a row.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort is a free loopback address: a port bound, read and released.
func freePort(t *testing.T) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for {
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := listener.Addr().(*net.TCPAddr).Port
		listener.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return fmt.Sprintf("127.0.0.1:%d", port)
		}
	}
}

// pingLine is the reply to P sent to address on a new connection, or ""
// if the node does not answer within half a second.
func pingLine(address string) string {
	conn, err := net.DialTimeout("tcp", address, 500*time.Millisecond)
	if err != nil {
		return ""
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := io.WriteString(conn, "P\n"); err != nil {
		return ""
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimRight(line, "\r\n")
}

// cluster is a cluster of real ringlock nodes on free loopback ports
// (docs/protocol.md section 5), each with its own data directory and log
// file; addrs are the nodes' client addresses in priority order. Heartbeats
// every 50 ms and a failover timeout of 500 ms, as the workspace's cluster
// tests.
type cluster struct {
	t     *testing.T
	addrs []string
	nodes []*exec.Cmd
	dir   string
}

// newCluster starts count nodes at once and waits until each answers P;
// every node is killed when the test ends.
func newCluster(t *testing.T, count int) *cluster {
	t.Helper()
	path, err := binary("ringlock", "RINGLOCK_BIN")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ringlock-go-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, dir: dir, nodes: make([]*exec.Cmd, count)}
	t.Cleanup(c.stop)
	peers := make([]string, count)
	members := make([]string, count)
	for index := range count {
		c.addrs = append(c.addrs, freePort(t))
		peers[index] = freePort(t)
		members[index] = c.addrs[index] + "@" + peers[index]
	}
	for index := range count {
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("node-%d.log", index)))
		if err != nil {
			t.Fatal(err)
		}
		command := exec.Command(path, "--listen", c.addrs[index], "--peers", strings.Join(members, ","),
			"--node", strconv.Itoa(index), "--cluster-listen", peers[index], "--heartbeat-ms", "50",
			"--failover-ms", "500", "--shards", "1", "--no-pin",
			"--data-dir", filepath.Join(dir, fmt.Sprintf("data-%d", index)))
		command.Stderr = log
		err = command.Start()
		log.Close()
		if err != nil {
			t.Fatal(err)
		}
		c.nodes[index] = command
	}
	for index, address := range c.addrs {
		waitUntil(t, fmt.Sprintf("node %d to answer P", index), func() bool { return pingLine(address) != "" })
	}
	return c
}

// logs is the tail of every node's log, for a failure message.
func (c *cluster) logs() string {
	var text strings.Builder
	for index, address := range c.addrs {
		log, _ := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("node-%d.log", index)))
		lines := strings.Split(string(log), "\n")
		fmt.Fprintf(&text, "--- node %d (%s):\n%s\n", index, address, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return text.String()
}

// singleActive is the index of the only active node if every other running
// node is a standby naming it, else -1.
func (c *cluster) singleActive() int {
	lines := make([]string, len(c.addrs))
	active := -1
	for index, address := range c.addrs {
		if c.nodes[index] == nil {
			continue
		}
		lines[index] = pingLine(address)
		if strings.HasPrefix(lines[index], "P active ") {
			if active >= 0 {
				return -1
			}
			active = index
		}
	}
	if active < 0 {
		return -1
	}
	for index, line := range lines {
		if index == active || c.nodes[index] == nil {
			continue
		}
		if !strings.HasPrefix(line, "P standby ") || !strings.HasSuffix(line, " "+c.addrs[active]) {
			return -1
		}
	}
	return active
}

// waitSingleActive waits until one node is active and the others follow
// it, and returns its index.
func (c *cluster) waitSingleActive(what string) int {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if active := c.singleActive(); active >= 0 {
			return active
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s\n%s", what, c.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// table is the (stream, version) of node index's lock table, from S.
func (c *cluster) table(index int) (uint64, uint64) {
	c.t.Helper()
	conn, err := net.DialTimeout("tcp", c.addrs[index], patience)
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(patience))
	if _, err := io.WriteString(conn, "S\n"); err != nil {
		c.t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		c.t.Fatal(err)
	}
	var stats struct {
		Table struct {
			Stream  uint64 `json:"stream"`
			Version uint64 `json:"version"`
		} `json:"table"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "S ")), &stats); err != nil {
		c.t.Fatalf("%q: %v", line, err)
	}
	return stats.Table.Stream, stats.Table.Version
}

// waitReplicated waits until the active's table version has grown past
// since (its version before the grant to wait for: the version counts a
// grant once the replication core took it, not when it was granted), then
// until every running standby has applied the active's table up to that
// version: the grant has reached them.
func (c *cluster) waitReplicated(active int, since uint64) {
	c.t.Helper()
	var stream, version uint64
	waitUntil(c.t, fmt.Sprintf("node %d's table version to grow past %d", active, since), func() bool {
		stream, version = c.table(active)
		return version > since
	})
	for index := range c.addrs {
		if index == active || c.nodes[index] == nil {
			continue
		}
		waitUntil(c.t, fmt.Sprintf("node %d to apply stream %d up to version %d", index, stream, version), func() bool {
			appliedStream, applied := c.table(index)
			return appliedStream == stream && applied >= version
		})
	}
}

// kill sends node index SIGKILL and waits for it to be gone.
func (c *cluster) kill(index int) {
	if command := c.nodes[index]; command != nil {
		_ = command.Process.Kill()
		_ = command.Wait()
		c.nodes[index] = nil
	}
}

func (c *cluster) stop() {
	for index := range c.nodes {
		c.kill(index)
	}
	os.RemoveAll(c.dir)
}
