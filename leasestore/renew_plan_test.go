package leasestore

import (
	"context"
	"encoding/json"
	"testing"

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
	b := setup(t)
	s := b.open(t, b.config(KindRow, n, "alone"))
	require.Len(t, pass(t, s).Owned, n)

	plan := explainAnalyze(t, b, "", s.st.get("renew"), b.sub, s.Worker(), s.cfg.TTL, 2*s.cfg.TTL)
	require.Equal(t, n, plan.ActualRows, "the renew renewed every bucket held")
	visited := plan.visited()
	require.LessOrEqual(t, visited, linearBound(n),
		"the renew of %d buckets produced or discarded %d rows across its plan's nodes (quadratic: ~%d)",
		n, visited, n*n)
}

// TestStatementsThatChangeManyRowsAreLinear: the renew's siblings — every
// statement that locks many lease rows in bucket order, then changes them
// (releases, withdrawals, the placement of claims, a resize's completion,
// cancel and prune) — had the same join back to the locked rows, and the
// same quadratic plan on a table never analyzed: 657,152 rows visited to
// release 512 buckets at Leave, 1,314,817 to place 512 claims (which a
// pass does within its heartbeat, as it may complete a resize). Each is
// run on 512 rows in a transaction rolled back, after its set-up.
func TestStatementsThatChangeManyRowsAreLinear(t *testing.T) {
	t.Parallel()
	const n = 512
	b := setup(t)
	s := b.open(t, b.config(KindRow, n, "alone"))
	require.Len(t, pass(t, s).Owned, n)
	claimAll := "UPDATE " + b.table("lease_buckets") + " SET claim_worker = 'alone', claimed_at = now()"
	for _, tc := range []struct {
		name, before string
		args         []any
	}{
		{"release", "", []any{b.sub, "alone", seq(0, n)}},
		{"release_all", "", []any{b.sub, "alone"}},
		{"withdraw_all", claimAll, []any{b.sub, "alone"}},
		{"place_claims", "", []any{b.sub, "joiner", []string{"alone"}, []int32{n}, 0}},
		{"resize_complete", "", []any{b.sub, 0, n}},
		{"prune_retired", "", []any{b.sub, 1}},
		{"resize_cancel_rows", "", []any{b.sub, 0}},
	} {
		plan := explainAnalyze(t, b, tc.before, s.st.get(tc.name), tc.args...)
		require.Equal(t, n, plan.changed(), "%s changed every row", tc.name)
		visited := plan.visited()
		require.LessOrEqual(t, visited, linearBound(n), "%s of %d rows produced or discarded %d rows across its plan's nodes "+
			"(quadratic: ~%d)", tc.name, n, visited, n*n)
	}
}

// explainAnalyze runs before (if any), then statement under EXPLAIN
// ANALYZE, in a transaction it rolls back, and returns the plan's root.
func explainAnalyze(t *testing.T, b *testBundle, before, statement string, args ...any) planNode {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if before != "" {
		_, err := tx.Exec(ctx, before)
		require.NoError(t, err)
	}
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "+statement, args...).Scan(&raw))
	var plan []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &plan))
	require.Len(t, plan, 1)
	return plan[0].Plan
}

// linearBound is the most rows a plan that changes n rows may visit: a
// bounded number per row, the dead versions that the earlier statements'
// rolled-back changes left behind included (how many the scans meet
// varies with when they are pruned: from 4n to 21n seen). The quadratic
// plans visited from 657,152 to 1,314,817 rows at n = 512, 20 to 40 times
// this.
func linearBound(n int) int { return 64 * n }

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON)'s plan.
type planNode struct {
	NodeType         string     `json:"Node Type"`
	Relationship     string     `json:"Parent Relationship"`
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

// changed is how many rows the root, a data-modifying node, had to change:
// those its outer child produced (its own Actual Rows count only what it
// returns).
func (p planNode) changed() int {
	for _, c := range p.Plans {
		if c.Relationship == "Outer" {
			return c.ActualRows
		}
	}
	return -1
}
