package ringlock

import (
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT of linux/tcp.h.
const tcpUserTimeout = 0x12

// setTimeouts sets the keepalive interval and count and TCP_USER_TIMEOUT.
func setTimeouts(fd uintptr, userTimeout time.Duration) {
	socket := int(fd)
	_ = syscall.SetsockoptInt(socket, syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(keepaliveInterval/time.Second))
	_ = syscall.SetsockoptInt(socket, syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepaliveProbes)
	_ = syscall.SetsockoptInt(socket, syscall.IPPROTO_TCP, tcpUserTimeout, max(1, int(userTimeout/time.Millisecond)))
}
