package supervision

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

func TestLogObserver(t *testing.T) {
	t.Parallel()
	d := Decision{
		Strategy: "all_for_one", Supervisor: "nonhost/parent", Child: "nonhost/parent/c1",
		Class: Transient, Directive: actor.RestartDirective, Targets: []string{"a", "b"},
		Attempt: 3, Delay: 400 * time.Millisecond, Reason: errors.New("conn reset"), Time: time.Now(),
	}

	var buf bytes.Buffer
	LogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))).Observe(d)
	for _, want := range []string{
		"level=DEBUG", `msg="kumi supervision decision"`, "strategy=all_for_one", "child=nonhost/parent/c1",
		"class=transient", "directive=RestartDirective", "attempt=3", "delay=400ms", "exhausted=false",
		`reason="conn reset"`, "supervisor=nonhost/parent", "targets=2",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log %q lacks %q", buf.String(), want)
		}
	}

	buf.Reset()
	LogObserver(slog.New(slog.NewTextHandler(&buf, nil))).Observe(d) // Info: quiet
	if buf.Len() != 0 {
		t.Errorf("logged at Info: %q", buf.String())
	}
}

func TestObservers(t *testing.T) {
	t.Parallel()
	var got []string
	obs := Observers(nil, ObserverFunc(func(d Decision) { got = append(got, "a:"+d.Child) }), nil,
		ObserverFunc(func(d Decision) { got = append(got, "b:"+d.Child) }))
	obs.Observe(Decision{Child: "x"})
	if strings.Join(got, ",") != "a:x,b:x" {
		t.Errorf("observed %v", got)
	}
}
