package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConsoleServesReadOnlyOnLoopbackAndStopsOnSIGINT(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := b.lease(t, "orders", "worker-a", 2).Pass(ctx)
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, kumiBin, "console", "--listen", "127.0.0.1:0", "-c", "orders=acct")
	cmd.Env = cleanEnv(b.env)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())

	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Contains(t, line, "read-only")
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`).FindString(line)
	require.NotEmpty(t, url, "the address it serves on: %q", line)

	resp, err := http.Get(url + "api/s/orders")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `"owner":"worker-a"`)
	require.Contains(t, string(body), `"category":"acct"`)

	req, err := http.NewRequest(http.MethodGet, url+"api/s/orders", nil)
	require.NoError(t, err)
	req.Host = "rebind.example:7070"
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "on loopback, only loopback host names (DNS rebinding)")

	resp, err = http.Post(url+"api/s/orders/buckets/0/relinquish", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only unless --allow-actions")

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "stderr: %s", stderr.String())
	for _, kv := range b.env {
		if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
			require.NotContains(t, line+stderr.String(), v, "the connection string is never printed")
		}
	}
}

func TestConsoleRefusesABadToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "console", "--token", "short")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "Token")
	require.Contains(t, r.stderr, "16 to 256 bytes")
	require.NotContains(t, r.stderr, "short\n")
}
