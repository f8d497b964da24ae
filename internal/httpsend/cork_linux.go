package httpsend

import (
	"net"
	"syscall"
)

func setCork(c *net.TCPConn, on bool) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	v := 0
	if on {
		v = 1
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		sockErr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, v)
	}); err != nil {
		return err
	}
	return sockErr
}
