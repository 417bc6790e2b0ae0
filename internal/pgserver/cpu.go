package pgserver

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CPUSeconds returns the CPU time (user and system) the server's processes
// have used since it started: the postmaster's own, its reaped children's
// (backends of closed connections, counted by the kernel when they exit)
// and its running children's (backends, WAL writer, checkpointer,
// autovacuum, WAL sender or receiver, startup process), from /proc. It
// counts from the last (re)start.
func (s *Server) CPUSeconds() (float64, error) {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0, errors.New("pgserver: the server is not running")
	}
	pm := s.cmd.Process.Pid
	f, err := procStat(pm)
	if err != nil {
		return 0, err
	}
	total := f.utime + f.stime + f.cutime + f.cstime
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == pm {
			continue
		}
		if c, err := procStat(pid); err == nil && c.ppid == pm {
			total += c.utime + c.stime
		}
	}
	return total, nil
}

type procFields struct {
	ppid                         int
	utime, stime, cutime, cstime float64 // seconds
}

// procStat reads /proc/pid/stat's parent and CPU times.
func procStat(pid int) (procFields, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procFields{}, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return procFields{}, errors.New("pgserver: short /proc stat line")
	}
	var out procFields
	out.ppid, _ = strconv.Atoi(f[1])
	ticks := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v / 100 } // USER_HZ is 100 on Linux
	out.utime, out.stime, out.cutime, out.cstime = ticks(11), ticks(12), ticks(13), ticks(14)
	return out, nil
}
