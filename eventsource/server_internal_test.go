package eventsource

import (
	"log/slog"
	"testing"
)

// A look that began before a change recorded since compares no head:
// the positions it had seen were the old server's. Counted, it would make
// one failover two changes (a sequencer step racing Store.CheckServer).
func TestALookBegunBeforeAChangeFindsNoOtherChange(t *testing.T) {
	s := &Store{cfg: Config{Logger: slog.New(slog.DiscardHandler)}}
	id := ServerIdentity{System: 7, Timeline: 1}
	s.observeServer(id, 10, 0, 0)
	s.SawPosition(50)
	seen, seenEpoch := s.seenHead() // a step begins
	if !s.observeServer(id, 10, seen, seenEpoch) {
		t.Fatal("a head below a seen position is a change")
	}
	if s.observeServer(id, 10, seen, seenEpoch) {
		t.Fatal("the step that began before the change found it again")
	}
	if e := s.Server().Epoch; e != 1 {
		t.Fatalf("epoch %d, want 1", e)
	}
	seen, seenEpoch = s.seenHead()
	if s.observeServer(id, 11, seen, seenEpoch) {
		t.Fatal("a look begun after the change compares with the new head only")
	}
}
