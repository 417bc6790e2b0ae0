package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// A worker the demo starts serves /metrics, /healthz and /status where the
// demo's event log says (issue 30: out of the box, nothing served them).
func TestAWorkerServesItsEndpointsWhereTheLogSays(t *testing.T) {
	t.Parallel()
	db := &database{url: pgtest.URL(t), schema: pgtest.NewSchema(t)}
	var log strings.Builder
	f, err := newFleet(config{buckets: 4, lease: "row", ttl: 3 * time.Second}, db, "endpoints", "account", nil)
	require.NoError(t, err)
	f.exe = demoBin
	d := &demo{cfg: config{buckets: 4}, fleet: f, out: &log}
	d.join("start")
	t.Cleanup(func() { f.killAll(); f.waitAll() })
	procs := f.all()
	require.Len(t, procs, 1)
	require.Contains(t, log.String(), "w1 started (pid ")
	require.Contains(t, log.String(), ", serving "+procs[0].serves+"/metrics, /healthz, /status")

	get := func(path string) (int, string) {
		resp, err := http.Get(procs[0].serves + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	pgtest.Eventually(t, time.Minute, func() bool {
		code, _ := get("/status")
		return code == http.StatusOK
	}, "the worker serves /status")
	pgtest.Eventually(t, time.Minute, func() bool {
		_, body := get("/status")
		return strings.Contains(body, `"subscription": "endpoints"`)
	}, "its /status shows its group")
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code, body)
	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code, body)
}
