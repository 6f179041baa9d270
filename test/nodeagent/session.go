package nodeagent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// signalContainer sends sig to every process of the container whose main process is pid: its
// session (launch makes it a session leader), across the process groups inside it, as a
// runtime's cgroup kill reaches every process of a container. SIGTERM is the kubelet's to PID
// 1 alone; this is for SIGKILL and for a test's SIGSTOP or SIGKILL of the whole container.
func signalContainer(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	entries, rerr := os.ReadDir("/proc")
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	for _, e := range entries {
		p, perr := strconv.Atoi(e.Name())
		if perr != nil || p == pid {
			continue
		}
		if sid, ok := sessionOf(p); ok && sid == pid {
			_ = syscall.Kill(p, sig) // gone meanwhile is fine
		}
	}
	return err
}

// sessionOf reads a process's session id from /proc/<pid>/stat.
func sessionOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return 0, false
	}
	sid, err := strconv.Atoi(string(f[3]))
	return sid, err == nil
}
