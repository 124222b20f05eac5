package evloop

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loop's reads, writes and harvests are raw system calls. Every socket
// it touches is non-blocking and a harvest waits for nothing (timeout 0),
// so none of them blocks; telling the scheduler about each
// (entersyscall/exitsyscall, which let another thread take the processor
// of a call that blocks) is wasted on them. That was ~3 % of hearthd's CPU
// at c=1 000, three calls a token (BENCHMARKS.md).

// Read reads from fd, a non-blocking socket, as read(2) does. n is -1 with
// an error.
func Read(fd int, p []byte) (n int, err error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	return result(r, e)
}

// Write writes to fd, a non-blocking socket, as write(2) does. n is -1
// with an error.
func Write(fd int, p []byte) (n int, err error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	return result(r, e)
}

// harvest takes the events ready on epfd without waiting (epoll_pwait
// with timeout 0, which every architecture has).
func harvest(epfd int, events []unix.EpollEvent) (n int, err error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	return result(r, e)
}

func result(r uintptr, e unix.Errno) (int, error) {
	if e != 0 {
		return -1, e // an Errno below 256 converts without allocating
	}
	return int(r), nil
}

// SocketFD is c's descriptor, if c is a socket (not TLS), for Read and
// Write. It stays c's: valid while c is open.
func SocketFD(c net.Conn) (int, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	fd := -1
	if rc.Control(func(s uintptr) { fd = int(s) }) != nil || fd < 0 {
		return 0, false
	}
	return fd, true
}
