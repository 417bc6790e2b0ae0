package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
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
	require.Contains(t, r.stderr, "--token")
	require.Contains(t, r.stderr, "16 to 256 bytes")
	require.NotContains(t, r.stderr, "short\n")
}

// The hole: `--listen 0.0.0.0:PORT --allow-actions` without a token
// served, and only warned, so a client on another machine could reset a
// checkpoint.
func TestConsoleRefusesToServeBeyondLoopbackWithoutAToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "console", "--listen", "0.0.0.0:0", "--allow-actions")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "without a token")
	require.Contains(t, r.stderr, "reset checkpoints")
	require.NotContains(t, r.stderr, "--allow-reads-without-token", "with actions, nothing lets it")

	r = b.run(t, "console", "--listen", ":0")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "--allow-reads-without-token")

	r = b.run(t, "console", "--listen", "0.0.0.0:0", "--allow-actions", "--allow-reads-without-token")
	require.Equal(t, exitUsage, r.code, r.stderr)
}

// --token-file and TLS: the token stays out of ps, and out of the wire in
// clear.
func TestConsoleServesHTTPSWithATokenFromAFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	const token = "0123456789abcdef-from-a-file"
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))

	r := b.run(t, "console", "--token-file", tokenFile, "--token", token)
	require.Equal(t, exitUsage, r.code, "the token once: %s", r.stderr)
	r = b.run(t, "console", "--tls-cert", certFile)
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "--tls-key")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kumiBin, "console", "--listen", "127.0.0.1:0", "--token-file", tokenFile,
		"--tls-cert", certFile, "--tls-key", keyFile, "--allow-actions")
	cmd.Env = cleanEnv(b.env)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr.String())
	url := regexp.MustCompile(`https://127\.0\.0\.1:\d+/`).FindString(line)
	require.NotEmpty(t, url, line)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	status := func(auth string) int {
		req, err := http.NewRequest(http.MethodGet, url+"api/overview", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, status(""))
	require.Equal(t, http.StatusOK, status(token))
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "stderr: %s", stderr.String())
	require.NotContains(t, line+stderr.String(), token)
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir, and
// returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kumi console test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// docs/operations.md's read-only role (USAGE on the schema, SELECT on its
// tables) runs kumi status and dead-letters list, and cannot reset a checkpoint (the console
// under it: console.TestTheConsoleRunsUnderAReadOnlyRole).
func TestStatusRunsUnderAReadOnlyRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := b.lease(t, "orders", "worker-a", 2).Pass(ctx)
	require.NoError(t, err)
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	role := fmt.Sprintf("kumi_ro_%x", rnd)
	pool := pgtest.Pool(t)
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE ON SCHEMA " + b.schema + " TO " + role,
		"GRANT SELECT ON ALL TABLES IN SCHEMA " + b.schema + " TO " + role,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	u, err := neturl.Parse(pgtest.URL(t))
	require.NoError(t, err)
	u.User = neturl.User(role)
	env := []string{"DATABASE_URL=" + u.String(), "KUMI_SCHEMA=" + b.schema}

	r := kumi(t, env, "status", "-s", "orders")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "worker-a")
	r = kumi(t, env, "dead-letters", "list", "-s", "orders")
	require.Equal(t, 0, r.code, r.stderr)
	r = kumi(t, env, "checkpoints", "reset", "-s", "orders", "--bucket", "0", "--position", "0", "--force")
	require.NotEqual(t, 0, r.code, "the role cannot write: %s", r.stdout)
	require.Contains(t, r.stderr, "permission denied")
}
