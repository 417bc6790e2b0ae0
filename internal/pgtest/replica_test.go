package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestReplicaFollowsThePrimaryAndPausesOnDemand: a row committed on the
// primary becomes readable on the standby; while replay is paused a new
// row is not, whatever the wait, until replay resumes; a restarted
// standby catches up; Lag reports the paused distance.
func TestReplicaFollowsThePrimaryAndPausesOnDemand(t *testing.T) {
	ctx := context.Background()
	schema := NewSchema(t)
	table := pgx.Identifier{schema, "events"}.Sanitize()
	srv := LocalServer(t)
	primary := PoolOn(t, srv.URL, 2)
	_, err := primary.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+"; CREATE TABLE "+table+" (n int PRIMARY KEY)")
	require.NoError(t, err)

	r := NewReplica(t, srv)
	standby, err := pgx.Connect(ctx, r.URL)
	require.NoError(t, err)
	defer standby.Close(ctx)
	var inRecovery bool
	require.NoError(t, standby.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	require.True(t, inRecovery, "the replica is a standby")

	insert := func(n int) {
		t.Helper()
		_, err := primary.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", n)
		require.NoError(t, err)
	}
	rowsOn := func(conn *pgx.Conn) []int {
		t.Helper()
		rows, err := conn.Query(ctx, "SELECT n FROM "+table+" ORDER BY n")
		require.NoError(t, err)
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		return ns
	}

	insert(1)
	require.NoError(t, r.WaitReplayed(ctx))
	require.Equal(t, []int{1}, rowsOn(standby))

	require.NoError(t, r.PauseReplay(ctx))
	insert(2)
	require.ErrorIs(t, r.WaitReplayed(ctx), ErrReplayPaused)
	lag, err := r.Lag(ctx)
	require.NoError(t, err)
	require.True(t, lag.Paused)
	require.Positive(t, lag.Bytes, "the standby has received or is owed WAL it has not replayed")
	require.Equal(t, []int{1}, rowsOn(standby), "a paused standby shows nothing committed after the pause")

	require.NoError(t, r.ResumeReplay(ctx))
	require.NoError(t, r.WaitReplayed(ctx))
	require.Equal(t, []int{1, 2}, rowsOn(standby))
	lag, err = r.Lag(ctx)
	require.NoError(t, err)
	require.False(t, lag.Paused)
	require.False(t, lag.Replayed.IsZero(), "the last replayed commit has a time")
	require.WithinDuration(t, time.Now(), lag.Replayed, time.Hour, "and it is today's")

	require.NoError(t, r.Restart(ctx))
	insert(3)
	require.NoError(t, r.WaitReplayed(ctx))
	again, err := pgx.Connect(ctx, r.URL)
	require.NoError(t, err)
	defer again.Close(ctx)
	require.Equal(t, []int{1, 2, 3}, rowsOn(again), "a restarted standby catches up from its slot")
}
