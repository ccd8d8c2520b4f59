//go:build !linux

package ringlock

import "time"

// setTimeouts does nothing where TCP_USER_TIMEOUT is not known.
func setTimeouts(fd uintptr, userTimeout time.Duration) {}
