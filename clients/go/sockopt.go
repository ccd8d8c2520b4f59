package ringlock

import (
	"net"
	"time"
)

// TCP keepalive of client sockets: probes start after keepaliveIdle of
// quiet, every keepaliveInterval, keepaliveProbes of them (Linux; elsewhere
// the system's interval and count).
const (
	keepaliveIdle     = 5 * time.Second
	keepaliveInterval = time.Second
	keepaliveProbes   = 3
)

// tuneSocket turns on TCP keepalive and, where the system has it,
// TCP_USER_TIMEOUT (data left unacknowledged for userTimeout fails the
// socket); what the system lacks is skipped, and a failure to set an
// option leaves the socket as it was.
func tuneSocket(conn net.Conn, userTimeout time.Duration) {
	tcp, ok := conn.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tcp.SetKeepAlive(true)
	_ = tcp.SetKeepAlivePeriod(keepaliveIdle)
	raw, err := tcp.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) { setTimeouts(fd, userTimeout) })
}
