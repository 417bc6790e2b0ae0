package integration

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// deliveryWatch polls a worker's /metrics (directly, never through its
// proxy) and records its kumi.events.delivered total — every delivery the
// worker starts, retries included — with the time each request began.
type deliveryWatch struct {
	mu      sync.Mutex
	samples []deliverySample
	cancel  context.CancelFunc
	done    chan struct{}
}

type deliverySample struct {
	at    time.Time // before the request was sent
	total float64
}

func watchDeliveries(p *proc) *deliveryWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &deliveryWatch{cancel: cancel, done: make(chan struct{})}
	client := &http.Client{Timeout: 200 * time.Millisecond}
	go func() {
		defer close(w.done)
		defer client.CloseIdleConnections()
		for ctx.Err() == nil {
			at := time.Now()
			if v, ok := scrapeSum(ctx, client, "http://"+p.metricsAddr+"/metrics", "kumi_events_delivered"); ok {
				w.mu.Lock()
				w.samples = append(w.samples, deliverySample{at: at, total: v})
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

// scrapeSum sums the samples of every metric whose name starts with prefix.
func scrapeSum(ctx context.Context, c *http.Client, url, prefix string) (float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total, sc.Err() == nil
}

func (w *deliveryWatch) stop() {
	w.cancel()
	<-w.done
}

// startedWithin returns how many deliveries the worker certainly started
// within (from, to): increases between two samples the earlier of which
// began after from and the later of which began before to.
func (w *deliveryWatch) startedWithin(from, to time.Time) (n float64, first time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 1; i < len(w.samples); i++ {
		a, b := w.samples[i-1], w.samples[i]
		if a.at.After(from) && b.at.Before(to) && b.total > a.total {
			if n == 0 {
				first = b.at
			}
			n += b.total - a.total
		}
	}
	return n, first
}

// latest returns the last total read.
func (w *deliveryWatch) latest() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return 0
	}
	return w.samples[len(w.samples)-1].total
}
