//go:build !linux

package httpsend

import (
	"errors"
	"net"
)

func setCork(*net.TCPConn, bool) error { return errors.New("TCP_CORK is Linux only") }
