package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// deliveryWatch polls a worker's /metrics (directly, never through its
// proxy) and records its kumi.events.delivered total — every delivery the
// worker starts, retries included — with the times each request began and
// its answer was read.
type deliveryWatch struct {
	mu      sync.Mutex
	samples []deliverySample
	failed  int   // scrapes that got no answer in time
	lastErr error // the last of them
	cancel  context.CancelFunc
	done    chan struct{}
}

type deliverySample struct {
	at    time.Time // before the request was sent
	got   time.Time // after its answer was read
	total float64
}

// scrapeTimeout bounds one scrape. It is generous: a worker just thawed,
// on a machine kept busy beside the tests, can take longer than a second
// to answer, and a scrape's sample is placed by both its times, so a slow
// answer widens no window startedWithin reports.
const scrapeTimeout = 3 * time.Second

func watchDeliveries(p *proc) *deliveryWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &deliveryWatch{cancel: cancel, done: make(chan struct{})}
	client := &http.Client{Timeout: scrapeTimeout}
	go func() {
		defer close(w.done)
		defer client.CloseIdleConnections()
		for ctx.Err() == nil {
			at := time.Now()
			v, err := scrapeSum(ctx, client, "http://"+p.metricsAddr+"/metrics", "kumi_events_delivered")
			w.mu.Lock()
			if err == nil {
				w.samples = append(w.samples, deliverySample{at: at, got: time.Now(), total: v})
			} else if ctx.Err() == nil {
				w.failed, w.lastErr = w.failed+1, err
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

// scrapeSum sums the samples of every metric whose name starts with prefix.
func scrapeSum(ctx context.Context, c *http.Client, url, prefix string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
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
	return total, sc.Err()
}

func (w *deliveryWatch) stop() {
	w.cancel()
	<-w.done
}

// startedWithin returns how many deliveries the worker certainly started
// within (from, to): increases between two samples the earlier of which
// began after from and the later of which was read before to.
func (w *deliveryWatch) startedWithin(from, to time.Time) (n float64, first time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 1; i < len(w.samples); i++ {
		a, b := w.samples[i-1], w.samples[i]
		if a.at.After(from) && b.got.Before(to) && b.total > a.total {
			if n == 0 {
				first = b.got
			}
			n += b.total - a.total
		}
	}
	return n, first
}

// readSince reports whether a scrape begun after t was answered, and when
// none was, why: a check of startedWithin means something only if the
// watch saw the worker after it woke.
func (w *deliveryWatch) readSince(t time.Time) (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.samples {
		if s.at.After(t) && s.total > 0 {
			return true, ""
		}
	}
	return false, fmt.Sprintf("%d samples in all, %d scrapes unanswered (last: %v)", len(w.samples), w.failed, w.lastErr)
}
