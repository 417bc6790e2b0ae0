package leasestore

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestRenewIsLinearInTheBucketsHeld: a pass renews every bucket its worker
// holds, on tables that are often never analyzed (a new subscription, every
// test's schema). The renew joined its locked rows back to the table, and
// with no statistics the planner took them for one row and rescanned every
// row of the subscription for each bucket held: for a worker holding n
// buckets, n² rows visited, 2 ms at 64 and 20 ms at 192 (a pass on a loaded
// machine could then outlast its heartbeat). It must visit each row a
// bounded number of times.
func TestRenewIsLinearInTheBucketsHeld(t *testing.T) {
	t.Parallel()
	const n = 512
	ctx := context.Background()
	b := setup(t)
	s := b.open(t, b.config(KindRow, n, "alone"))
	require.Len(t, pass(t, s).Owned, n)

	var plan []struct {
		Plan planNode `json:"Plan"`
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "+s.st.get("renew"),
			b.sub, s.Worker(), s.cfg.TTL, 2*s.cfg.TTL).Scan(&raw); err != nil {
			return err
		}
		return json.Unmarshal(raw, &plan)
	})
	require.NoError(t, err)
	require.Len(t, plan, 1)
	require.Equal(t, n, plan[0].Plan.ActualRows, "the renew renewed every bucket held")
	visited := plan[0].Plan.visited()
	require.LessOrEqual(t, visited, 20*n,
		"the renew of %d buckets produced or discarded %d rows across its plan's nodes (quadratic: ~%d)",
		n, visited, n*n)
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON)'s plan.
type planNode struct {
	NodeType         string     `json:"Node Type"`
	ActualRows       int        `json:"Actual Rows"`
	ActualLoops      int        `json:"Actual Loops"`
	RemovedByFilter  int        `json:"Rows Removed by Filter"`
	RemovedByJoin    int        `json:"Rows Removed by Join Filter"`
	RemovedByRecheck int        `json:"Rows Removed by Index Recheck"`
	Plans            []planNode `json:"Plans"`
}

// visited is the rows every node of the plan produced or discarded, over
// all its loops.
func (p planNode) visited() int {
	total := (p.ActualRows + p.RemovedByFilter + p.RemovedByJoin + p.RemovedByRecheck) * max(p.ActualLoops, 1)
	for _, c := range p.Plans {
		total += c.visited()
	}
	return total
}
