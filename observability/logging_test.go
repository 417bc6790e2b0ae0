package observability_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/observability"
)

func TestDemoteHandler(t *testing.T) {
	var buf syncBuffer
	base := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})
	l := slog.New(observability.DemoteHandler(base, slog.LevelInfo, slog.LevelDebug))
	ctx := context.Background()
	assert.False(t, l.Enabled(ctx, slog.LevelInfo), "Info is demoted below the handler's level")
	assert.True(t, l.Enabled(ctx, slog.LevelWarn))
	l.Info("chatter")
	l.Debug("more chatter")
	l.Warn("trouble", "k", "v")
	l.With("a", 1).WithGroup("g").Error("failure", "k", "v")
	out := buf.String()
	assert.NotContains(t, out, "chatter")
	assert.Contains(t, out, `level=WARN msg=trouble k=v`)
	assert.Contains(t, out, `level=ERROR msg=failure a=1 g.k=v`)

	buf = syncBuffer{}
	debug := slog.New(observability.DemoteHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), slog.LevelInfo, slog.LevelDebug))
	debug.Info("chatter")
	assert.Contains(t, buf.String(), `level=DEBUG msg=chatter`)
}

// TestProtoactorLoggerFactory: protoactor-go's Info chatter (system start,
// dead letters) is hidden at Info and shown at Debug, tagged.
func TestProtoactorLoggerFactory(t *testing.T) {
	run := func(level slog.Level) string {
		var buf syncBuffer
		logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		system := actor.NewActorSystem(
			actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(logger)),
			// The dead-letter throttle's timer goroutine lives one interval.
			actor.WithDeadLetterThrottleInterval(10*time.Millisecond))
		// A message to a stopped actor is a dead letter, which
		// protoactor-go logs at Info.
		pid := system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		require.NoError(t, system.Root.StopFuture(pid).Wait())
		system.Root.Send(pid, "hello")
		deadline := time.Now().Add(2 * time.Second)
		for level == slog.LevelDebug && !strings.Contains(buf.String(), "DeadLetter") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		system.Shutdown()
		return buf.String()
	}
	quiet := run(slog.LevelInfo)
	assert.Empty(t, quiet, "nothing at Info")

	loud := run(slog.LevelDebug)
	assert.Contains(t, loud, `level=DEBUG msg="actor system started" lib=protoactor actor_system=`)
	assert.Contains(t, loud, `level=DEBUG msg=[DeadLetter]`)

	// A nil base uses slog.Default().
	assert.NotNil(t, observability.ProtoactorLoggerFactory(nil)(nil))
}
