package eventsource_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter reads the CPU time used so far by this process and by the
// PostgreSQL server (the postmaster and its children: backends, WAL
// writer, autovacuum…), from /proc. The server part works only when the
// server runs on this machine (the throwaway one does); otherwise it
// reads -1.
type cpuMeter struct{ postmaster int }

func newCPUMeter(ctx context.Context, pool *pgxpool.Pool) cpuMeter {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return cpuMeter{postmaster: -1}
	}
	pm, _ := procStat(strconv.Itoa(backend))
	return cpuMeter{postmaster: pm}
}

// procStat returns a process's parent and its user+system CPU seconds.
func procStat(pid string) (ppid int, cpu float64) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1, 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return -1, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return ppid, (utime + stime) / 100 // clock ticks: 100 per second on Linux
}

// server returns the server's CPU seconds so far, or -1.
func (m cpuMeter) server() float64 {
	if m.postmaster <= 0 {
		return -1
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	total := 0.0
	for _, d := range dirs {
		pid := filepath.Base(d)
		ppid, cpu := procStat(pid)
		if pid == strconv.Itoa(m.postmaster) || ppid == m.postmaster {
			total += cpu
		}
	}
	return total
}

// client returns this process's CPU seconds so far.
func (cpuMeter) client() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// sample is a pair of readings.
type cpuSample struct{ server, client float64 }

func (m cpuMeter) now() cpuSample { return cpuSample{m.server(), m.client()} }

// add accumulates the CPU used since from into acc.
func (m cpuMeter) add(acc *cpuSample, from cpuSample) {
	to := m.now()
	if from.server >= 0 && to.server >= 0 {
		acc.server += to.server - from.server
	} else {
		acc.server = -1
	}
	acc.client += to.client - from.client
}
