package leasestore

import (
	"context"
	_ "embed"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements of the last kumi version before resizes (protocol 1),
// as they were: a worker of that version, still running when a newer one
// migrates, runs exactly these.
//
//go:embed testdata/queries_protocol1.sql
var protocolOneQueries string

// protocolOne is a worker of that version, reduced to what its pass
// writes: the heartbeat, then renewals and claims, one transaction.
type protocolOne struct {
	pool        *pgxpool.Pool
	st          statements
	sub, worker string
	buckets     int
	ttl         time.Duration
}

// newProtocolOne returns a protocol-1 worker on schema; words rewrites
// its statements (nil: as they were), for a version older still.
func newProtocolOne(pool *pgxpool.Pool, schema, sub, worker string, buckets int, ttl time.Duration,
	words *strings.Replacer) *protocolOne {
	q := pgx.Identifier{schema}.Sanitize()
	st := statements{}
	for name, text := range parseQueries(protocolOneQueries) {
		if words != nil {
			text = words.Replace(text)
		}
		st[name] = strings.ReplaceAll(text, "{{schema}}", q)
	}
	return &protocolOne{pool: pool, st: st, sub: sub, worker: worker, buckets: buckets, ttl: ttl}
}

// heartbeat is the first statement of its every pass (and its join).
func (p *protocolOne) heartbeat(ctx context.Context) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return p.heartbeatTx(ctx, tx) })
}

func (p *protocolOne) heartbeatTx(ctx context.Context, tx pgx.Tx) error {
	var joined bool
	return tx.QueryRow(ctx, p.st.get("member_heartbeat"), p.sub, p.worker, "row", p.ttl, nil, nil).Scan(&joined)
}

// pass heartbeats, renews and claims every bucket it can; it returns the
// slots it holds afterwards.
func (p *protocolOne) pass(ctx context.Context) ([]int, error) {
	var held []int
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		held = nil
		if err := p.heartbeatTx(ctx, tx); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, p.st.get("renew"), p.sub, p.worker, p.ttl, 2*p.ttl)
		renewed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int, error) {
			var bucket int
			var epoch int64
			var expires, now time.Time
			var pending, recovered bool
			err := r.Scan(&bucket, &epoch, &expires, &pending, &recovered, &now)
			return bucket, err
		})
		if err != nil {
			return err
		}
		rows, _ = tx.Query(ctx, p.st.get("claim"), p.sub, p.worker, p.buckets, []string{}, 0, 2*p.ttl, p.buckets, p.ttl)
		claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int, error) {
			var bucket int
			var epoch int64
			var expires, now time.Time
			var prev string
			var wasMine, expired bool
			err := r.Scan(&bucket, &epoch, &expires, &prev, &wasMine, &expired, &now)
			return bucket, err
		})
		held = append(renewed, claimed...)
		return err
	})
	return held, err
}

// guard is its fence: the owner and epoch of slot, locked FOR SHARE.
func (p *protocolOne) guard(ctx context.Context, slot int) (owner string, epoch int64, err error) {
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, p.st.get("guard"), p.sub, slot).Scan(&owner, &epoch)
	})
	return owner, epoch, err
}

// Its statements are those of one version, checked in: a later change to
// queries.sql does not change them.
func TestProtocolOneStatementsAreTheOldOnes(t *testing.T) {
	t.Parallel()
	st := parseQueries(protocolOneQueries)
	for _, name := range []string{"member_heartbeat", "renew", "claim", "guard"} {
		if st[name] == "" {
			t.Fatalf("testdata/queries_protocol1.sql has no statement %s", name)
		}
	}
	if strings.Contains(st["member_heartbeat"], "protocol") {
		t.Fatal("the protocol-1 heartbeat names the protocol column")
	}
}
