//go:build !linux

package server

import (
	"errors"
	"net"
)

func setCork(*net.TCPConn, bool) error { return errors.New("TCP_CORK is Linux only") }
