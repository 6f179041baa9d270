package nodeagent

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strconv"
	"syscall"
)

// signalContainer sends sig to every process of the container whose main process is pid: its
// session (launch makes it a session leader), across the process groups inside it, as a
// runtime's cgroup kill reaches every process of a container. SIGTERM is the kubelet's to PID
// 1 alone; this is for SIGKILL and for a test's SIGSTOP or SIGKILL of the whole container.
//
// The members are read before any is signalled, then signalled together, then read again for
// any started meanwhile: signalled as a scan of /proc found them, a supervisor could die a
// scan's time before its worker and its gang act in between (the likely cause of a gang that
// stopped and saved after a rank was killed, in CI's chaos run).
func signalContainer(pid int, sig syscall.Signal) error {
	members, rerr := sessionMembers(pid)
	if rerr != nil {
		return errors.Join(syscall.Kill(-pid, sig), rerr)
	}
	err := syscall.Kill(-pid, sig)
	for _, p := range members {
		_ = syscall.Kill(p, sig) // gone meanwhile is fine
	}
	later, _ := sessionMembers(pid)
	for _, p := range later {
		if !slices.Contains(members, p) {
			_ = syscall.Kill(p, sig)
		}
	}
	return err
}

// sessionMembers are the processes of pid's session, pid aside.
func sessionMembers(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		p, perr := strconv.Atoi(e.Name())
		if perr != nil || p == pid {
			continue
		}
		if sid, ok := sessionOf(p); ok && sid == pid {
			out = append(out, p)
		}
	}
	return out, nil
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
