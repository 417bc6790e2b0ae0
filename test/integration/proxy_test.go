package integration

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// proxy is a TCP proxy between one worker and the database, on loopback,
// that can cut the worker off:
//
//   - blackhole: every byte either way vanishes, on open connections and on
//     new ones, while both ends stay connected (the server still sees the
//     sessions, so a session lock stays held); heal closes those
//     connections, as timeouts would end them in a real partition;
//   - drop: every connection is closed at once and new ones are refused
//     until heal (the server sees the sessions end).
type proxy struct {
	ln     net.Listener
	target string
	url    string

	mu        sync.Mutex
	blackhole bool
	drop      bool
	links     map[*link]struct{}
	closed    bool
	wg        sync.WaitGroup
}

type link struct {
	client net.Conn
	frozen bool // under proxy.mu

	mu     sync.Mutex
	server net.Conn
	closed bool
}

func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}

// setServer attaches the server side, or closes it if the link is closed.
func (l *link) setServer(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = s.Close()
		return false
	}
	l.server = s
	return true
}

// newProxy listens on a free loopback port in front of the server of
// connString and returns the proxy, whose url is connString pointed at it.
func newProxy(connString string) (*proxy, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	p := &proxy{
		ln:     ln,
		target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
		url:    pointAt(connString, "127.0.0.1", port),
		links:  map[*link]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// pointAt rewrites a connection string's host and port.
func pointAt(conn, host string, port int) string {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		if u, err := url.Parse(conn); err == nil {
			u.Host = net.JoinHostPort(host, strconv.Itoa(port))
			return u.String()
		}
	}
	return fmt.Sprintf("%s host=%s port=%d", conn, host, port)
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.drop {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		l := &link{client: c, frozen: p.blackhole}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l)
	}
}

func (p *proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	p.mu.Lock()
	frozen := l.frozen
	p.mu.Unlock()
	if frozen {
		// Accepted during a blackhole: the connection hangs until healed.
		_, _ = io.Copy(io.Discard, l.client)
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !l.setServer(s) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pump(l, s, l.client); done <- struct{}{} }()
	go func() { p.pump(l, l.client, s); done <- struct{}{} }()
	<-done
	l.close()
	<-done
}

// pump copies src to dst until either closes, dropping what it reads while
// the link is frozen.
func (p *proxy) pump(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := l.frozen
			p.mu.Unlock()
			if !frozen {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// cutBlackhole makes every byte vanish, on open and new connections.
func (p *proxy) cutBlackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = true
	for l := range p.links {
		l.frozen = true
	}
}

// cutDrop closes every connection and refuses new ones.
func (p *proxy) cutDrop() {
	p.mu.Lock()
	p.drop = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// heal ends a cut: frozen connections are closed (the peers see them
// fail) and new connections pass again.
func (p *proxy) heal() {
	p.mu.Lock()
	p.blackhole, p.drop = false, false
	var frozen []*link
	for l := range p.links {
		if l.frozen {
			frozen = append(frozen, l)
		}
	}
	p.mu.Unlock()
	for _, l := range frozen {
		l.close()
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
}
