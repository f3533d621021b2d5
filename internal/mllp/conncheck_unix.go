//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos || aix

package mllp

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
)

var errUnexpectedRead = errors.New("mllp: unexpected data on idle connection")

// connCheck reports whether an idle connection has been closed or reset by
// the peer, or has received data nobody asked for, without blocking: Go
// keeps sockets in non-blocking mode, so a direct read returns EAGAIN when
// the connection is merely quiet. Connections that do not expose a file
// descriptor (pipes) are assumed healthy.
//
// A TLS connection is checked on its socket with MSG_PEEK, which consumes
// nothing: pending bytes may be a record the TLS layer still has to read,
// such as the close_notify alert of a peer closing on its idle timeout, and
// either way the connection is no place for the next message. Redialing is
// always safe, since nothing has been sent yet.
func connCheck(conn net.Conn) error {
	flags := 0
	if tc, ok := conn.(*tls.Conn); ok {
		conn, flags = tc.NetConn(), syscall.MSG_PEEK
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var checkErr error
	err = raw.Read(func(fd uintptr) bool {
		var buf [1]byte
		n, _, err := syscall.Recvfrom(int(fd), buf[:], flags)
		switch {
		case n == 0 && err == nil:
			checkErr = io.EOF
		case n > 0:
			checkErr = errUnexpectedRead
		case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK):
			checkErr = nil
		default:
			checkErr = err
		}
		return true // never wait for readability
	})
	if err != nil {
		return err
	}
	return checkErr
}
